"""flowwarden's Extended JSON writer: byte-for-byte what bson.json_util writes, and lossless.

The writer exists only to be faster than json_util; these tests pin that it never writes
anything else, for every BSON type PyMongo decodes and for arbitrary nesting.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from decimal import Decimal
from typing import Any

import bson
import pytest
from bson import json_util
from bson.binary import Binary, UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.son import SON
from bson.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from flowwarden.spark.convert.extjson import (
    JSON_OPTIONS,
    JsonMode,
    decimal128_text,
    decimal128_value,
    dumps,
    encoder_for,
)

MODES = list(JsonMode)


def reference(value: Any, mode: JsonMode) -> str:
    return json_util.dumps(value, json_options=JSON_OPTIONS[mode], separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------------------------------
# Strategies: every value type a decoded change event can hold.

utf8_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
keys = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=8)
naive_datetimes = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
offsets = st.sampled_from(
    [dt.timezone.utc, dt.timezone(dt.timedelta(hours=2)), dt.timezone(dt.timedelta(hours=-5, minutes=-30))]
)
aware_datetimes = st.builds(lambda d, tz: d.replace(tzinfo=tz), naive_datetimes, offsets)


def fits_decimal128(value: Decimal) -> bool:
    _, digits, exponent = value.as_tuple()
    return len(digits) <= 34 and isinstance(exponent, int) and -6176 <= exponent <= 6111


finite_decimals = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(fits_decimal128),
    st.sampled_from(["Infinity", "-Infinity", "-0", "0E+6111", "1E-6176", "1.0E-7", "123E+3"]),
).map(lambda d: Decimal128(str(d)))
nan_decimals = st.sampled_from(["NaN", "-NaN", "sNaN", "-sNaN"]).map(Decimal128)
regex_flags = st.integers(0, 127).map(lambda f: f & (re.I | re.L | re.M | re.S | re.U | re.X))


def scalars(nan: bool) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**31), 2**31 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1).map(Int64),
        st.floats(allow_nan=nan, allow_infinity=True),
        utf8_text,
        naive_datetimes,
        aware_datetimes,
        st.binary(min_size=12, max_size=12).map(ObjectId),
        st.one_of(finite_decimals, nan_decimals) if nan else finite_decimals,
        st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
        st.builds(Binary, st.binary(max_size=20), st.sampled_from([0, 1, 2, 3, 4, 5, 6, 128, 255])),
        st.binary(max_size=20),
        st.builds(Regex, keys, regex_flags),
        st.just(MinKey()),
        st.just(MaxKey()),
        st.uuids(),
        st.builds(Code, utf8_text),
    )


def documents(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.dictionaries(keys, children, max_size=5),
        st.lists(children, max_size=5),
        st.lists(st.tuples(keys, children), max_size=4).map(SON),
    )


bson_values = st.recursive(scalars(nan=True), documents, max_leaves=25)
# Extended JSON has a single NaN: the sign and payload of a NaN double or decimal are not kept.
bson_values_without_nan = st.recursive(scalars(nan=False), documents, max_leaves=25)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=400, deadline=None)
@given(value=bson_values)
def test_text_is_json_util_text(mode: JsonMode, value: Any) -> None:
    assert dumps(value, mode) == reference(value, mode)


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(keys, bson_values_without_nan, max_size=6))
def test_canonical_text_reads_back_as_the_same_bson(doc: dict[str, Any]) -> None:
    """Lossless: json_util.loads of the canonical text encodes to the original BSON bytes
    (every NaN aside: Extended JSON has only one)."""
    options: CodecOptions[dict[str, Any]] = CodecOptions(uuid_representation=UuidRepresentation.STANDARD)
    # Read binaries back as binaries (a uuid.UUID was written as subtype 4 and encodes the same).
    read = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
    loaded = json_util.loads(dumps(doc), json_options=read)
    assert bson.encode(loaded, codec_options=options) == bson.encode(doc, codec_options=options)


def test_relaxed_text_loses_only_the_width_of_small_int64() -> None:
    doc = {"small": Int64(5), "big": Int64(2**40), "int": 5, "double": 5.0}
    stored = bson.decode(bson.encode(json_util.loads(dumps(doc, JsonMode.RELAXED))))
    assert stored == doc
    assert [type(stored[k]) for k in doc] == [int, Int64, int, float]  # small Int64 came back as Int32


@pytest.mark.parametrize(
    ("value", "canonical", "relaxed"),
    [
        (1, '{"$numberInt":"1"}', "1"),
        (2**31, '{"$numberLong":"2147483648"}', "2147483648"),
        (Int64(7), '{"$numberLong":"7"}', "7"),
        (-0.0, '{"$numberDouble":"-0.0"}', "-0.0"),
        (1e300, '{"$numberDouble":"1e+300"}', "1e+300"),
        (math.nan, '{"$numberDouble":"NaN"}', '{"$numberDouble":"NaN"}'),
        (-math.inf, '{"$numberDouble":"-Infinity"}', '{"$numberDouble":"-Infinity"}'),
        (
            dt.datetime(2024, 5, 1, 12, 30, 15, 123456),
            '{"$date":{"$numberLong":"1714566615123"}}',
            '{"$date":"2024-05-01T12:30:15.123Z"}',
        ),
        (
            dt.datetime(1969, 12, 31, 23, 59, 59, 999000),
            '{"$date":{"$numberLong":"-1"}}',
            '{"$date":{"$numberLong":"-1"}}',
        ),
        (
            dt.datetime(2024, 5, 1, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            '{"$date":{"$numberLong":"1714564800000"}}',
            '{"$date":"2024-05-01T14:00:00+0200"}',
        ),
        (Decimal128("1.10"), '{"$numberDecimal":"1.10"}', '{"$numberDecimal":"1.10"}'),
        (Decimal128("-NaN"), '{"$numberDecimal":"NaN"}', '{"$numberDecimal":"NaN"}'),
        (
            ObjectId("65f000000000000000000001"),
            '{"$oid":"65f000000000000000000001"}',
            '{"$oid":"65f000000000000000000001"}',
        ),
        (
            Timestamp(1700000000, 3),
            '{"$timestamp":{"t":1700000000,"i":3}}',
            '{"$timestamp":{"t":1700000000,"i":3}}',
        ),
        (
            Binary(b"\x01\x02", 5),
            '{"$binary":{"base64":"AQI=","subType":"05"}}',
            '{"$binary":{"base64":"AQI=","subType":"05"}}',
        ),
        (
            Regex("^a.c$", re.I | re.M),
            '{"$regularExpression":{"pattern":"^a.c$","options":"im"}}',
            '{"$regularExpression":{"pattern":"^a.c$","options":"im"}}',
        ),
        (MinKey(), '{"$minKey":1}', '{"$minKey":1}'),
        (MaxKey(), '{"$maxKey":1}', '{"$maxKey":1}'),
        ('é\n"', '"é\\n\\""', '"é\\n\\""'),
    ],
)
def test_known_texts(value: Any, canonical: str, relaxed: str) -> None:
    assert dumps(value) == canonical
    assert dumps(value, "relaxed") == relaxed
    assert canonical == reference(value, JsonMode.CANONICAL)
    assert relaxed == reference(value, JsonMode.RELAXED)


@pytest.mark.parametrize(
    "value",
    [
        Code("function() {}", {"x": 1}),
        DBRef("orders", ObjectId("65f000000000000000000001"), "shop", extra=Int64(3)),
        DatetimeMS(2**62),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        {1: "integer key", 2.5: "float key", None: "null key"},
        re.compile(b"bytes pattern", re.S),
        ("tuple", 1),
    ],
)
def test_rare_types_match_json_util(value: Any) -> None:
    for mode in MODES:
        assert dumps({"v": value}, mode) == reference({"v": value}, mode)


def test_uuid_is_a_standard_subtype_4_binary() -> None:
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert dumps(value) == '{"$binary":{"base64":"EjRWeBI0VngSNFZ4EjRWeA==","subType":"04"}}'


def test_encoder_for_is_dumps() -> None:
    doc = {"a": [1, {"b": Decimal128("2.5")}]}
    assert encoder_for("relaxed")(doc) == dumps(doc, JsonMode.RELAXED)
    assert encoder_for()(doc) == dumps(doc)


# ----------------------------------------------------------------------------------------------
# Decimal128 text and values without bson's slow decoding

bids = st.one_of(
    st.binary(min_size=16, max_size=16),
    # canonical finite values: a coefficient < 10**34 and an exponent in range
    st.builds(
        lambda sign, coefficient, exponent: (coefficient | (exponent << 113) | (sign << 127)).to_bytes(
            16, "little"
        ),
        st.integers(0, 1),
        st.one_of(st.integers(0, 10**34 - 1), st.integers(0, 999)),
        st.integers(0, 12287),
    ),
)


@settings(max_examples=2000, deadline=None)
@given(bid=bids)
def test_decimal128_text_is_str(bid: bytes) -> None:
    value = Decimal128.from_bid(bid)
    assert decimal128_text(value) == str(value)


@settings(max_examples=1000, deadline=None)
@given(bid=bids)
def test_decimal128_value_is_to_decimal(bid: bytes) -> None:
    value = Decimal128.from_bid(bid)
    expected = value.to_decimal()
    got = decimal128_value(value)
    if expected.is_nan():
        assert got.is_nan()
    else:
        assert got.as_tuple() == expected.as_tuple()
