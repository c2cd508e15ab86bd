"""The server's BSON encoder: ``bson.encode``'s bytes, with text that is not UTF-8 (decoded with
``surrogateescape``) written back as the bytes the client sent, at any depth, as value or name."""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

import bson
import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, ObjectId, Regex
from bson.codec_options import CodecOptions
from bson.errors import InvalidDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from flowwarden_embedded.rawstrings import encode, encode_embedded, text_bytes

SURROGATE_ESCAPE: CodecOptions[dict[str, Any]] = CodecOptions(unicode_decode_error_handler="surrogateescape")
_INT32 = struct.Struct("<i")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


not_utf8 = st.binary(min_size=1, max_size=8).filter(lambda data: not _is_utf8(data))
raw_text = st.binary(max_size=8).map(lambda data: data.decode("utf-8", "surrogateescape"))
names = st.sampled_from(["a", "b", "_id", "é", "x.y"])
leaves = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=4),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.builds(ObjectId),
    st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(Binary, st.binary(max_size=4), st.just(5)),
    st.builds(Decimal128, st.sampled_from(["1.5", "-0", "1E+10"])),
    # BSON dates hold milliseconds: these come back from decoding as they went in.
    st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2100, 1, 1)).map(
        lambda when: when.replace(microsecond=when.microsecond // 1000 * 1000)
    ),
)
valid_values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(names, inner, max_size=3)),
    max_leaves=10,
)
valid_documents = st.dictionaries(names, valid_values, max_size=4)
# Values and documents with text that is not UTF-8 anywhere: in values and in field names.
raw_names = st.one_of(names, raw_text.filter(lambda name: "\x00" not in name))
raw_values = st.recursive(
    st.one_of(leaves, raw_text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(raw_names, inner, max_size=3)),
    max_leaves=10,
)
raw_documents = st.dictionaries(raw_names, raw_values)


def _framed(body: bytes) -> bytes:
    return _INT32.pack(len(body) + 5) + body + b"\x00"


def _string_element(name: bytes, data: bytes) -> bytes:
    return b"\x02" + name + b"\x00" + _INT32.pack(len(data) + 1) + data + b"\x00"


@settings(max_examples=200, deadline=None)
@given(valid_documents, not_utf8)
def test_a_string_that_is_not_utf8_is_written_as_its_bytes_beside_what_bson_encodes(
    valid: dict[str, Any], data: bytes
) -> None:
    text = data.decode("utf-8", "surrogateescape")
    assert encode({**valid, "zz": text}) == _framed(bson.encode(valid)[4:-1] + _string_element(b"zz", data))
    nested = bson.encode({"d": valid})[7:-1]  # the valid part as an embedded document
    assert encode({"n": {**valid, "zz": text}}) == _framed(
        b"\x03n\x00" + _framed(nested[4:-1] + _string_element(b"zz", data))
    )
    as_array = bson.encode({"n": [valid, 1]})[4:-1]
    array_body = as_array[7:-1]  # type byte, "n", NUL, the array's length
    assert encode({"n": [valid, 1, text]}) == _framed(
        b"\x04n\x00" + _framed(array_body + _string_element(b"2", data))
    )


@settings(max_examples=200, deadline=None)
@given(raw_documents)
def test_what_the_server_decodes_it_encodes_back_to_the_same_bytes(doc: dict[str, Any]) -> None:
    data = encode(doc)
    decoded = bson.decode(data, codec_options=SURROGATE_ESCAPE)
    assert decoded == doc
    assert encode(decoded) == data


def test_a_top_level_id_goes_first_and_an_embedded_one_stays_where_it_is() -> None:
    text = b"\xff".decode("utf-8", "surrogateescape")
    top = bson.decode(encode({"a": text, "_id": 1}), codec_options=SURROGATE_ESCAPE)
    assert list(top) == ["_id", "a"]
    embedded = encode_embedded({"a": text, "_id": 1})
    assert embedded == _framed(_string_element(b"a", b"\xff") + b"\x10_id\x00" + _INT32.pack(1))
    assert encode_embedded({"a": 1, "_id": 2}) == bson.encode({"d": {"a": 1, "_id": 2}})[7:-1]


def test_field_names_that_are_not_utf8_are_written_as_their_bytes() -> None:
    name = b"k\xfe".decode("utf-8", "surrogateescape")
    assert encode({name: 1}) == _framed(b"\x10k\xfe\x00" + _INT32.pack(1))
    assert encode({"n": {name: "v"}}) == _framed(b"\x03n\x00" + _framed(_string_element(b"k\xfe", b"v")))


def test_code_regex_and_dbref_keep_their_bytes() -> None:
    text = b"x\x80".decode("utf-8", "surrogateescape")
    assert encode({"c": Code(text)}) == _framed(b"\x0dc\x00" + _INT32.pack(3) + b"x\x80\x00")
    scope = _framed(_string_element(b"s", b"x\x80"))
    code = _INT32.pack(3) + b"x\x80\x00"
    assert encode({"c": Code("f", {"s": text})}) == _framed(
        b"\x0fc\x00" + _INT32.pack(4 + 6 + len(scope)) + _INT32.pack(2) + b"f\x00" + scope
    )
    assert encode({"c": Code(text, {"n": 1})}) == _framed(
        b"\x0fc\x00" + _INT32.pack(4 + len(code) + 12) + code + bson.encode({"n": 1})
    )
    assert encode({"r": Regex(text, "im")}) == _framed(b"\x0br\x00x\x80\x00im\x00")
    dbref = bson.decode(encode({"r": DBRef(text, 1)}), codec_options=SURROGATE_ESCAPE)["r"]
    assert dbref == DBRef(text, 1)


def test_names_with_a_nul_byte_are_refused_as_bson_refuses_them() -> None:
    text = b"\xff".decode("utf-8", "surrogateescape")
    with pytest.raises(InvalidDocument):
        encode({"a\x00b": text})
    with pytest.raises(InvalidDocument):
        encode({"a": Regex("x\x00" + text)})


def test_text_bytes_are_the_bytes_the_text_was_decoded_from() -> None:
    for data in (b"", b"plain", "é€😀".encode(), b"a\xffb\xc3", b"\xed\xa0\x80", b"\x00\xfe"):
        assert text_bytes(data.decode("utf-8", "surrogateescape")) == data
