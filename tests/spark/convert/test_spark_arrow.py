"""events_to_arrow: every column, every operation type, every BSON type, every schema mode.

No Spark here: the Arrow table is the contract; tests/spark/test_spark_dataframe.py checks that
Spark reads it back unchanged.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from bson import json_util
from bson.binary import Binary
from bson.code import Code
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
from pydantic import BaseModel, Field
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from flowwarden.config import SchemaMode
from flowwarden.errors import InvalidTokenError, SchemaMismatchError
from flowwarden.events import ChangeEvent
from flowwarden.spark import CORRUPT_RECORD_COLUMN, EVENT_COLUMNS, ObjectIdStr, events_to_arrow
from flowwarden.spark.convert.extjson import JSON_OPTIONS, JsonMode, dumps

UTC = dt.timezone.utc
T0 = 1_700_000_000


def token(i: int) -> dict[str, str]:
    return {"_data": f"82{T0 + i:08X}{1:08X}2B042C0100296E5A1004{i:032X}04"}


def event(i: int, op: str = "insert", doc: Any = None, **fields: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "_id": token(i),
        "operationType": op,
        "clusterTime": Timestamp(T0 + i, 1),
        "wallTime": dt.datetime(2023, 11, 14, 22, 13, 20, 123000) + dt.timedelta(seconds=i),
        "ns": {"db": "shop", "coll": "orders"},
    }
    if doc is not None:
        raw["fullDocument"] = doc
        raw["documentKey"] = {"_id": doc.get("_id")} if isinstance(doc, dict) else {"_id": i}
    raw.update(fields)
    return raw


def rows(batch: Any) -> list[dict[str, Any]]:
    table: pa.Table = batch.table
    result: list[dict[str, Any]] = table.to_pylist()
    return result


# ----------------------------------------------------------------------------------------------
# Untyped: every operation type, Extended JSON documents


def test_every_operation_type() -> None:
    oid = ObjectId("65f000000000000000000001")
    doc = {"_id": oid, "sku": "a", "qty": 2}
    events = [
        event(0, "insert", doc),
        event(
            1,
            "update",
            doc,
            updateDescription={
                "updatedFields": {"qty": 3, "price": Decimal128("9.90")},
                "removedFields": ["old", "gone.deep"],
                "truncatedArrays": [{"field": "lines", "newSize": 2}],
            },
            fullDocumentBeforeChange={"_id": oid, "sku": "a", "qty": 2, "old": True},
        ),
        event(2, "replace", {"_id": oid, "sku": "b"}),
        event(3, "delete", None, documentKey={"_id": oid}),
        event(4, "drop"),
        event(5, "rename", to={"db": "shop", "coll": "orders_old"}),
        event(6, "dropDatabase", ns={"db": "shop"}),
        event(7, "invalidate", ns=None),
    ]
    result = rows(events_to_arrow(events))
    assert [r["operation_type"] for r in result] == [e["operationType"] for e in events]
    assert [r["_id"] for r in result] == [token(i)["_data"] for i in range(8)]
    assert [r["cluster_time"] for r in result] == [dt.datetime.fromtimestamp(T0 + i, UTC) for i in range(8)]
    assert [r["cluster_time_increment"] for r in result] == [1] * 8
    assert result[0]["wall_time"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert [(r["database"], r["collection"]) for r in result] == [("shop", "orders")] * 6 + [
        ("shop", None),
        (None, None),
    ]
    assert [(r["to_database"], r["to_collection"]) for r in result] == [(None, None)] * 5 + [
        ("shop", "orders_old"),
        (None, None),
        (None, None),
    ]
    key = '{"_id":{"$oid":"65f000000000000000000001"}}'
    assert [r["document_key"] for r in result] == [key] * 4 + [None] * 4
    assert result[0]["full_document"] == (
        '{"_id":{"$oid":"65f000000000000000000001"},"sku":"a","qty":{"$numberInt":"2"}}'
    )
    assert result[1]["full_document_before_change"] == dumps(events[1]["fullDocumentBeforeChange"])
    assert result[1]["updated_fields"] == '{"qty":{"$numberInt":"3"},"price":{"$numberDecimal":"9.90"}}'
    assert result[1]["removed_fields"] == ["old", "gone.deep"]
    assert result[1]["truncated_arrays"] == [{"field": "lines", "new_size": 2}]
    assert result[0]["updated_fields"] is None and result[0]["removed_fields"] is None
    assert result[0]["truncated_arrays"] is None
    assert [r["full_document"] is None for r in result] == [False, False, False, True, True, True, True, True]
    assert list(result[0]) == list(EVENT_COLUMNS)


def test_cluster_time_and_increment_order_events_within_a_second() -> None:
    increments = [7, 2**32 - 1, 1, 2**31]
    events = [event(0, "insert", {"_id": n}, clusterTime=Timestamp(T0, n)) for n in increments]
    events.append(event(1, "insert", {"_id": 0}, clusterTime=Timestamp(T0 + 1, 0)))
    table = events_to_arrow(events).table
    ordered = table.sort_by([("cluster_time", "ascending"), ("cluster_time_increment", "ascending")])
    assert ordered["cluster_time_increment"].to_pylist() == [1, 7, 2**31, 2**32 - 1, 0]
    assert ordered["full_document"].to_pylist()[-1] == '{"_id":{"$numberInt":"0"}}'


@pytest.mark.parametrize(
    ("truncated", "expected"),
    [
        ([], []),
        (
            [{"field": "a.b", "newSize": 0}, {"field": "c", "newSize": Int64(2**31 - 1), "extra": 1}],
            [{"field": "a.b", "new_size": 0}, {"field": "c", "new_size": 2**31 - 1}],
        ),
        ((), []),
        (None, None),
        ("a", None),
        ([{"field": "a", "newSize": 1}, "b"], None),
        ([{"field": Code("a"), "newSize": 1}], None),
        ([{"field": "a", "newSize": 1.0}], None),
        ([{"field": "a", "newSize": False}], None),
        ([{"field": "a", "newSize": 2**31}], None),
        ([{"newSize": 1}], None),
    ],
    ids=repr,
)
def test_truncated_arrays_of_every_shape(truncated: Any, expected: Any) -> None:
    update = event(0, "update", None, updateDescription={"updatedFields": {}, "truncatedArrays": truncated})
    (row,) = rows(events_to_arrow([update]))
    assert row["truncated_arrays"] == expected
    assert row["updated_fields"] == "{}"


@pytest.mark.parametrize("value", ["shop.orders", 5, [], None])
def test_namespaces_that_are_not_documents_are_null(value: Any) -> None:
    (row,) = rows(events_to_arrow([event(0, "rename", ns=value, to=value)]))
    assert (row["database"], row["collection"], row["to_database"], row["to_collection"]) == (None,) * 4


EVERY_BSON_TYPE = {
    "_id": ObjectId("65f000000000000000000002"),
    "string": 'héllo\n"quoted"',
    "int32": -7,
    "int64": Int64(2**40),
    "small_int64": Int64(3),
    "double": 2.5,
    "integral_double": 3.0,
    "nan": float("nan"),
    "decimal": Decimal128("-12.3400"),
    "decimal_special": Decimal128("-Infinity"),
    "bool": True,
    "null": None,
    "date": dt.datetime(2024, 2, 29, 23, 59, 59, 999000),
    "before_epoch": dt.datetime(1969, 7, 20, 20, 17, 40),
    "aware_date": dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    "timestamp": Timestamp(T0, 9),
    "binary": Binary(b"\x00\xff", 0),
    "binary_subtype": Binary(b"\x01\x02\x03", 128),
    "uuid_binary": Binary(uuid.UUID(int=1).bytes, 4),
    "regex": Regex("^ab+c$", re.IGNORECASE | re.MULTILINE),
    "min": MinKey(),
    "max": MaxKey(),
    "code": Code("function () { return 1; }"),
    "nested": {"a": {"b": [1, {"c": Int64(2)}]}},
    "array": [1, "two", 3.0, None, [Decimal128("4")]],
    "empty_doc": {},
    "empty_array": [],
    "son": SON([("z", 1), ("a", 2)]),
}


@pytest.mark.parametrize("mode", list(JsonMode))
def test_extended_json_documents_are_exact(mode: JsonMode) -> None:
    result = rows(events_to_arrow([event(0, "insert", EVERY_BSON_TYPE)], json_mode=mode))
    text = result[0]["full_document"]
    assert text == json_util.dumps(
        EVERY_BSON_TYPE, json_options=JSON_OPTIONS[mode], separators=(",", ":"), ensure_ascii=False
    )
    if mode is JsonMode.CANONICAL:
        back = json_util.loads(text, json_options=json_util.CANONICAL_JSON_OPTIONS)
        assert json_util.dumps(back, json_options=JSON_OPTIONS[mode]) == json_util.dumps(
            EVERY_BSON_TYPE, json_options=JSON_OPTIONS[mode]
        )


def test_change_event_objects_and_empty_batches() -> None:
    events = [event(0, "insert", {"_id": 1}), event(1, "delete")]
    from_raw = events_to_arrow(events).table
    from_objects = events_to_arrow([ChangeEvent(e) for e in events]).table
    assert from_raw.equals(from_objects)
    empty = events_to_arrow([], schema=Line)
    assert empty.table.num_rows == 0
    assert empty.table.schema.names == [*EVENT_COLUMNS, CORRUPT_RECORD_COLUMN]


def test_an_event_without_a_resume_token_is_refused() -> None:
    broken = event(1, "insert", {"_id": 1})
    del broken["_id"]
    with pytest.raises(InvalidTokenError, match="event 1 of the batch has no resume token"):
        events_to_arrow([event(0, "insert", {"_id": 1}), broken])


# ----------------------------------------------------------------------------------------------
# Typed documents: what fits each column type


class Line(BaseModel):
    sku: str
    qty: int


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def one_field(annotation: Any, **field: Any) -> type[BaseModel]:
    namespace: dict[str, Any] = {"__annotations__": {"v": annotation | None}}
    if field:
        namespace["v"] = Field(default=None, **field)
    else:
        namespace["v"] = None
    model = type("One", (BaseModel,), {**namespace, "model_config": {"arbitrary_types_allowed": True}})
    return model


FITS: list[tuple[Any, dict[str, Any], Any, Any]] = [
    # annotation, Field kwargs, BSON value, value in the Arrow column
    (str, {}, "text", "text"),
    (str, {}, ObjectId("65f000000000000000000003"), "65f000000000000000000003"),
    (ObjectIdStr, {}, ObjectId("65f000000000000000000004"), "65f000000000000000000004"),
    (int, {}, 5, 5),
    (int, {}, Int64(2**40), 2**40),
    (int, {}, 3.0, 3),
    (int, {}, -(2**63), -(2**63)),
    (float, {}, 1.25, 1.25),
    (float, {}, 7, 7.0),
    (float, {}, Int64(2**53), float(2**53)),
    (bool, {}, False, False),
    (
        dt.datetime,
        {},
        dt.datetime(2024, 5, 1, 12, 0, 0, 123000),
        dt.datetime(2024, 5, 1, 12, 0, 0, 123000, UTC),
    ),
    (
        dt.datetime,
        {},
        dt.datetime(2024, 5, 1, 14, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(2024, 5, 1, 12, tzinfo=UTC),
    ),
    (dt.date, {}, dt.datetime(2024, 5, 1), dt.date(2024, 5, 1)),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal128("12.5"), Decimal("12.50")),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal128("-0.00"), Decimal("0.00")),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal128("1E+3"), Decimal("1000.00")),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal128("1.2300"), Decimal("1.23")),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, 12, Decimal("12.00")),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, 0.1, Decimal("0.10")),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal("99999999.99"), Decimal("99999999.99")),
    (Decimal, {}, Decimal128("1234567890.123456789012345678"), Decimal("1234567890.123456789012345678")),
    (bytes, {}, Binary(b"\x00\x01", 5), b"\x00\x01"),
    (bytes, {}, b"raw", b"raw"),
    (uuid.UUID, {}, uuid.UUID(int=7), str(uuid.UUID(int=7))),
    (uuid.UUID, {}, Binary(uuid.UUID(int=8).bytes, 4), str(uuid.UUID(int=8))),
    (Any, {}, {"a": Int64(1)}, '{"a":{"$numberLong":"1"}}'),
    (Color, {}, "red", "red"),
    (list[int], {}, [1, 2.0, Int64(3)], [1, 2, 3]),
    (dict[str, int], {}, {"a": 1, "b": Int64(2)}, [("a", 1), ("b", 2)]),
    (Line, {}, {"sku": "x", "qty": 1, "ignored": True}, {"sku": "x", "qty": 1}),
]

MISFITS: list[tuple[Any, dict[str, Any], Any, str]] = [
    (str, {}, 5, "expected string, got int 5"),
    (str, {}, Code("x"), "expected string, got Code"),
    (str, {}, b"bytes", "expected string, got bytes"),
    (int, {}, 3.5, "expected bigint, got float 3.5"),
    (int, {}, True, "expected bigint, got bool True"),
    (int, {}, "5", "expected bigint, got str '5'"),
    (int, {}, Decimal128("5"), "expected bigint, got Decimal128"),
    (int, {}, 2**63, "out of the bigint range"),
    (float, {}, 2**53 + 1, "has no exact double value"),
    (float, {}, Decimal128("1.5"), "expected double, got Decimal128"),
    (bool, {}, 1, "expected boolean, got int 1"),
    (dt.datetime, {}, "2024-05-01", "expected a datetime, got str"),
    (dt.datetime, {}, Timestamp(T0, 1), "expected a datetime, got Timestamp"),
    (dt.date, {}, dt.datetime(2024, 5, 1, 10), "a time of day"),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal128("1.234"), "more than 2 decimal places"),
    (
        Decimal,
        {"max_digits": 10, "decimal_places": 2},
        Decimal128("123456789.5"),
        "more than 8 integer digits",
    ),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, Decimal128("NaN"), "has no decimal(10,2) value"),
    (Decimal, {"max_digits": 10, "decimal_places": 2}, "1.5", "expected decimal(10,2), got str"),
    (bytes, {}, "text", "expected binary, got str"),
    (uuid.UUID, {}, "not a uuid", "expected a UUID"),
    (Color, {}, "green", "'green' is not one of"),
    (list[int], {}, "1,2", "expected an array, got str"),
    (list[int], {}, [1, "2"], "expected bigint, got str '2'"),
    (dict[str, int], {}, {"a": "x"}, "expected bigint, got str 'x'"),
    (Line, {}, {"sku": "x"}, "required field is missing"),
    (Line, {}, {"sku": None, "qty": 1}, "null in a required field"),
    (Line, {}, [1], "expected a document, got list"),
]


@pytest.mark.parametrize(("annotation", "field", "value", "expected"), FITS)
def test_values_that_fit(annotation: Any, field: dict[str, Any], value: Any, expected: Any) -> None:
    model = one_field(annotation, **field)
    batch = events_to_arrow([event(0, "insert", {"v": value}), event(1, "insert", {"v": None})], schema=model)
    assert batch.malformed == ()
    result = rows(batch)
    assert result[0]["full_document"] == {"v": expected}
    assert result[1]["full_document"] == {"v": None}
    assert result[0][CORRUPT_RECORD_COLUMN] is None


@pytest.mark.parametrize(("annotation", "field", "value", "reason"), MISFITS)
def test_values_that_do_not_fit(annotation: Any, field: dict[str, Any], value: Any, reason: str) -> None:
    model = one_field(annotation, **field)
    doc = {"_id": 1, "v": value}
    batch = events_to_arrow(
        [event(0, "insert", {}), event(1, "insert", doc)],
        schema=model,
    )
    assert [(m.index, m.token) for m in batch.malformed] == [(1, token(1))]
    assert reason in batch.malformed[0].error
    assert batch.malformed[0].field.startswith("full_document.v")
    result = rows(batch)
    assert result[1][CORRUPT_RECORD_COLUMN] == dumps(doc)
    assert result[0][CORRUPT_RECORD_COLUMN] is None


def test_misfits_deep_in_arrays_are_reported_for_their_event() -> None:
    class Order(BaseModel):
        lines: list[Line]

    events = [
        event(0, "insert", {"lines": [{"sku": "a", "qty": 1}]}),
        event(1, "insert", {"lines": []}),
        event(2, "insert", {"lines": [{"sku": "b", "qty": 1}, {"sku": "c", "qty": "many"}]}),
        event(3, "insert", {"lines": [{"sku": "d", "qty": 4}]}),
    ]
    batch = events_to_arrow(events, schema=Order)
    assert [(m.index, m.field) for m in batch.malformed] == [(2, "full_document.lines[].qty")]
    result = rows(batch)
    assert result[2]["full_document"] == {"lines": [{"sku": "b", "qty": 1}, {"sku": "c", "qty": None}]}
    assert result[3]["full_document"] == {"lines": [{"sku": "d", "qty": 4}]}
    assert result[1]["full_document"] == {"lines": []}


def test_missing_and_null_fields_defaults_and_differing_types() -> None:
    class Doc(BaseModel):
        qty: int
        note: str | None
        status: str = "new"
        tags: list[str] = Field(default_factory=lambda: ["fresh"])
        color: Color = Color.BLUE

    events = [
        event(0, "insert", {"qty": 1, "note": "x", "status": "paid", "tags": [], "color": "red"}),
        event(1, "insert", {"qty": 2.0}),  # integral double fits bigint; defaults fill the rest
        event(2, "insert", {"qty": Int64(3), "note": None}),
        event(3, "insert", {"qty": "four"}),
        event(4, "delete"),
        event(5, "insert", {"note": "no qty"}),
    ]
    batch = events_to_arrow(events, schema=Doc)
    assert [(m.index, m.error) for m in batch.malformed] == [
        (3, "expected bigint, got str 'four'"),
        (5, "required field is missing"),
    ]
    docs = [r["full_document"] for r in rows(batch)]
    assert docs[0] == {"qty": 1, "note": "x", "status": "paid", "tags": [], "color": "red"}
    assert docs[1] == {"qty": 2, "note": None, "status": "new", "tags": ["fresh"], "color": "blue"}
    assert docs[2] == {"qty": 3, "note": None, "status": "new", "tags": ["fresh"], "color": "blue"}
    assert docs[3]["qty"] is None and docs[3]["status"] == "new"
    assert docs[4] is None
    assert docs[5]["qty"] is None


def test_a_document_that_is_not_a_document() -> None:
    batch = events_to_arrow(
        [event(0, "insert", {"sku": "a", "qty": 1}), event(1, "insert", "text")], schema=Line
    )
    assert [(m.index, m.field) for m in batch.malformed] == [(1, "full_document")]
    assert rows(batch)[1]["full_document"] is None
    assert rows(batch)[1][CORRUPT_RECORD_COLUMN] == '"text"'


def test_struct_type_schema_with_spark_types() -> None:
    schema = StructType(
        [
            StructField("sku", StringType(), nullable=False),
            StructField("qty", IntegerType()),
            StructField("price", DecimalType(6, 2)),
            StructField("ratio", DoubleType()),
            StructField("day", DateType()),
            StructField("sizes", ArrayType(LongType(), containsNull=False)),
        ]
    )
    events = [
        event(
            0, "insert", {"sku": "a", "qty": 1, "price": Decimal128("1.5"), "day": dt.datetime(2024, 1, 2)}
        ),
        event(1, "insert", {"sku": "b", "qty": 2**31}),
        event(2, "insert", {"qty": 3}),
        event(3, "insert", {"sku": "c", "sizes": [1, None]}),
        event(4, "insert", {"sku": "d", "sizes": [1, 2], "ratio": 1}),
    ]
    batch = events_to_arrow(events, schema=schema)
    assert [(m.index, m.field) for m in batch.malformed] == [
        (1, "full_document.qty"),
        (2, "full_document.sku"),
        (3, "full_document.sizes[]"),
    ]
    docs = [r["full_document"] for r in rows(batch)]
    assert docs[0] == {
        "sku": "a",
        "qty": 1,
        "price": Decimal("1.50"),
        "ratio": None,
        "day": dt.date(2024, 1, 2),
        "sizes": None,
    }
    assert docs[4]["sizes"] == [1, 2] and docs[4]["ratio"] == 1.0


# ----------------------------------------------------------------------------------------------
# Schema modes


MIXED = [
    event(0, "insert", {"sku": "a", "qty": 1}),
    event(1, "insert", {"sku": "b", "qty": "two"}),
    event(2, "update", {"sku": "c", "qty": 3}, fullDocumentBeforeChange={"sku": "c", "qty": 3.5}),
    event(3, "delete"),
    event(4, "insert", {"sku": "e", "qty": 5}),
]


def test_permissive_keeps_every_row_with_nulls_and_the_corrupt_record() -> None:
    batch = events_to_arrow(MIXED, schema=Line, mode="permissive")
    result = rows(batch)
    assert [r["_id"] for r in result] == [token(i)["_data"] for i in range(5)]
    assert [(m.index, m.field) for m in batch.malformed] == [
        (1, "full_document.qty"),
        (2, "full_document_before_change.qty"),
    ]
    assert result[1]["full_document"] == {"sku": "b", "qty": None}
    assert result[1][CORRUPT_RECORD_COLUMN] == '{"sku":"b","qty":"two"}'
    assert result[2]["full_document"] == {"sku": "c", "qty": 3}
    assert result[2]["full_document_before_change"] == {"sku": "c", "qty": None}
    assert result[2][CORRUPT_RECORD_COLUMN] == '{"sku":"c","qty":{"$numberDouble":"3.5"}}'
    assert [r[CORRUPT_RECORD_COLUMN] is None for r in result] == [True, False, False, True, True]


def test_dropmalformed_leaves_them_out_in_order() -> None:
    batch = events_to_arrow(MIXED, schema=Line, mode=SchemaMode.DROPMALFORMED)
    assert [r["_id"] for r in rows(batch)] == [token(i)["_data"] for i in (0, 3, 4)]
    assert [m.index for m in batch.malformed] == [1, 2]
    assert CORRUPT_RECORD_COLUMN not in batch.table.schema.names


def test_failfast_names_the_field_and_the_token_of_the_first_misfit() -> None:
    with pytest.raises(SchemaMismatchError) as caught:
        events_to_arrow(list(reversed(MIXED)), schema=Line, mode="FAILFAST")
    error = caught.value
    assert error.index == 2 and error.token == token(2)
    assert error.field == "full_document_before_change.qty"
    assert token(2)["_data"] in str(error) and "full_document_before_change.qty" in str(error)
    assert events_to_arrow(MIXED[:1], schema=Line, mode="FAILFAST").malformed == ()


# ----------------------------------------------------------------------------------------------
# Properties


class Sample(BaseModel):
    n: int | None = None
    name: str | None = None
    score: float | None = None


sample_values = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.booleans(),
    st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
)


def fits_int(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return value.is_integer() and -(2**63) <= value < 2**63
    return isinstance(value, int) and -(2**63) <= value < 2**63


def fits_float(value: Any) -> bool:
    if value is None or isinstance(value, float):
        return True
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    try:
        return float(value) == value
    except OverflowError:
        return False


@settings(max_examples=200, deadline=None)
@given(
    docs=st.lists(
        st.fixed_dictionaries(
            {}, optional={"n": sample_values, "name": sample_values, "score": sample_values}
        ),
        max_size=20,
    )
)
def test_typed_columns_keep_every_fitting_value_and_report_the_rest(docs: list[dict[str, Any]]) -> None:
    events = [event(i, "insert", doc) for i, doc in enumerate(docs)]
    batch = events_to_arrow(events, schema=Sample)
    bad = {m.index for m in batch.malformed}
    for i, (doc, row) in enumerate(zip(docs, rows(batch), strict=True)):
        fitting = (
            fits_int(doc.get("n"))
            and (doc.get("name") is None or type(doc["name"]) is str)
            and fits_float(doc.get("score"))
        )
        assert (i not in bad) == fitting
        got = row["full_document"]
        if fits_int(doc.get("n")):
            assert got["n"] == (None if doc.get("n") is None else int(doc["n"]))
        else:
            assert got["n"] is None
        if fits_float(doc.get("score")):
            assert got["score"] == (None if doc.get("score") is None else float(doc["score"]))


@pytest.mark.parametrize("mode", list(JsonMode))
def test_document_keys_are_the_encoders_text(mode: JsonMode) -> None:
    keys = [
        {"_id": ObjectId("65f000000000000000000009")},
        SON([("_id", ObjectId("65f00000000000000000000a"))]),
        {"_id": 5},
        {"_id": ObjectId("65f00000000000000000000b"), "shard": "eu"},
        {"_id": {"a": 1}},
    ]
    events = [event(i, "delete", None, documentKey=key) for i, key in enumerate(keys)]
    assert [r["document_key"] for r in rows(events_to_arrow(events, json_mode=mode))] == [
        dumps(key, mode) for key in keys
    ]
