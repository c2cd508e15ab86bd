"""Schema inference: the MongoDB Spark connector's typing and widening rules, hints laid over
them, Extended JSON positions kept through a StructType, and the sample drawn by ``$sample``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pymongo
import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Regex, Timestamp
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from flowwarden.errors import ConfigurationError
from flowwarden.spark import infer_schema
from flowwarden.spark.convert.spec_compiler import EXTENDED_JSON_METADATA, document_spec
from flowwarden.spark.convert.valuespec import Kind
from flowwarden.spark.hints import parse_hints
from flowwarden.spark.infer import MAP_MINIMUM_KEYS, document_ddl, spec_of_documents


def ddl(*documents: dict[str, Any], hints: Any = None) -> str:
    return document_ddl(spec_of_documents(documents, hints))


def test_each_bson_type_has_the_connectors_type() -> None:
    document = {
        "oid": ObjectId(),
        "s": "x",
        "i": 1,
        "big": 2**40,
        "l": Int64(1),
        "d": 1.5,
        "b": True,
        "at": dt.datetime(2024, 1, 1),
        "bin": Binary(b"\x00", 0),
        "dec": Decimal128("123.45"),
        "doc": {"z": 1, "a": "y"},
        "arr": [1, 2],
        "ts": Timestamp(1, 1),
        "re": Regex("a.*"),
    }
    assert ddl(document) == (
        "`arr` ARRAY<INT>, `at` TIMESTAMP, `b` BOOLEAN, `big` BIGINT, `bin` BINARY, `d` DOUBLE, "
        "`dec` DECIMAL(5,2), `doc` STRUCT<`a`: STRING, `z`: INT>, `i` INT, `l` BIGINT, `oid` STRING, "
        "`re` STRING, `s` STRING, `ts` STRING"
    )
    spec = spec_of_documents([document])
    kinds = {f.name: f.value.kind for f in spec.fields}
    assert kinds["ts"] is Kind.JSON and kinds["re"] is Kind.JSON and kinds["s"] is Kind.STRING


def test_numbers_widen_int_to_long_to_double() -> None:
    assert ddl({"n": 1}, {"n": Int64(2)}) == "`n` BIGINT"
    assert ddl({"n": 1}, {"n": 2.5}) == "`n` DOUBLE"
    assert ddl({"n": Int64(1)}, {"n": 2.5}, {"n": 3}) == "`n` DOUBLE"


def test_decimals_widen_to_hold_both() -> None:
    assert ddl({"n": Decimal128("1.5")}, {"n": Decimal128("12345.125")}) == "`n` DECIMAL(8,3)"
    assert ddl({"n": Decimal128("1.25")}, {"n": 7}) == "`n` DECIMAL(12,2)"
    assert ddl({"n": Decimal128("1E+37")}, {"n": Decimal128("0.5")}) == "`n` DOUBLE"


def test_conflicting_types_become_extended_json() -> None:
    spec = spec_of_documents([{"v": 1}, {"v": "one"}, {"w": [1, "a"]}, {"x": {"a": 1}}, {"x": 5}])
    kinds = {f.name: f.value for f in spec.fields}
    assert kinds["v"].kind is Kind.JSON
    assert kinds["w"].kind is Kind.LIST and kinds["w"].element.kind is Kind.JSON
    assert kinds["x"].kind is Kind.JSON


def test_nulls_and_empty_arrays_give_way_and_only_nulls_is_extended_json() -> None:
    assert ddl({"a": None, "e": []}, {"a": 3, "e": [1.5]}) == "`a` INT, `e` ARRAY<DOUBLE>"
    spec = spec_of_documents([{"a": None, "e": []}])
    assert [f.value.kind for f in spec.fields] == [Kind.JSON, Kind.LIST]
    assert spec.fields[1].value.element.kind is Kind.JSON


def test_structs_merge_field_by_field_and_many_keys_make_a_map() -> None:
    assert ddl({"d": {"b": 1}}, {"d": {"a": "x", "b": 2.0}}) == "`d` STRUCT<`a`: STRING, `b`: DOUBLE>"
    wide = {f"k{i}": i for i in range(MAP_MINIMUM_KEYS)}
    assert ddl({"m": wide}, {"m": {"other": 1.5}}) == "`m` MAP<STRING, DOUBLE>"
    # the documents themselves stay structs
    assert ddl(wide).count("INT") == MAP_MINIMUM_KEYS


def test_hints_override_nested_paths_and_add_fields() -> None:
    found = ddl(
        {"qty": 1, "addr": {"zip": 12345, "city": "x"}},
        hints="qty BIGINT, addr.zip STRING, `odd.name` DECIMAL(10,2), extra.tags: ARRAY<STRING>",
    )
    assert found == (
        "`addr` STRUCT<`city`: STRING, `zip`: STRING>, `qty` BIGINT, `odd.name` DECIMAL(10,2), "
        "`extra` STRUCT<`tags`: ARRAY<STRING>>"
    )
    struct_hints = StructType([StructField("qty", LongType())])
    assert ddl({"qty": 1}, hints=struct_hints) == "`qty` BIGINT"


@pytest.mark.parametrize(
    ("hints", "why"),
    [
        ("qty", "end too early"),
        ("qty WHATEVER", "is not a Spark type"),
        ("qty BIGINT NOT NULL", "NOT is not taken"),
        ("m MAP<INT, STRING>", "MAP<STRING"),
        ("qty BIGINT qty2", "expected ','"),
    ],
)
def test_bad_hints_name_the_problem(hints: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match="schema_hints") as error:
        parse_hints(hints)
    assert why in str(error.value)


def test_extended_json_positions_survive_the_struct_type() -> None:
    documents = [{"v": 1, "w": [1], "d": {"x": 1}}, {"v": "a", "w": ["a"], "d": {"x": "b"}}]
    spec = spec_of_documents(documents)
    struct = infer_schema_of(documents)
    fields = {f.name: f for f in struct.fields}
    assert fields["v"].metadata == {EXTENDED_JSON_METADATA: [""]}
    assert fields["w"].metadata == {EXTENDED_JSON_METADATA: ["[]"]}
    assert fields["w"].dataType == ArrayType(StringType(), True)
    assert document_spec(struct) == spec


def test_a_marker_on_a_non_string_is_refused() -> None:
    struct = StructType([StructField("n", LongType(), True, {EXTENDED_JSON_METADATA: [""]})])
    with pytest.raises(ConfigurationError, match="only string fields"):
        document_spec(struct)
    marker = {EXTENDED_JSON_METADATA: ["[]"]}
    mapped = StructType([StructField("m", MapType(StringType(), StringType()), True, marker)])
    with pytest.raises(ConfigurationError, match="does not have"):
        document_spec(mapped)


def infer_schema_of(documents: list[dict[str, Any]]) -> StructType:
    from flowwarden.spark.infer import spec_struct_type

    return spec_struct_type(spec_of_documents(documents))


def test_infer_schema_samples_the_collection(
    client: pymongo.MongoClient, mongodb_uri: str, db_name: str
) -> None:
    coll = client[db_name].orders
    coll.insert_many([{"_id": i, "qty": i, "price": Decimal128(f"{i}.5")} for i in range(30)])
    coll.insert_one({"_id": 99, "qty": 2.5, "note": "late"})
    schema = infer_schema(mongodb_uri, db_name, "orders", sample_size=1000, hints="note STRING")
    assert schema.simpleString() == "struct<_id:int,note:string,price:decimal(3,1),qty:double>"
    assert isinstance(schema["price"].dataType, DecimalType)
    # a client works as well as a URI; a sample of 1 sees one document's fields
    one = infer_schema(client, db_name, "orders", sample_size=1)
    assert {"_id", "qty"} <= set(one.fieldNames())


def test_sample_size_must_be_positive(mongodb_uri: str, db_name: str) -> None:
    with pytest.raises(ConfigurationError, match="sample_size"):
        infer_schema(mongodb_uri, db_name, "orders", sample_size=0)
