"""Unit tests of the embedded server's building blocks: framing, checksums, index keys."""

from __future__ import annotations

import datetime
import os
import struct
import zlib

import bson
import pytest
from bson import Decimal128, Int64, ObjectId

from flowwarden_embedded import wire
from flowwarden_embedded.keys import format_document, value_key
from flowwarden_embedded.limits import MAX_REQUEST_OBJECT_SIZE
from flowwarden_embedded.operations import LATENCY_BUCKETS, latency_bucket
from flowwarden_embedded.storage import IndexSpec, path_values


def test_crc32c_check_value() -> None:
    # The CRC-32C check value of the ASCII digits 1..9 (RFC 3720, appendix B.4).
    assert wire.crc32c(b"123456789") == 0xE3069283


def _bitwise_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def test_crc32c_agrees_with_the_bitwise_definition() -> None:
    for size in (0, 1, 7, 8, 9, 63, 64, 65, 4099):
        data = os.urandom(size)
        assert wire.crc32c(data) == _bitwise_crc32c(data)


def _op_msg(body: bytes, flags: int = 0) -> bytes:
    return struct.pack("<iiii", 16 + 4 + len(body), 9, 0, wire.OP_MSG) + struct.pack("<I", flags) + body


def test_op_msg_sections_merge_into_the_command() -> None:
    docs = [{"_id": 1}, {"_id": 2}]
    seq = b"documents\x00" + b"".join(bson.encode(d) for d in docs)
    body = (
        b"\x00" + bson.encode({"insert": "c", "$db": "d"}) + b"\x01" + struct.pack("<i", 4 + len(seq)) + seq
    )
    request = wire.parse_message(9, wire.OP_MSG, _op_msg(body))
    assert request.command == {"insert": "c", "$db": "d", "documents": docs}
    assert request.db == "d" and not request.more_to_come and not request.checksum


def test_op_msg_checksum_is_verified_and_emitted() -> None:
    message = _op_msg(
        b"\x00" + bson.encode({"ping": 1, "$db": "admin"}) + b"\x00\x00\x00\x00", wire.CHECKSUM_PRESENT
    )
    good = message[:-4] + struct.pack("<I", wire.crc32c(message[:-4]))
    assert wire.parse_message(9, wire.OP_MSG, good).checksum
    with pytest.raises(wire.MalformedMessage):
        wire.parse_message(9, wire.OP_MSG, good[:-1] + bytes([good[-1] ^ 0xFF]))
    reply = wire.build_op_msg(1, 9, bson.encode({"ok": 1}), checksum=True)
    assert struct.unpack("<I", reply[-4:])[0] == wire.crc32c(reply[:-4])
    assert struct.unpack_from("<I", reply, 16)[0] & wire.CHECKSUM_PRESENT


def test_field_in_body_and_sequence_is_malformed() -> None:
    seq = b"documents\x00" + bson.encode({"_id": 1})
    body = b"\x00" + bson.encode({"insert": "c", "documents": [], "$db": "d"})
    body += b"\x01" + struct.pack("<i", 4 + len(seq)) + seq
    with pytest.raises(wire.MalformedMessage):
        wire.parse_message(9, wire.OP_MSG, _op_msg(body))


def _compressed(payload: bytes, declared: int, compressor: int = 2) -> bytes:
    body = struct.pack("<iiB", wire.OP_MSG, declared, compressor) + payload
    return struct.pack("<iiii", 16 + len(body), 5, 0, wire.OP_COMPRESSED) + body


_PING = struct.pack("<I", 0) + b"\x00" + bson.encode({"ping": 1, "$db": "admin"})


def test_op_compressed_zlib_is_unwrapped() -> None:
    message = _compressed(zlib.compress(_PING), len(_PING))
    request = wire.parse_message(5, wire.OP_COMPRESSED, message, ("zlib",))
    assert request.command["ping"] == 1 and request.op_code == wire.OP_MSG


def test_op_compressed_needs_a_negotiated_compressor() -> None:
    message = _compressed(zlib.compress(_PING), len(_PING))
    with pytest.raises(wire.MalformedMessage, match="not negotiated"):
        wire.parse_message(5, wire.OP_COMPRESSED, message)
    # noop, snappy and zstd are not compressors this server offers, negotiated or not.
    for compressor in (0, 1, 3):
        with pytest.raises(wire.MalformedMessage, match="not available"):
            wire.parse_message(5, wire.OP_COMPRESSED, _compressed(_PING, len(_PING), compressor), ("zlib",))


@pytest.mark.parametrize(
    ("payload", "declared"),
    [
        (zlib.compress(_PING), len(_PING) - 1),
        (zlib.compress(_PING), len(_PING) + 1),
        (zlib.compress(_PING) + b"junk", len(_PING)),
        (zlib.compress(_PING)[:-3], len(_PING)),
        (zlib.compress(_PING), -1),
        (zlib.compress(_PING), wire.MAX_MESSAGE_SIZE - wire.HEADER_SIZE + 1),
    ],
    ids=["more", "less", "trailing bytes", "truncated", "negative", "over the message limit"],
)
def test_op_compressed_payload_must_inflate_to_its_declared_size(payload: bytes, declared: int) -> None:
    with pytest.raises(wire.MalformedMessage):
        wire.parse_message(5, wire.OP_COMPRESSED, _compressed(payload, declared), ("zlib",))


def test_op_compressed_inflates_no_more_than_it_declared() -> None:
    # 64 MiB of zeros in about 64 KB; the server must stop a byte past the 100 it was promised.
    bomb = zlib.compress(bytes(64 << 20), 9)
    refused = []
    original = zlib.decompressobj

    class Recording:
        def __init__(self) -> None:
            self._inner = original()

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self._inner.decompress(data, max_length)
            refused.append(len(out))
            return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zlib, "decompressobj", Recording)
        with pytest.raises(wire.MalformedMessage):
            wire.parse_message(5, wire.OP_COMPRESSED, _compressed(bomb, 100), ("zlib",))
    assert refused and max(refused) <= 101


def _body_of_size(size: int) -> dict:
    base = len(bson.encode({"insert": "c", "$db": "d", "pad": ""}))
    return {"insert": "c", "$db": "d", "pad": "x" * (size - base)}


def test_object_over_the_request_limit_is_refused_with_bson_object_too_large() -> None:
    limit = MAX_REQUEST_OBJECT_SIZE
    at_limit = bson.encode(_body_of_size(limit))
    assert wire.parse_message(9, wire.OP_MSG, _op_msg(b"\x00" + at_limit)).command["insert"] == "c"
    over = bson.encode(_body_of_size(limit + 1))
    unsigned = _op_msg(b"\x00" + over + b"\x00" * 4, wire.CHECKSUM_PRESENT)[:-4]
    with pytest.raises(wire.ObjectTooLarge) as info:
        wire.parse_message(9, wire.OP_MSG, unsigned + struct.pack("<I", wire.crc32c(unsigned)))
    assert info.value.errmsg == (
        "BSONObj size: 16793601 (0x1004001) is invalid. Size must be between 0 and 16793600(16MB) "
        'First element: insert: "c"'
    )
    assert info.value.checksum is True and info.value.op_code == wire.OP_MSG
    # A document of a document sequence is held to the same limit.
    doc = {"_id": 1, "pad": "y" * (limit + 1 - len(bson.encode({"_id": 1, "pad": ""})))}
    seq = b"documents\x00" + bson.encode(doc)
    body = b"\x00" + bson.encode({"insert": "c", "$db": "d"})
    body += b"\x01" + struct.pack("<i", 4 + len(seq)) + seq
    with pytest.raises(wire.ObjectTooLarge) as info:
        wire.parse_message(9, wire.OP_MSG, _op_msg(body))
    assert info.value.errmsg.endswith("First element: _id: 1")
    # A long string is cut after 150 characters, as mongod cuts it.
    doc = {"pad": "z" * (limit + 1 - len(bson.encode({"pad": ""})))}
    with pytest.raises(wire.ObjectTooLarge) as info:
        wire.parse_message(9, wire.OP_MSG, _op_msg(b"\x00" + bson.encode(doc)))
    assert info.value.errmsg.endswith('First element: pad: "' + "z" * 150 + '..."')


def test_parse_header_rejects_impossible_lengths() -> None:
    with pytest.raises(wire.MalformedMessage):
        wire.parse_header(struct.pack("<iiii", 4, 0, 0, wire.OP_MSG))
    with pytest.raises(wire.MalformedMessage):
        wire.parse_header(struct.pack("<iiii", wire.MAX_MESSAGE_SIZE + 1, 0, 0, wire.OP_MSG))


def test_value_keys_follow_mongodb_equality() -> None:
    assert value_key(1) == value_key(1.0) == value_key(Int64(1)) == value_key(Decimal128("1"))
    assert value_key(True) != value_key(1)
    assert value_key({"a": 1, "b": 2}) != value_key({"b": 2, "a": 1})
    assert value_key([1, {"x": 1}]) == value_key([1.0, {"x": 1}])
    assert value_key(b"\x01") == value_key(bson.Binary(b"\x01", 0))
    assert value_key(b"\x01") != value_key(bson.Binary(b"\x01", 5))


def test_dup_key_formatting() -> None:
    oid = ObjectId("65f0c0ffee0000000000abcd")
    when = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    assert format_document({"a": "x", "b": 1, "c": 1.5, "d": 2.0}) == '{ a: "x", b: 1, c: 1.5, d: 2.0 }'
    assert format_document({"_id": oid}) == "{ _id: ObjectId('65f0c0ffee0000000000abcd') }"
    assert (
        format_document({"t": when, "n": None, "f": False})
        == "{ t: new Date(1704067200000), n: null, f: false }"
    )
    assert format_document({"x": float("inf")}) == "{ x: inf }"


def test_index_keys_expand_arrays_and_honour_sparse_and_partial() -> None:
    assert path_values({"a": [{"b": 1}, {"b": [2, 3]}]}, "a.b") == [1, 2, 3]
    assert path_values({"a": {"b": 1}}, "a.c") == []
    index = IndexSpec.from_spec({"key": {"a": 1, "b": 1}, "name": "ab", "unique": True})
    assert len(index.keys_of({"a": [1, 2], "b": "x"})) == 2
    sparse = IndexSpec.from_spec({"key": {"a": 1}, "name": "a", "unique": True, "sparse": True})
    assert sparse.keys_of({"other": 1}) == []
    partial = IndexSpec.from_spec(
        {"key": {"a": 1}, "name": "a", "unique": True, "partialFilterExpression": {"live": True}}
    )
    assert partial.keys_of({"a": 1, "live": False}) == []
    assert len(partial.keys_of({"a": 1, "live": True})) == 1


def test_latency_buckets_are_mongods() -> None:
    # Powers of two up to 2^10, halves of each power from 2^11 to 2^21, powers again up to 2^40.
    assert len(LATENCY_BUCKETS) == 51 and LATENCY_BUCKETS[-1] == 2**40
    cases = {0: 0, 1: 0, 2: 2, 3: 2, 1023: 512, 2047: 1024, 2048: 2048, 3071: 2048, 3072: 3072, 4096: 4096}
    cases.update({2**21 - 1: 3 << 19, 2**21: 2**21, 2**50: 2**40})
    for micros, lower in cases.items():
        assert LATENCY_BUCKETS[latency_bucket(micros)] == lower, micros
