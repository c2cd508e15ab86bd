"""The compiled converter (flowwarden.spark.convert._native) against the Python path, table for table.

Hard rule under test: for raw change events, ``events_to_arrow`` gives the same table whichever
path runs. The native table of a batch is compared with the Python path's table of the same
bytes decoded with ``native.DECODE_OPTIONS``; where the C code declines (a reason string), the
Python path converts, and malformed bytes end in ``UndecodableEventError``, never a crash.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import struct
import threading
from typing import Any

import bson
import pyarrow as pa
import pytest
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.errors import InvalidBSON
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.son import SON
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowwarden.errors import FlowWardenError, UndecodableEventError
from flowwarden.events import ChangeEvent
from flowwarden.spark import EVENT_COLUMNS, events_to_arrow
from flowwarden.spark.convert import native
from flowwarden.spark.convert.extjson import JsonMode

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="flowwarden.spark.convert._native is not built")

MODES = list(JsonMode)
T0 = 1_700_000_000


def python_table(data: list[bytes], mode: JsonMode) -> pa.Table:
    decoded = [bson.decode(item, codec_options=native.DECODE_OPTIONS) for item in data]
    return events_to_arrow(decoded, json_mode=mode).table


def native_result(data: list[bytes], mode: JsonMode) -> pa.Table | str:
    """The compiled converter's table of the whole batch, or the reason for the first event it
    leaves to Python."""
    converted = native.convert([RawBSONDocument(item) for item in data], mode)
    assert converted is not None
    if isinstance(converted, str):
        return converted
    columns, left = converted
    if left:
        index, reason = left[0]
        return f"event {index}: {reason}"
    table = pa.Table.from_arrays(columns, schema=python_table([], mode).schema)
    table.validate(full=True)
    return table


def assert_same(native_table: pa.Table, expected: pa.Table) -> None:
    assert native_table.schema == expected.schema
    for name in expected.column_names:
        assert native_table[name].to_pylist() == expected[name].to_pylist(), name
    assert native_table.equals(expected)


def assert_native_equals_python(data: list[bytes], mode: JsonMode, *, must_convert: bool) -> str | None:
    """The native table equals the Python one; returns the fallback reason, if any."""
    result = native_result(data, mode)
    if isinstance(result, str):
        assert not must_convert, result
        return result
    assert_same(result, python_table(data, mode))
    # and events_to_arrow itself takes the native path to the same table
    assert events_to_arrow([RawBSONDocument(item) for item in data], json_mode=mode).table.equals(result)
    return None


# ----------------------------------------------------------------------------------------------
# Strategies: BSON values of every type the C code converts, at every edge.

text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
keys = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=8)
# Doubles: anything, plus the decimal-looking ones the fast formatter takes (m / 10**k).
doubles = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.builds(lambda m, k: m / 10**k, st.integers(-(10**16), 10**16), st.integers(0, 19)),
    st.sampled_from(
        [0.0, -0.0, 1e-3, 9.999e-4, 1e15, 999999999999999.9, 1e16, 5e-324, 1.7976931348623157e308]
    ),
)
int64s = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([-(2**63), 2**63 - 1, -(2**31) - 1, 2**31, 0])
)
millis = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-62135596800000 - 5, -62135596800000 + 5),
    st.integers(253402300799999 - 5, 253402300799999 + 5),
    st.integers(-(10**12), 4 * 10**12),
    st.integers(-5, 5),
)
canonical_bids = st.builds(
    lambda sign, coefficient, exponent: (coefficient | (exponent << 113) | (sign << 127)).to_bytes(
        16, "little"
    ),
    st.integers(0, 1),
    st.one_of(st.integers(0, 10**34 - 1), st.integers(0, 999), st.integers(2**64 - 5, 2**64 + 5)),
    st.one_of(st.integers(0, 12287), st.integers(6176 - 8, 6176 + 3)),
)
"""Decimal128 encodings in canonical form (what MongoDB writes); the C code converts these."""
bids = st.one_of(st.binary(min_size=16, max_size=16), canonical_bids)
binary_subtypes = st.sampled_from([0, 1, 3, 4, 5, 6, 7, 8, 128, 255])


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**31), 2**31 - 1),
        int64s.map(Int64),
        doubles,
        text,
        millis.map(DatetimeMS),
        st.binary(min_size=12, max_size=12).map(ObjectId),
        canonical_bids.map(Decimal128.from_bid),
        st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
        st.builds(Binary, st.binary(max_size=20), binary_subtypes),
        st.builds(Regex, text.filter(lambda s: "\x00" not in s), st.text("ilmsuxab", max_size=8)),
        st.builds(Code, text),
        st.just(MinKey()),
        st.just(MaxKey()),
    )


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.dictionaries(keys, children, max_size=5), st.lists(children, max_size=5))


values = st.recursive(scalars(), containers, max_leaves=20)
documents = st.dictionaries(keys, values, max_size=6)
namespaces = st.fixed_dictionaries(
    {}, optional={"db": st.one_of(text, st.none()), "coll": st.one_of(text, st.none())}
)
truncations = st.fixed_dictionaries(
    {
        "field": text,
        "newSize": st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1).map(Int64)),
    },
    optional={"other": values},  # a key truncated_arrays does not show
)
"""updateDescription.truncatedArrays entries of the shape the C code converts."""


@st.composite
def change_events(draw: st.DrawFn, index: int = 0) -> dict[str, Any]:
    """A change event with the fields events_to_arrow reads, each maybe missing or null."""
    event: dict[str, Any] = {
        "_id": {"_data": f"82{T0:08X}{index:08X}" + draw(st.sampled_from(["04", "abc"]))}
    }

    def maybe(key: str, strategy: st.SearchStrategy[Any]) -> None:
        choice = draw(st.sampled_from(["value", "value", "missing", "null"]))
        if choice == "value":
            event[key] = draw(strategy)
        elif choice == "null":
            event[key] = None

    maybe("operationType", st.sampled_from(["insert", "update", "delete", "dropDatabase", "ünïcode"]))
    maybe("clusterTime", st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))
    maybe("wallTime", millis.map(DatetimeMS))
    maybe("ns", namespaces)
    maybe("to", namespaces)
    maybe("documentKey", values)
    maybe("fullDocument", documents)
    maybe("fullDocumentBeforeChange", documents)
    maybe(
        "updateDescription",
        st.fixed_dictionaries(
            {},
            optional={
                "updatedFields": documents,
                "removedFields": st.one_of(st.none(), st.lists(text, max_size=4)),
                "truncatedArrays": st.one_of(st.none(), st.lists(truncations, max_size=3)),
            },
        ),
    )
    if draw(st.booleans()):
        event["txnNumber"] = Int64(draw(int64s))
        event["lsid"] = {"id": Binary(draw(st.binary(min_size=16, max_size=16)), 4), "uid": b"\x01" * 32}
    return event


batches = st.lists(change_events(), min_size=1, max_size=4).map(
    lambda events: [bson.encode(e) for e in events]
)


# ----------------------------------------------------------------------------------------------
# Differential: the native table is the Python table


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=batches)
def test_native_table_is_the_python_table(mode: JsonMode, data: list[bytes]) -> None:
    assert_native_equals_python(data, mode, must_convert=True)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=300, deadline=None)
@given(value=values)
def test_every_value_as_a_full_document(mode: JsonMode, value: Any) -> None:
    data = [bson.encode({"_id": {"_data": "8200"}, "fullDocument": {"v": value}, "documentKey": value})]
    assert_native_equals_python(data, mode, must_convert=True)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=1500, deadline=None)
@given(number=doubles)
def test_doubles_are_written_as_repr(mode: JsonMode, number: float) -> None:
    data = [bson.encode({"_id": {"_data": "8200"}, "fullDocument": {"v": number, "w": [-number]}})]
    assert_native_equals_python(data, mode, must_convert=True)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=1000, deadline=None)
@given(bid=bids)
def test_decimal128_text(mode: JsonMode, bid: bytes) -> None:
    """Canonical encodings convert natively; non-canonical and clamped ones fall back."""
    data = [bson.encode({"_id": {"_data": "8200"}, "fullDocument": {"v": Decimal128.from_bid(bid)}})]
    assert_native_equals_python(data, mode, must_convert=False)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=800, deadline=None)
@given(ms=millis)
def test_dates_in_and_out_of_datetime_range(mode: JsonMode, ms: int) -> None:
    data = [
        bson.encode(
            {"_id": {"_data": "8200"}, "wallTime": DatetimeMS(ms), "fullDocument": {"d": DatetimeMS(ms)}}
        )
    ]
    assert_native_equals_python(data, mode, must_convert=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "value",
    [
        -0.0,
        math.nan,
        -math.inf,
        math.inf,
        1e16,
        1e-5,
        0.1 + 0.2,
        2**53,
        Int64(-(2**63)),
        Int64(2**63 - 1),
        -(2**31),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999000),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999000),
        dt.datetime(1, 1, 1),
        DatetimeMS(2**62),
        DatetimeMS(-(2**62)),
        Decimal128("-0"),
        Decimal128("1E-6176"),
        Decimal128("0E+6111"),
        Decimal128("-1.000000000000000000000000000000000E+6144"),
        Decimal128("NaN"),
        Decimal128("-sNaN"),
        Decimal128("-Infinity"),
        Decimal128("0.000001234"),
        Decimal128("0.0000001234"),
        '\x00\x01\x1f\x7f"\\/\u2028é😀',
        Binary(b"", 0),
        Binary(b"\xff" * 17, 3),
        Binary(b"x" * 16, 4),
        Binary(b"ab", 0x80),
        Regex('a"b\\', "xusmli-q"),
        Code("function () { return '\\n'; }"),
        MinKey(),
        MaxKey(),
        Timestamp(2**32 - 1, 2**32 - 1),
        [],
        {},
        [[[]], {"": {}}],
    ],
    ids=repr,
)
def test_edge_values(mode: JsonMode, value: Any) -> None:
    data = [
        bson.encode({"_id": {"_data": "8200"}, "fullDocument": {"v": value}, "documentKey": {"k": value}})
    ]
    assert_native_equals_python(data, mode, must_convert=True)


def test_symbol_and_undefined_read_as_str_and_none() -> None:
    doc = bson.encode(
        {"_id": {"_data": "8200"}, "operationType": "insert", "fullDocument": {"s": "x", "u": None}}
    )
    doc = doc.replace(b"\x02operationType\x00", b"\x0eoperationType\x00")
    doc = doc.replace(b"\x02s\x00", b"\x0es\x00").replace(b"\x0au\x00", b"\x06u\x00")
    for mode in MODES:
        assert_native_equals_python([doc], mode, must_convert=True)


# ----------------------------------------------------------------------------------------------
# What the C code leaves to Python


def event_with(document: Any) -> bytes:
    return bson.encode({"_id": {"_data": "8200"}, "operationType": "insert", "fullDocument": document})


def with_duplicate_key() -> bytes:
    # {"a": 1, "b": 2, "a": 3} inside fullDocument: a decoded dict keeps {"a": 3, "b": 2}
    inner = (
        b"\x10a\x00"
        + struct.pack("<i", 1)
        + b"\x10b\x00"
        + struct.pack("<i", 2)
        + b"\x10a\x00"
        + struct.pack("<i", 3)
    )
    document = struct.pack("<i", len(inner) + 5) + inner + b"\x00"
    element = b"\x03fullDocument\x00" + document
    token = bson.encode({"_data": "8200"})
    body = b"\x03_id\x00" + token + element
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


# Events the C code leaves to Python, each with a word of the reason it gives.
LEFT_TO_PYTHON = [
    (event_with({"c": Code("x", {"a": 1})}), "code with scope"),
    (event_with({"r": DBRef("orders", 1)}), "$ref"),
    (event_with({"b": Binary(b"abc", 2)}), "subtype 2"),
    (with_duplicate_key(), "repeated field name"),
    (bson.encode({"_id": {"_data": "8200"}, "operationType": 5}), "operationType"),
    (bson.encode({"_id": {"_data": "8200"}, "ns": {"db": 1}}), "ns.db"),
    (
        bson.encode({"_id": {"_data": "8200"}, "updateDescription": {"removedFields": ["a", None]}}),
        "removedFields",
    ),
    (event_with({"v": Decimal128.from_bid(bytes(15) + b"\x60")}), "non-canonical Decimal128"),
    (bson.encode({"_id": {"_data": "8200"}, "to": "shop.orders"}), "to is not a document"),
    (bson.encode({"_id": {"_data": "8200"}, "to": {"db": "shop", "coll": 5}}), "to.coll"),
    (
        bson.encode({"_id": {"_data": "8200"}, "updateDescription": {"truncatedArrays": [{"field": "a"}]}}),
        "newSize",
    ),
]
LEFT_IDS = [
    "code-with-scope",
    "dbref",
    "binary-2",
    "duplicate-key",
    "op-int",
    "db-int",
    "removed-null",
    "dec128",
    "to-text",
    "to-coll-int",
    "truncation-without-size",
]


@pytest.mark.parametrize(("data", "reason"), LEFT_TO_PYTHON, ids=LEFT_IDS)
def test_cases_left_to_python_give_the_python_table(data: bytes, reason: str) -> None:
    for mode in MODES:
        result = native_result([data], mode)
        assert isinstance(result, str) and reason in result
        try:
            expected = python_table([data], mode)
        except (pa.ArrowException, FlowWardenError):
            continue  # shapes the Python path refuses too
        assert events_to_arrow([RawBSONDocument(data)], json_mode=mode).table.equals(expected)


@st.composite
def mixed_batches(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """A batch of converted events with events left to Python anywhere in it (first, last,
    several in a row), and where those are."""
    data = [bson.encode(event) for event in draw(st.lists(change_events(), min_size=0, max_size=10))]
    left: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        data.insert(at, draw(st.sampled_from(LEFT_TO_PYTHON))[0])
        left = [index + (index >= at) for index in left] + [at]
    return data, sorted(left)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=mixed_batches())
def test_events_left_to_python_are_put_back_in_their_places(
    mode: JsonMode, batch: tuple[list[bytes], list[int]]
) -> None:
    data, left = batch
    converted = native.convert([RawBSONDocument(item) for item in data], mode)
    if len(left) < len(data):
        assert isinstance(converted, native.Converted)
        assert [index for index, _ in converted.left] == left
        assert [len(column) for column in converted.columns] == [len(data) - len(left)] * len(EVENT_COLUMNS)
    else:
        assert isinstance(converted, str)
    try:
        expected = python_table(data, mode)
    except (pa.ArrowException, FlowWardenError):
        return  # shapes the Python path refuses too
    got = events_to_arrow([RawBSONDocument(item) for item in data], json_mode=mode).table
    got.validate(full=True)
    assert_same(got, expected)


def update_with_truncations(value: Any) -> bytes:
    return bson.encode(
        {
            "_id": {"_data": "8200"},
            "operationType": "update",
            "updateDescription": {"updatedFields": {"a": [1]}, "removedFields": [], "truncatedArrays": value},
        }
    )


def test_truncated_arrays_rename_targets_and_increments_convert_natively() -> None:
    data = [
        update_with_truncations(
            [{"field": "a", "newSize": 1}, {"field": "é.b", "newSize": Int64(0), "x": 1}]
        ),
        bson.encode(
            {
                "_id": {"_data": "8201"},
                "operationType": "rename",
                "clusterTime": Timestamp(T0, 2**32 - 1),
                "ns": {"db": "shop", "coll": "orders"},
                "to": {"db": "archive", "coll": "orders_2024"},
            }
        ),
        update_with_truncations([]),
    ]
    for mode in MODES:
        table = native_result(data, mode)
        assert isinstance(table, pa.Table)
        assert_same(table, python_table(data, mode))
        assert table["truncated_arrays"].to_pylist() == [
            [{"field": "a", "new_size": 1}, {"field": "é.b", "new_size": 0}],
            None,
            [],
        ]
        assert table["to_database"].to_pylist() == [None, "archive", None]
        assert table["to_collection"].to_pylist() == [None, "orders_2024", None]
        assert table["cluster_time_increment"].to_pylist() == [None, 2**32 - 1, None]


# truncatedArrays of shapes MongoDB does not write: null in truncated_arrays, the rest of the
# event converted as usual. The C code leaves each to Python, with a word of its reason.
TRUNCATIONS_OF_OTHER_SHAPES = [
    ("a.b", "not an array"),
    ({"field": "a", "newSize": 1}, "not an array"),
    ([1], "not a document"),
    ([{"field": "a", "newSize": 1}, None], "not a document"),
    ([{"field": 1, "newSize": 2}], "field that is not a string"),
    ([{"field": Code("a"), "newSize": 2}], "field that is not a string"),
    ([{"field": None, "newSize": 2}], "field that is not a string"),
    ([{"newSize": 2}], "field that is not a string"),
    ([{"field": "a", "newSize": 2.0}], "not an integer"),
    ([{"field": "a", "newSize": True}], "not an integer"),
    ([{"field": "a"}], "not an integer"),
    ([{"field": "a", "newSize": Int64(2**31)}], "32-bit"),
    ([{"field": "a", "newSize": Int64(-(2**31) - 1)}], "32-bit"),
    ([{"field": "a", "newSize": 1}, {"$ref": "orders", "$id": 1}], "$ref"),
]


@pytest.mark.parametrize(("value", "reason"), TRUNCATIONS_OF_OTHER_SHAPES, ids=repr)
def test_truncated_arrays_of_other_shapes_are_null(value: Any, reason: str) -> None:
    fitting = update_with_truncations([{"field": "a", "newSize": 1}])
    data = [fitting, update_with_truncations(value), fitting]
    for mode in MODES:
        converted = native.convert([RawBSONDocument(item) for item in data], mode)
        assert isinstance(converted, native.Converted)
        ((index, why),) = converted.left
        assert index == 1 and reason in why
        table = events_to_arrow([RawBSONDocument(item) for item in data], json_mode=mode).table
        table.validate(full=True)
        assert_same(table, python_table(data, mode))
        assert table["truncated_arrays"].to_pylist() == [
            [{"field": "a", "new_size": 1}],
            None,
            [{"field": "a", "new_size": 1}],
        ]
        assert table["updated_fields"][1].as_py() == table["updated_fields"][0].as_py()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.lists(st.one_of(truncations, values), max_size=3), values))
def test_truncated_arrays_of_any_shape_give_the_python_table(mode: JsonMode, value: Any) -> None:
    data = [update_with_truncations(value)]
    assert_native_equals_python(data, mode, must_convert=False)
    table = events_to_arrow([RawBSONDocument(data[0])], json_mode=mode).table
    table.validate(full=True)
    assert_same(table, python_table(data, mode))


def test_duplicate_keys_decode_as_the_last_value_in_the_first_place() -> None:
    table = events_to_arrow([RawBSONDocument(with_duplicate_key())]).table
    assert table["full_document"].to_pylist() == ['{"a":{"$numberInt":"3"},"b":{"$numberInt":"2"}}']


def test_invalid_utf8_is_an_undecodable_event() -> None:
    data = event_with({"s": "abc"}).replace(b"abc", b"a\xffc")
    assert "UTF-8" in str(native_result([data], JsonMode.CANONICAL))
    with pytest.raises(UndecodableEventError) as caught:
        events_to_arrow([RawBSONDocument(bson.encode({"_id": {"_data": "8200"}})), RawBSONDocument(data)])
    assert caught.value.index == 1


def test_a_missing_resume_token_is_the_python_paths_error() -> None:
    from flowwarden.errors import InvalidTokenError

    with pytest.raises(InvalidTokenError):
        events_to_arrow([RawBSONDocument(bson.encode({"operationType": "insert"}))])


def test_an_initial_snapshot_row_has_no_token_and_a_null_id_on_both_paths() -> None:
    row = {
        "operationType": "snapshot",
        "clusterTime": Timestamp(1_700_000_000, 3),
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": 7},
        "fullDocument": {"_id": 7, "qty": 2},
    }
    data = bson.encode(row)
    table = native_result([data], JsonMode.CANONICAL)
    assert isinstance(table, pa.Table), table  # converted natively, not left to Python
    assert table["_id"].to_pylist() == [None]
    assert table["operation_type"].to_pylist() == ["snapshot"]
    assert table["cluster_time_increment"].to_pylist() == [3]
    assert_same(table, python_table([data], JsonMode.CANONICAL))


# ----------------------------------------------------------------------------------------------
# Malformed bytes: a fallback (then the Python path's error), never a crash


class Carrier:
    """Any bytes, without RawBSONDocument's own size check."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


def convert_any(data: bytes, mode: JsonMode) -> Any:
    from flowwarden.spark.convert import _native

    return _native.convert([Carrier(data)], mode is JsonMode.RELAXED, Carrier, None, None, 1)


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(batches)[0])
    how = draw(st.sampled_from(["truncate", "flip", "insert", "header"]))
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif how == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=4))
    else:
        data[:4] = struct.pack("<i", draw(st.integers(-(2**31), 2**31 - 1)))
    return bytes(data)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=corrupted())
def test_corrupted_bytes_fall_back_or_match(mode: JsonMode, data: bytes) -> None:
    result = convert_any(data, mode)
    try:
        decoded = bson.decode(data, codec_options=native.DECODE_OPTIONS)
    except InvalidBSON:
        assert isinstance(result, str), "the C code accepted bytes bson refuses"
        return
    if isinstance(result, str):
        return
    expected = events_to_arrow([decoded], json_mode=mode).table
    ((count, columns, left),) = result
    assert left == ()
    table = pa.Table.from_arrays(
        [native._array(kind, count, column) for kind, column in zip(native._KINDS, columns, strict=True)],
        schema=expected.schema,
    )
    table.validate(full=True)
    assert_same(table, expected)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_random_bytes_never_crash(data: bytes) -> None:
    assert isinstance(convert_any(data, JsonMode.CANONICAL), (str, list))  # one event: all or nothing


@pytest.mark.parametrize("cut", range(0, 40))
def test_every_truncation_of_an_event_falls_back(cut: int) -> None:
    data = event_with({"a": [1, 2.5, "x"], "d": Decimal128("1.5")})
    short = data[:cut] + data[-1:] if cut else b""
    assert isinstance(convert_any(short, JsonMode.CANONICAL), str)


def test_raw_events_with_damaged_bytes_raise_undecodable_event_error() -> None:
    data = bytearray(event_with({"a": "text"}))
    data[data.index(b"text") - 5] = 0x42  # the string's type byte: an unknown BSON type
    with pytest.raises(UndecodableEventError, match="event 0 of the batch is not valid BSON"):
        events_to_arrow([RawBSONDocument(bytes(data))])


def test_bytes_a_raw_property_builds_per_call_stay_alive_while_converted() -> None:
    """Nothing but the converter holds the bytes such a property returns."""
    from flowwarden.spark.convert import _native

    data = event_with({"s": "x" * 5000})

    class Fresh:
        @property
        def raw(self) -> bytes:
            return bytes(bytearray(data))

    ((count, columns, left),) = _native.convert([Fresh() for _ in range(50)], False, Fresh, None, None, 1)
    assert count == 50 and left == ()
    expected = events_to_arrow([RawBSONDocument(data)] * 50).table
    table = pa.Table.from_arrays(
        [native._array(kind, count, column) for kind, column in zip(native._KINDS, columns, strict=True)],
        schema=expected.schema,
    )
    assert_same(table, expected)


def test_a_list_emptied_while_its_bytes_are_read_is_converted_as_it_was() -> None:
    from flowwarden.spark.convert import _native

    data = event_with({"a": 1})
    events: list[Any] = []

    class Shrinking:
        @property
        def raw(self) -> bytes:
            events.clear()
            return data

    events.extend(Shrinking() for _ in range(1000))
    ((count, _, left),) = _native.convert(events, False, Shrinking, None, None, 1)
    assert count == 1000 and left == ()


def test_a_subclass_overriding_raw_is_converted_from_what_raw_returns() -> None:
    """The compiled path reads RawBSONDocument's own slot only for RawBSONDocument itself."""
    original = event_with({"a": 1})
    replaced = event_with({"a": 2})

    class Redacted(RawBSONDocument):
        @property
        def raw(self) -> bytes:
            return replaced

    table = events_to_arrow([Redacted(original)]).table
    assert table.column("full_document").to_pylist() == [
        events_to_arrow([RawBSONDocument(replaced)]).table.column("full_document")[0].as_py()
    ]


def test_empty_strings_in_empty_columns() -> None:
    event = bson.encode({"_id": {"_data": "8200"}, "operationType": "", "ns": {"db": "", "coll": ""}})
    table = events_to_arrow([RawBSONDocument(event)]).table
    assert table.column("database").to_pylist() == [""] and table.column("operation_type").to_pylist() == [""]


# ----------------------------------------------------------------------------------------------
# Inputs and paths


def sample_events(count: int) -> list[bytes]:
    events = []
    for i in range(count):
        oid = ObjectId()
        events.append(
            bson.encode(
                {
                    "_id": {"_data": f"82{T0 + i:08X}00000001"},
                    "operationType": "update",
                    "clusterTime": Timestamp(T0 + i, 1),
                    "wallTime": dt.datetime(2024, 1, 1) + dt.timedelta(milliseconds=i),
                    "ns": {"db": "shop", "coll": "orders"},
                    "documentKey": {"_id": oid},
                    "fullDocument": {"_id": oid, "qty": i, "price": i / 100, "tags": ["a", "é"]},
                    "updateDescription": {
                        "updatedFields": {"qty": i},
                        "removedFields": ["x"],
                        "truncatedArrays": [],
                    },
                }
            )
        )
    return events


def test_change_events_memoryviews_and_subclasses_take_the_native_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = sample_events(50)
    expected = python_table(data, JsonMode.CANONICAL)

    class Raw(RawBSONDocument):
        pass

    calls: list[Any] = []
    convert = native.convert

    def counting(*args: Any, **kwargs: Any) -> Any:
        result = convert(*args, **kwargs)
        calls.append(result)
        return result

    monkeypatch.setattr(native, "convert", counting)
    for events in (
        [ChangeEvent(RawBSONDocument(item)) for item in data],
        [RawBSONDocument(memoryview(item)) for item in data],
        [Raw(item) for item in data],
    ):
        assert events_to_arrow(events).table.equals(expected)
        assert isinstance(calls[-1], native.Converted)  # the table came from the compiled converter
    # A list of ChangeEvents is offered as it is first (declined: not RawBSONDocuments), then
    # unwrapped; the two lists of RawBSONDocuments go as they are.
    assert [result is None for result in calls] == [True, False, False, False]


def test_mixed_and_decoded_batches_take_the_python_path() -> None:
    data = sample_events(4)
    expected = python_table(data, JsonMode.CANONICAL)
    decoded = [bson.decode(item, codec_options=native.DECODE_OPTIONS) for item in data]
    assert native.convert(decoded, JsonMode.CANONICAL) is None
    mixed = [RawBSONDocument(data[0]), *decoded[1:]]
    assert events_to_arrow(mixed).table.equals(expected)


def test_without_the_module_the_python_path_converts(monkeypatch: pytest.MonkeyPatch) -> None:
    data = sample_events(20)
    expected = events_to_arrow([RawBSONDocument(item) for item in data]).table

    def refuse(*args: Any) -> Any:
        raise AssertionError("the compiled converter must not run")

    monkeypatch.setattr(native, "AVAILABLE", False)
    monkeypatch.setattr(native, "_native", None)
    monkeypatch.setattr(native, "convert", refuse)
    assert events_to_arrow([RawBSONDocument(item) for item in data]).table.equals(expected)
    assert events_to_arrow([RawBSONDocument(item) for item in data], json_mode="relaxed").table.equals(
        python_table(data, JsonMode.RELAXED)
    )


def test_an_empty_batch() -> None:
    converted = native.convert([], JsonMode.CANONICAL)
    assert isinstance(converted, native.Converted) and converted.left == ()
    assert [len(column) for column in converted.columns] == [0] * len(EVENT_COLUMNS)
    assert events_to_arrow([]).table.equals(python_table([], JsonMode.CANONICAL))


def test_large_batches_are_converted_in_slices_on_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "THREADS", 3)
    data = sample_events(7000)
    for mode in MODES:
        result = native_result(data[:6400], mode)
        assert isinstance(result, pa.Table) and result["_id"].num_chunks == 3
        assert_same(result, python_table(data[:6400], mode))
    # events each slice leaves to Python (binary subtype 2), the first and last of a slice too
    left = [0, 10, 2332, 3000, 3001, 4666, 6500, 6999]
    for index in left:
        data[index] = event_with({"b": Binary(b"abc", 2), "i": index})
    for mode in MODES:
        converted = native.convert([RawBSONDocument(item) for item in data], mode)
        assert isinstance(converted, native.Converted)
        assert [index for index, _ in converted.left] == left
        assert all("binary subtype 2" in reason for _, reason in converted.left)
        assert [len(column) for column in converted.columns] == [7000 - len(left)] * len(EVENT_COLUMNS)
        assert events_to_arrow([RawBSONDocument(item) for item in data], json_mode=mode).table.equals(
            python_table(data, mode)
        )


def test_large_batch_buffers_grow() -> None:
    data = sample_events(3000)
    big = event_with(
        {"text": "é" * 200_000, "list": list(range(5000)), "son": SON([(str(i), i) for i in range(300)])}
    )
    data.append(big)
    for mode in MODES:
        assert_native_equals_python(data, mode, must_convert=True)


def test_regex_flags_are_read_as_bson_reads_them() -> None:
    data = event_with({"r": Regex("x", "zzimxi")})
    for mode in MODES:
        assert_native_equals_python([data], mode, must_convert=True)
    assert re.search(
        r'"options":"imx"', events_to_arrow([RawBSONDocument(data)]).table["full_document"][0].as_py()
    )


# ----------------------------------------------------------------------------------------------
# The pool of output blocks


def big_batch(count: int, tag: str) -> list[bytes]:
    """Events whose full documents make output blocks of a few MiB: pooled on release."""
    return [event_with({"n": i, "tag": tag, "text": tag * 1000}) for i in range(count)]


def test_released_blocks_are_reused_and_tables_alive_keep_their_bytes() -> None:
    native.release_memory()
    first_data, second_data = big_batch(3000, "a"), big_batch(3000, "b")
    first = native_result(first_data, JsonMode.CANONICAL)
    assert isinstance(first, pa.Table)
    second = native_result(second_data, JsonMode.CANONICAL)
    assert isinstance(second, pa.Table)
    # tables alive keep their own blocks: writing the second did not touch the first
    assert_same(first, python_table(first_data, JsonMode.CANONICAL))
    assert_same(second, python_table(second_data, JsonMode.CANONICAL))

    del first, second
    blocks, held = native.pooled_memory()
    assert blocks >= 2 and held >= 2 * 3000 * 1000  # at least the two full_document columns
    again = native_result(first_data, JsonMode.CANONICAL)  # written into pooled blocks
    assert isinstance(again, pa.Table)
    assert native.pooled_memory()[1] < held
    assert_same(again, python_table(first_data, JsonMode.CANONICAL))

    del again
    _, held = native.pooled_memory()
    assert native.release_memory() == held
    assert native.pooled_memory() == (0, 0)


def test_the_pool_keeps_at_most_256_mib() -> None:
    native.release_memory()
    tables = [native_result(big_batch(2500, str(i % 10)), JsonMode.CANONICAL) for i in range(120)]
    assert all(isinstance(table, pa.Table) for table in tables)
    del tables  # a few hundred MiB of blocks released at once
    blocks, held = native.pooled_memory()
    assert 0 < held <= 256 << 20 and blocks > 0
    native.release_memory()


def test_threads_converting_and_releasing_at_once_get_their_own_tables() -> None:
    native.release_memory()
    batches = {tag: big_batch(2500, tag) for tag in "wxyz"}
    expected = {tag: python_table(data, JsonMode.RELAXED) for tag, data in batches.items()}
    errors: list[BaseException] = []

    def work(tag: str) -> None:
        try:
            for _ in range(6):
                events = [RawBSONDocument(item) for item in batches[tag]]
                assert events_to_arrow(events, json_mode=JsonMode.RELAXED).table.equals(expected[tag])
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(tag,)) for tag in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    native.release_memory()
