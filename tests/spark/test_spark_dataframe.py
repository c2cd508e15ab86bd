"""events_to_dataframe: Spark receives exactly the Arrow table, and reads every column right."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pydantic import BaseModel, Field
from pyspark.sql import SparkSession

from flowwarden.errors import ConfigurationError, SchemaMismatchError
from flowwarden.spark import (
    CORRUPT_RECORD_COLUMN,
    EVENT_COLUMNS,
    ObjectIdStr,
    change_event_struct_type,
    events_to_arrow,
    events_to_dataframe,
)

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc
T0 = 1_700_000_000


def token(i: int) -> dict[str, str]:
    return {"_data": f"82{T0 + i:08X}{1:08X}2B042C0100296E5A1004{i:032X}04"}


def event(i: int, op: str, doc: Any = None, **fields: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "_id": token(i),
        "operationType": op,
        "clusterTime": Timestamp(T0 + i, 1),
        "wallTime": dt.datetime(2023, 11, 14, 22, 13, 20, 500000) + dt.timedelta(seconds=i),
        "ns": {"db": "shop", "coll": "orders"},
    }
    if doc is not None:
        raw["fullDocument"] = doc
        raw["documentKey"] = {"_id": doc["_id"]}
    raw.update(fields)
    return raw


class Line(BaseModel):
    sku: str
    qty: int
    price: Decimal = Field(max_digits=9, decimal_places=2)


class Order(BaseModel):
    id: ObjectIdStr = Field(alias="_id")
    customer: str
    placed: dt.datetime
    day: dt.date | None = None
    total: Decimal = Field(max_digits=12, decimal_places=2)
    big: int
    ratio: float
    paid: bool
    blob: bytes | None = None
    ref: uuid.UUID | None = None
    lines: list[Line]
    attributes: dict[str, str] = {}
    extra: Any = None


OID = ObjectId("65f000000000000000000001")
ORDER = {
    "_id": OID,
    "customer": "ada",
    "placed": dt.datetime(2024, 5, 1, 12, 30, 0, 250000),
    "day": dt.datetime(2024, 5, 2),
    "total": Decimal128("12.50"),
    "big": Int64(2**40),
    "ratio": 0.25,
    "paid": True,
    "blob": Binary(b"\x00\x01", 0),
    "ref": Binary(uuid.UUID(int=5).bytes, 4),
    "lines": [{"sku": "a", "qty": 1, "price": Decimal128("2.5")}, {"sku": "b", "qty": 2, "price": 5}],
    "attributes": {"gift": "yes"},
    "extra": {"n": Int64(1)},
}
EVENTS = [
    event(0, "insert", ORDER),
    event(
        1,
        "update",
        {**ORDER, "paid": False},
        updateDescription={
            "updatedFields": {"paid": False},
            "removedFields": ["note"],
            "truncatedArrays": [{"field": "lines", "newSize": 1}],
        },
        fullDocumentBeforeChange=ORDER,
        clusterTime=Timestamp(T0 + 1, 2**32 - 1),
    ),
    event(2, "replace", {**ORDER, "customer": "bob"}),
    event(3, "delete", None, documentKey={"_id": OID}),
    event(4, "drop"),
    event(5, "rename", None, to={"db": "shop", "coll": "orders_old"}),
    event(6, "invalidate", ns=None),
]


@pytest.mark.parametrize("schema", [None, Order], ids=["extended-json", "pydantic"])
def test_spark_holds_exactly_the_arrow_table(spark: SparkSession, schema: Any) -> None:
    df, malformed = events_to_dataframe(spark, EVENTS, schema=schema)
    assert malformed == ()
    assert df.schema == change_event_struct_type(schema)
    assert df.toArrow().to_pylist() == events_to_arrow(EVENTS, schema=schema).table.to_pylist()


def test_spark_reads_the_typed_columns(spark: SparkSession) -> None:
    df = events_to_dataframe(spark, EVENTS, schema=Order).dataframe
    row = df.selectExpr(
        "_id",
        "operation_type",
        "unix_seconds(cluster_time) AS cluster_seconds",
        "unix_micros(wall_time) AS wall_micros",
        "full_document.id AS id",
        "unix_micros(full_document.placed) AS placed_micros",
        "full_document.day AS day",
        "full_document.total + 1 AS total_plus_one",
        "full_document.big AS big",
        "full_document.lines[1].price * full_document.lines[1].qty AS line_value",
        "full_document.attributes['gift'] AS gift",
        "full_document.ref AS ref",
        "full_document.extra AS extra",
        "hex(full_document.blob) AS blob",
    ).first()
    assert row is not None
    assert row["_id"] == token(0)["_data"]
    assert row["cluster_seconds"] == T0
    assert row["wall_micros"] == int(
        dt.datetime(2023, 11, 14, 22, 13, 20, 500000, UTC).timestamp() * 1_000_000
    )
    assert row["id"] == str(OID)
    assert row["placed_micros"] == int(
        dt.datetime(2024, 5, 1, 12, 30, 0, 250000, UTC).timestamp() * 1_000_000
    )
    assert row["day"] == dt.date(2024, 5, 2)
    assert row["total_plus_one"] == Decimal("13.50")
    assert row["big"] == 2**40
    assert row["line_value"] == Decimal("10.00")
    assert row["gift"] == "yes"
    assert row["ref"] == str(uuid.UUID(int=5))
    assert row["extra"] == '{"n":{"$numberLong":"1"}}'
    assert row["blob"] == "0001"

    counts = {
        r["operation_type"]: r["n"]
        for r in df.groupBy("operation_type").count().withColumnRenamed("count", "n").collect()
    }
    assert counts == {
        "insert": 1,
        "update": 1,
        "replace": 1,
        "delete": 1,
        "drop": 1,
        "rename": 1,
        "invalidate": 1,
    }
    update = (
        df.where("operation_type = 'update'")
        .selectExpr(
            "full_document.paid",
            "full_document_before_change.paid",
            "updated_fields",
            "removed_fields",
            "truncated_arrays[0].field",
            "truncated_arrays[0].new_size + 1",
            "cluster_time_increment",
        )
        .first()
    )
    assert update is not None
    assert tuple(update) == (False, True, '{"paid":false}', ["note"], "lines", 2, 2**32 - 1)
    rename = (
        df.where("operation_type = 'rename'").select("collection", "to_database", "to_collection").first()
    )
    assert rename is not None and tuple(rename) == ("orders", "shop", "orders_old")


def test_relaxed_json_is_queryable_with_spark_json_functions(spark: SparkSession) -> None:
    df = events_to_dataframe(spark, EVENTS[:1], json_mode="relaxed").dataframe
    row = df.selectExpr(
        "get_json_object(full_document, '$.customer') AS customer",
        "get_json_object(full_document, '$.lines[1].qty') AS qty",
        "get_json_object(document_key, '$._id.$oid') AS oid",
    ).first()
    assert row is not None
    assert tuple(row) == ("ada", "2", str(OID))


def test_ddl_schema(spark: SparkSession) -> None:
    df, malformed = events_to_dataframe(
        spark,
        [
            event(0, "insert", {"_id": 1, "customer": "ada", "lines": [{"sku": "a", "qty": 2}]}),
            event(1, "insert", {"_id": 2, "customer": 7}),
        ],
        schema="customer STRING, lines ARRAY<STRUCT<sku: STRING, qty: INT>>",
    )
    assert [m.index for m in malformed] == [1]
    rows = df.selectExpr(
        "full_document.customer", "full_document.lines[0].qty AS qty", CORRUPT_RECORD_COLUMN
    ).collect()
    assert [tuple(r) for r in rows] == [
        ("ada", 2, None),
        (None, None, '{"_id":{"$numberInt":"2"},"customer":{"$numberInt":"7"}}'),
    ]


@pytest.mark.parametrize("ddl", ["customer STRING,,", "INT"])
def test_bad_ddl_schema(spark: SparkSession, ddl: str) -> None:
    with pytest.raises(ConfigurationError, match="DDL schema"):
        events_to_dataframe(spark, EVENTS, schema=ddl)


def test_schema_modes(spark: SparkSession) -> None:
    class Small(BaseModel):
        customer: str
        big: int

    events = [
        event(0, "insert", {"_id": 1, "customer": "a", "big": 1}),
        event(1, "insert", {"_id": 2, "customer": "b", "big": "x"}),
    ]
    permissive, bad = events_to_dataframe(spark, events, schema=Small)
    assert permissive.columns == [*EVENT_COLUMNS, CORRUPT_RECORD_COLUMN]
    assert [
        tuple(r) for r in permissive.selectExpr("full_document.big", CORRUPT_RECORD_COLUMN).collect()
    ] == [
        (1, None),
        (None, '{"_id":{"$numberInt":"2"},"customer":"b","big":"x"}'),
    ]
    dropped, bad_dropped = events_to_dataframe(spark, events, schema=Small, mode="DROPMALFORMED")
    assert dropped.columns == list(EVENT_COLUMNS)
    assert [r["_id"] for r in dropped.select("_id").collect()] == [token(0)["_data"]]
    assert bad == bad_dropped and [m.index for m in bad] == [1]
    with pytest.raises(SchemaMismatchError, match=r"full_document\.big"):
        events_to_dataframe(spark, events, schema=Small, mode="FAILFAST")


def test_an_empty_batch_has_the_same_columns(spark: SparkSession) -> None:
    df, malformed = events_to_dataframe(spark, [], schema=Order)
    assert malformed == ()
    assert df.count() == 0
    assert df.schema == change_event_struct_type(Order)
