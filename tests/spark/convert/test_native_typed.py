"""The compiled converter with a typed full document, against the Python path.

Every schema kind (struct, list, map, the integer widths, float, double, bool, timestamp,
timestamp_ntz, date, decimal, binary, UUID, ObjectId-as-string, enums and literals, Any as
Extended JSON, defaults) gets random values that fit and values that do not. The native
table must equal the Python path's table for every schema mode; an event with a value that
does not fit is taken back out of the native columns, wherever the value sits, and converted
by the Python path, which reports it (same ``malformed`` rows, same errors).
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import re
import uuid
from decimal import Decimal
from typing import Any, Literal

import bson
import bson.json_util
import pyarrow as pa
import pytest
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field
from pyspark.sql.types import (
    BinaryType,
    DateType,
    FloatType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from flowwarden.config import SchemaMode
from flowwarden.errors import SchemaMismatchError
from flowwarden.spark import EVENT_COLUMNS, events_to_arrow
from flowwarden.spark.convert import native
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.convert.plan import conversion_plan
from flowwarden.spark.schema import ObjectIdStr

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="flowwarden.spark.convert._native is not built")

FULL_DOCUMENT = EVENT_COLUMNS.index("full_document")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Line(BaseModel):
    sku: str
    qty: int
    price: float | None = None


class Doc(BaseModel):
    id: ObjectIdStr = Field(alias="_id")
    name: str
    count: int = 0
    ratio: float | None = None
    ok: bool | None = None
    at: dt.datetime | None = None
    day: dt.date | None = None
    amount: Decimal | None = Field(default=None, max_digits=12, decimal_places=2)
    big: Decimal | None = None
    blob: bytes | None = None
    key: uuid.UUID | None = None
    color: Color | None = None
    level: Literal[1, 2, 3] | None = None
    lines: list[Line] = []
    tags: list[str] | None = None
    attrs: dict[str, int] | None = None
    extra: Any = None
    note: str = "none"


SPARK_SCHEMA = StructType(
    [
        StructField("_id", StringType()),
        StructField("small", ShortType()),
        StructField("f", FloatType()),
        StructField("when", TimestampNTZType()),
        StructField("day", DateType()),
        StructField("raw", BinaryType()),
    ]
)

SCHEMAS = [Doc, SPARK_SCHEMA]
MODES = list(SchemaMode)

keys = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=3)
ms_values = st.one_of(
    st.integers(-(10**13), 10**13),
    st.integers(-(10**13), 10**13).map(lambda d: d - d % 86_400_000),
    st.sampled_from([2**62, -(2**62)]),
)
numbers = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6).map(float),
    st.sampled_from([2**53 + 1, 2**24 + 1, 32767, 32768, -32769]).map(Int64),
)
decimals = st.one_of(
    st.decimals(min_value=-(10**10), max_value=10**10, places=2).map(lambda d: Decimal128(d)),
    st.decimals(allow_nan=False, allow_infinity=False, places=None)
    .filter(lambda d: len(d.as_tuple().digits) <= 34 and -6176 <= d.as_tuple().exponent <= 6111)  # type: ignore[operator]
    .map(lambda d: Decimal128(d)),
    st.sampled_from(["NaN", "Infinity", "1E+20", "0.001", "-0"]).map(Decimal128),
)
anything = st.one_of(
    st.none(),
    numbers,
    st.text(max_size=6),
    ms_values.map(DatetimeMS),
    decimals,
    st.builds(Binary, st.binary(max_size=17), st.sampled_from([0, 3, 4, 5])),
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.booleans(),
    st.lists(st.integers(0, 5), max_size=3),
    st.dictionaries(keys, st.integers(-(2**63), 2**63 - 1), max_size=3),
)


def often(fitting: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly values that fit, sometimes anything at all."""
    return st.one_of(fitting, fitting, fitting, fitting, fitting, fitting, anything)


line = st.fixed_dictionaries(
    {"sku": often(st.text(max_size=5)), "qty": often(st.integers(-5, 5))},
    optional={"price": often(st.floats(allow_nan=False))},
)
doc_fields = {
    "_id": often(st.binary(min_size=12, max_size=12).map(ObjectId)),
    "name": often(st.text(max_size=8)),
}
doc_optional = {
    "count": often(numbers),
    "ratio": often(numbers),
    "ok": often(st.booleans()),
    "at": often(ms_values.map(DatetimeMS)),
    "day": often(ms_values.map(DatetimeMS)),
    "amount": often(decimals),
    "big": often(st.one_of(decimals, st.integers(-(10**15), 10**15), st.floats(-1e6, 1e6))),
    "blob": often(st.builds(Binary, st.binary(max_size=9), st.sampled_from([0, 5, 128]))),
    "key": often(st.builds(Binary, st.binary(min_size=16, max_size=16), st.just(4))),
    "color": often(st.sampled_from(["red", "blue", "green"])),
    "level": often(st.sampled_from([1, 2, 3, 4])),
    "lines": often(st.lists(line, max_size=3)),
    "tags": often(st.lists(st.one_of(st.text(max_size=4), st.none()), max_size=3)),
    "attrs": often(st.dictionaries(keys, st.one_of(st.integers(-9, 9), st.none()), max_size=3)),
    "extra": anything,
    "note": often(st.text(max_size=4)),
    "small": often(st.integers(-40000, 40000)),
    "f": often(numbers),
    "when": often(ms_values.map(DatetimeMS)),
    "raw": often(st.builds(Binary, st.binary(max_size=9), st.sampled_from([0, 5]))),
}
documents = st.fixed_dictionaries(doc_fields, optional=doc_optional)


@st.composite
def raw_events(draw: st.DrawFn) -> list[bytes]:
    out = []
    for i in range(draw(st.integers(1, 12))):
        event: dict[str, Any] = {"_id": {"_data": f"82{i:08X}"}, "operationType": "insert"}
        kind = draw(st.sampled_from(["doc", "doc", "doc", "none", "other"]))
        if kind == "doc":
            event["fullDocument"] = draw(documents)
        elif kind == "other":
            event["fullDocument"] = draw(anything)
        if draw(st.booleans()):
            event["fullDocumentBeforeChange"] = draw(documents)
        out.append(bson.encode(event))
    return out


def python_batch(data: list[bytes], schema: Any, mode: SchemaMode, rescued_data: bool = False) -> Any:
    decoded = [bson.decode(item, codec_options=native.DECODE_OPTIONS) for item in data]
    return events_to_arrow(decoded, schema=schema, mode=mode, rescued_data=rescued_data)


def raw_batch(data: list[bytes], schema: Any, mode: SchemaMode, rescued_data: bool = False) -> Any:
    events = [RawBSONDocument(item) for item in data]
    return events_to_arrow(events, schema=schema, mode=mode, rescued_data=rescued_data)


def comparable(value: Any) -> Any:
    """``value`` with every float NaN replaced by a marker: NaN is never equal to itself."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [comparable(item) for item in value]
    if isinstance(value, dict):
        return {key: comparable(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(comparable(item) for item in value)
    return value


@pytest.mark.parametrize("schema", SCHEMAS, ids=["pydantic", "struct-type"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=raw_events())
# A NaN beside a null in a required field (found by a run of this test): equal tables that
# Table.equals called unequal.
@example(
    data=[
        b"x\x00\x00\x00\x03_id\x00\x1b\x00\x00\x00\x02_data\x00\x0b\x00\x00\x008200000000\x00\x00"
        b"\x02operationType\x00\x07\x00\x00\x00insert\x00\x03fullDocument\x00+\x00\x00\x00\x07_id"
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\nname\x00\x01ratio\x00\x00\x00\x00"
        b"\x00\x00\x00\xf8\x7f\x00\x00"
    ]
)
def test_typed_native_table_is_the_python_table(schema: Any, mode: SchemaMode, data: list[bytes]) -> None:
    assert_same_tables(data, schema, mode, rescued_data=False)


# Both schemas leave keys of the generated documents unnamed (the model has no "small" or
# "raw", the StructType names six fields), so rescue sees unknown keys as well as misfits.
@pytest.mark.parametrize("schema", SCHEMAS, ids=["pydantic", "struct-type"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=raw_events())
def test_rescued_data_is_the_same_on_both_paths(schema: Any, mode: SchemaMode, data: list[bytes]) -> None:
    assert_same_tables(data, schema, mode, rescued_data=True)


def test_rescue_takes_unknown_keys_and_misfits_on_the_compiled_path() -> None:
    documents = [
        {"_id": ObjectId(), "small": 7, "unknown": {"a": [1]}},  # fits but for a key not in the schema
        {"_id": ObjectId(), "small": 1, "day": "Tuesday"},  # a value that does not fit
        {"_id": ObjectId(), "small": 2},
    ]
    data = [
        bson.encode({"_id": {"_data": f"820000000{i}"}, "operationType": "insert", "fullDocument": document})
        for i, document in enumerate(documents)
    ]
    got = raw_batch(data, SPARK_SCHEMA, SchemaMode.FAILFAST, rescued_data=True)
    assert got.malformed == ()
    rescued = [bson.json_util.loads(r) if r else None for r in got.table["_rescued_data"].to_pylist()]
    assert rescued == [
        {"full_document": {"unknown": {"a": [1]}}},
        {"full_document": {"day": "Tuesday"}},
        None,
    ]
    typed = got.table["full_document"].to_pylist()
    assert [row["small"] for row in typed] == [7, 1, 2]
    assert typed[1]["day"] is None


def assert_same_tables(data: list[bytes], schema: Any, mode: SchemaMode, *, rescued_data: bool) -> None:
    try:
        expected = python_batch(data, schema, mode, rescued_data)
    except SchemaMismatchError as error:
        with pytest.raises(SchemaMismatchError) as caught:
            raw_batch(data, schema, mode, rescued_data)
        assert str(caught.value) == str(error)
        return
    got = raw_batch(data, schema, mode, rescued_data)
    got.table.validate(full=True)
    assert got.malformed == expected.malformed
    for name in expected.table.column_names:
        assert comparable(got.table[name].to_pylist()) == comparable(expected.table[name].to_pylist()), name
    # With the values compared above (NaN equal to NaN), equal schemas make the tables equal;
    # Table.equals would hold a NaN unequal to itself.
    assert got.table.schema == expected.table.schema


def fitting_event(i: int) -> bytes:
    oid = ObjectId()
    document = {
        "_id": oid,
        "name": f"n{i}",
        "count": Int64(i),
        "ratio": i / 4,
        "ok": i % 2 == 0,
        "at": dt.datetime(2024, 1, 1) + dt.timedelta(milliseconds=i),
        "day": dt.datetime(2024, 1, 1) + dt.timedelta(days=i),
        "amount": Decimal128(f"{i}.25"),
        "big": i,
        "blob": Binary(b"\x00\x01", 0),
        "key": Binary(uuid.uuid4().bytes, 4),
        "color": "red",
        "level": 2,
        "lines": [{"sku": "a", "qty": 1, "price": 1.5}, {"sku": "b", "qty": 2}],
        "tags": ["x", "y"],
        "attrs": {"a": 1, "b": 2},
        "extra": {"nested": [1, Decimal128("2.5")]},
    }
    return bson.encode({"_id": {"_data": f"82{i:08X}"}, "operationType": "insert", "fullDocument": document})


def test_a_fitting_batch_takes_the_native_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = [fitting_event(i) for i in range(200)]
    results: list[Any] = []
    convert = native.convert

    def recording(*args: Any, **kwargs: Any) -> Any:
        results.append(convert(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(native, "convert", recording)
    for mode in MODES:
        got = raw_batch(data, Doc, mode)
        expected = python_batch(data, Doc, mode)
        assert got.table.equals(expected.table) and got.malformed == ()
    raw_results = [result for result in results if result is not None]  # None: the decoded batches
    assert len(raw_results) == len(MODES)
    assert all(isinstance(result, native.Converted) and result.left == () for result in raw_results)


def test_an_event_with_a_misfit_is_left_to_the_python_path_which_reports_it() -> None:
    data = [fitting_event(0), bson.encode({"_id": {"_data": "8201"}, "fullDocument": {"_id": 1, "name": 2}})]
    plan = conversion_plan(Doc, SchemaMode.PERMISSIVE, JsonMode.CANONICAL)
    converted = native.convert([RawBSONDocument(d) for d in data], JsonMode.CANONICAL, plan.native_document)
    assert isinstance(converted, native.Converted)
    ((index, reason),) = converted.left
    assert index == 1 and "does not fit" in reason
    got = raw_batch(data, Doc, SchemaMode.DROPMALFORMED)
    assert [row.index for row in got.malformed] == [1] and got.table.num_rows == 1


def test_a_typed_event_left_to_python_after_its_document_was_written() -> None:
    """truncatedArrays comes after the typed documents: an event with a shape the C code leaves
    to Python takes its already written document rows back with it."""
    data = [fitting_event(i) for i in range(5)]
    for i, truncations in (
        (1, [{"field": "lines", "newSize": 1}]),
        (3, [{"field": "lines", "newSize": 1.5}]),
    ):
        event = bson.decode(data[i])
        event["updateDescription"] = {"updatedFields": {}, "truncatedArrays": truncations}
        data[i] = bson.encode(event)
    plan = conversion_plan(Doc, SchemaMode.PERMISSIVE, JsonMode.CANONICAL)
    converted = native.convert([RawBSONDocument(d) for d in data], JsonMode.CANONICAL, plan.native_document)
    assert isinstance(converted, native.Converted)
    ((index, reason),) = converted.left
    assert index == 3 and "newSize" in reason
    for mode in MODES:
        got, expected = raw_batch(data, Doc, mode), python_batch(data, Doc, mode)
        got.table.validate(full=True)
        assert got.malformed == expected.malformed == ()
        assert got.table.equals(expected.table)
        assert got.table["truncated_arrays"].to_pylist() == [
            None,
            [{"field": "lines", "new_size": 1}],
            None,
            None,
            None,
        ]


def test_a_misfit_deep_in_an_event_takes_back_only_that_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value that does not fit, found after part of its event was written (two line items
    into a list of three), leaves the rows around it converted natively, every mode; also at
    the edges of the slices threads convert (6200 events in 3 slices: 0, 2066, 4133)."""
    monkeypatch.setattr(native, "THREADS", 3)
    data = [fitting_event(i) for i in range(6200)]
    misfits = [0, 1234, 2065, 2066, 4133, 6199]
    for i in misfits:
        document = bson.decode(fitting_event(i))["fullDocument"]
        document["lines"].append({"sku": "c", "qty": "three"})
        data[i] = bson.encode(
            {"_id": {"_data": f"82{i:08X}"}, "operationType": "insert", "fullDocument": document}
        )
    plan = conversion_plan(Doc, SchemaMode.PERMISSIVE, JsonMode.CANONICAL)
    converted = native.convert([RawBSONDocument(d) for d in data], JsonMode.CANONICAL, plan.native_document)
    assert isinstance(converted, native.Converted)
    assert [index for index, _ in converted.left] == misfits
    documents = converted.columns[FULL_DOCUMENT]
    assert documents.num_chunks == 3 and len(documents) == 6200 - len(misfits)
    for mode in MODES:
        if mode is SchemaMode.FAILFAST:
            with pytest.raises(SchemaMismatchError, match=re.escape("full_document.lines[].qty")):
                raw_batch(data, Doc, mode)
            continue
        got, expected = raw_batch(data, Doc, mode), python_batch(data, Doc, mode)
        got.table.validate(full=True)
        assert got.malformed == expected.malformed and [row.index for row in got.malformed] == misfits
        assert got.table.equals(expected.table)


def test_defaults_bson_cannot_carry_exactly_are_left_to_python() -> None:
    class WithDefaults(BaseModel):
        when: dt.datetime = dt.datetime(2024, 1, 1, 0, 0, 0, 123456)  # microseconds: not in BSON
        price: Decimal = Decimal("1.50")
        made: list[int] = Field(default_factory=lambda: [1])
        plain: int = 7

    data = [bson.encode({"_id": {"_data": "8200"}, "fullDocument": {}})]
    plan = conversion_plan(WithDefaults, SchemaMode.PERMISSIVE, JsonMode.CANONICAL)
    assert isinstance(
        native.convert([RawBSONDocument(data[0])], JsonMode.CANONICAL, plan.native_document), str
    )
    assert raw_batch(data, WithDefaults, SchemaMode.PERMISSIVE).table.equals(
        python_batch(data, WithDefaults, SchemaMode.PERMISSIVE).table
    )

    class Plain(BaseModel):
        plain: int = 7
        label: str = "x"

    plan = conversion_plan(Plain, SchemaMode.PERMISSIVE, JsonMode.CANONICAL)
    converted = native.convert([RawBSONDocument(data[0])], JsonMode.CANONICAL, plan.native_document)
    assert isinstance(converted, native.Converted)
    assert converted.columns[FULL_DOCUMENT].to_pylist() == [{"plain": 7, "label": "x"}]


def test_arrow_schema_types_of_every_kind() -> None:
    schema = pa.schema([pa.field("i8", pa.int8()), pa.field("m", pa.map_(pa.string(), pa.float64()))])
    data = [bson.encode({"_id": {"_data": "8200"}, "fullDocument": {"i8": 5, "m": {"a": 1, "b": 2.5}}})]
    got = raw_batch(data, schema, SchemaMode.FAILFAST)
    assert got.table.equals(python_batch(data, schema, SchemaMode.FAILFAST).table)
    assert got.table["full_document"].to_pylist() == [{"i8": 5, "m": [("a", 1.0), ("b", 2.5)]}]
