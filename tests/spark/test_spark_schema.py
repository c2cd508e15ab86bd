"""Schemas: pydantic models and StructTypes to Spark and Arrow types, and the event columns."""

from __future__ import annotations

import datetime as dt
import enum
import subprocess
import sys
import textwrap
import uuid
from decimal import Decimal
from typing import Annotated, Any, Literal, Optional

import pyarrow as pa
import pytest
from bson import ObjectId
from pydantic import BaseModel, Field
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from flowwarden.errors import ConfigurationError
from flowwarden.spark import (
    CORRUPT_RECORD_COLUMN,
    EVENT_COLUMNS,
    ObjectIdStr,
    change_event_arrow_schema,
    change_event_struct_type,
    model_to_arrow_schema,
    model_to_struct_type,
    struct_type_to_arrow_schema,
)
from flowwarden.spark.schema import Kind, change_event_ddl, document_spec


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    city: str
    zip: str | None = None


class Line(BaseModel):
    sku: str
    qty: int
    price: Annotated[Decimal, Field(max_digits=9, decimal_places=2)]


class Order(BaseModel):
    id: ObjectIdStr = Field(alias="_id")
    customer: str
    placed: dt.datetime
    due: dt.date | None = None
    total: Decimal
    exact: Decimal = Field(max_digits=12, decimal_places=3)
    weight: float
    count: int
    paid: bool
    blob: bytes | None = None
    ref: uuid.UUID | None = None
    color: Color
    priority: Priority = Priority.LOW
    channel: Literal["web", "shop"] = "web"
    address: Address
    lines: list[Line]
    tags: set[str] = set()
    ratings: tuple[float, ...] = ()
    attributes: dict[str, int] = {}
    extra: Any = None
    raw: dict = {}  # type: ignore[type-arg]
    maybe: Optional[int] = None  # noqa: UP045
    parent: ObjectId | None = None

    model_config = {"arbitrary_types_allowed": True}


EXPECTED_ORDER = StructType(
    [
        StructField("id", StringType()),
        StructField("customer", StringType()),
        StructField("placed", TimestampType()),
        StructField("due", DateType()),
        StructField("total", DecimalType(38, 18)),
        StructField("exact", DecimalType(12, 3)),
        StructField("weight", DoubleType()),
        StructField("count", LongType()),
        StructField("paid", BooleanType()),
        StructField("blob", BinaryType()),
        StructField("ref", StringType()),
        StructField("color", StringType()),
        StructField("priority", LongType()),
        StructField("channel", StringType()),
        StructField(
            "address", StructType([StructField("city", StringType()), StructField("zip", StringType())])
        ),
        StructField(
            "lines",
            ArrayType(
                StructType(
                    [
                        StructField("sku", StringType()),
                        StructField("qty", LongType()),
                        StructField("price", DecimalType(9, 2)),
                    ]
                )
            ),
        ),
        StructField("tags", ArrayType(StringType())),
        StructField("ratings", ArrayType(DoubleType())),
        StructField("attributes", MapType(StringType(), LongType())),
        StructField("extra", StringType()),
        StructField("raw", StringType()),
        StructField("maybe", LongType()),
        StructField("parent", StringType()),
    ]
)


def test_model_to_struct_type() -> None:
    assert model_to_struct_type(Order) == EXPECTED_ORDER


def test_model_fields_read_their_alias_and_keep_their_rules() -> None:
    spec = document_spec(Order)
    fields = {f.name: f for f in spec.fields}
    assert fields["id"].key == "_id"
    assert not fields["customer"].none_ok and not fields["customer"].has_default
    assert fields["due"].none_ok
    assert fields["priority"].default == 1 and not fields["priority"].none_ok
    assert fields["color"].value.choices == frozenset({"red", "blue"})
    assert fields["channel"].value.choices == frozenset({"web", "shop"})
    assert fields["extra"].value.kind is Kind.JSON
    assert fields["lines"].value.element_nullable is False
    assert fields["tags"].default == []


def test_arrow_schema_is_what_spark_uses() -> None:
    """flowwarden's Arrow types equal Spark's own to_arrow_schema of the same StructType."""
    ours = model_to_arrow_schema(Order)
    sparks = to_arrow_schema(EXPECTED_ORDER, timezone="UTC")
    assert ours.equals(sparks)
    assert struct_type_to_arrow_schema(EXPECTED_ORDER).equals(sparks)


def test_struct_type_round_trip_and_nullability() -> None:
    struct = StructType(
        [
            StructField("a", ByteType(), nullable=False),
            StructField("b", ShortType()),
            StructField("c", IntegerType()),
            StructField("d", FloatType()),
            StructField("e", TimestampNTZType()),
            StructField("f", ArrayType(StringType(), containsNull=False)),
            StructField("g", MapType(StringType(), DoubleType(), valueContainsNull=False)),
        ]
    )
    spec = document_spec(struct)
    assert [f.value.kind for f in spec.fields] == [
        Kind.INT8,
        Kind.INT16,
        Kind.INT32,
        Kind.FLOAT,
        Kind.TIMESTAMP_NTZ,
        Kind.LIST,
        Kind.MAP,
    ]
    assert [f.none_ok for f in spec.fields] == [False, True, True, True, True, True, True]
    assert spec.fields[5].value.element_nullable is False
    # Every output field is nullable: PERMISSIVE writes null where a value does not fit.
    arrow = struct_type_to_arrow_schema(struct)
    assert all(field.nullable for field in arrow)
    assert arrow.field("f").type.value_field.nullable


def test_arrow_schema_as_document_schema() -> None:
    schema = pa.schema([("sku", pa.string()), ("qty", pa.int32()), ("when", pa.timestamp("us", tz="UTC"))])
    spec = document_spec(schema)
    assert [(f.name, f.value.kind) for f in spec.fields] == [
        ("sku", Kind.STRING),
        ("qty", Kind.INT32),
        ("when", Kind.TIMESTAMP),
    ]


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Fixed(BaseModel):
    pair: tuple[int, str]


class IntKeys(BaseModel):
    counts: dict[int, int]


class Either(BaseModel):
    value: int | str


class Clock(BaseModel):
    at: dt.time


class TooWide(BaseModel):
    amount: Decimal = Field(max_digits=40, decimal_places=2)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (Node, "contains itself (Node -> Node)"),
        (Fixed, "fixed-length"),
        (IntKeys, "non-string keys"),
        (Either, "union of several types"),
        (Clock, "has no Spark column type"),
        (TooWide, "decimal(40,2) is not a Spark decimal"),
    ],
)
def test_models_without_an_exact_column_type_are_refused(model: type[BaseModel], message: str) -> None:
    with pytest.raises(ConfigurationError, match="schema") as caught:
        model_to_struct_type(model)
    assert message in str(caught.value)


def test_a_model_naming_an_undefined_type_says_so() -> None:
    class Later(BaseModel):
        thing: Undefined  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(ConfigurationError, match="not fully defined"):
        model_to_struct_type(Later)


def test_not_a_schema() -> None:
    with pytest.raises(ConfigurationError, match="pydantic BaseModel subclass"):
        document_spec({"name": "string"})


def test_object_id_str_validates_object_ids() -> None:
    class Doc(BaseModel):
        id: ObjectIdStr = Field(alias="_id")

    oid = ObjectId()
    assert Doc.model_validate({"_id": oid}).id == str(oid)
    assert Doc.model_validate({"_id": str(oid)}).id == str(oid)


def test_change_event_columns() -> None:
    untyped = change_event_struct_type()
    assert untyped.fieldNames() == list(EVENT_COLUMNS)
    assert untyped["full_document"].dataType == StringType()
    assert untyped["cluster_time"].dataType == TimestampType()
    assert untyped["cluster_time_increment"].dataType == LongType()  # an unsigned 32-bit number
    assert untyped["to_database"].dataType == untyped["to_collection"].dataType == StringType()
    assert untyped["removed_fields"].dataType == ArrayType(StringType())
    assert untyped["truncated_arrays"].dataType == ArrayType(
        StructType([StructField("field", StringType()), StructField("new_size", IntegerType())])
    )

    typed = change_event_struct_type(Address)
    assert typed.fieldNames() == [*EVENT_COLUMNS, CORRUPT_RECORD_COLUMN]
    assert typed["full_document"].dataType == model_to_struct_type(Address)
    assert typed["full_document_before_change"].dataType == model_to_struct_type(Address)
    assert change_event_struct_type(Address, mode="DROPMALFORMED").fieldNames() == list(EVENT_COLUMNS)
    assert change_event_struct_type(Address, mode="failfast").fieldNames() == list(EVENT_COLUMNS)

    assert change_event_arrow_schema(Address).equals(to_arrow_schema(typed, timezone="UTC"))
    assert change_event_arrow_schema().equals(to_arrow_schema(untyped, timezone="UTC"))


@pytest.mark.spark
def test_the_ddl_of_the_change_event_columns_is_their_struct_type(spark: Any) -> None:
    def parsed(ddl: str) -> Any:
        return spark.createDataFrame([], ddl).schema

    assert parsed(change_event_ddl()) == change_event_struct_type()
    document = "sku STRING, `odd``name` DECIMAL(10,2), lines ARRAY<STRUCT<n: BIGINT>>, m MAP<STRING, DATE>"
    typed = change_event_ddl(document, corrupt_record=True)
    assert parsed(typed) == change_event_struct_type(parsed(document))
    assert parsed(change_event_ddl(document)).fieldNames() == list(EVENT_COLUMNS)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_importing_flowwarden_spark_imports_neither_pyspark_nor_pyarrow() -> None:
    result = run_python(
        """
        import sys
        import flowwarden, flowwarden.spark, flowwarden.spark.schema, flowwarden.spark.convert.extjson
        from flowwarden.spark import ObjectIdStr, register
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "pyarrow"))
        print(loaded)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("blocked", "use"),
    [
        ("pyarrow", "from flowwarden.spark import events_to_arrow"),
        ("pyspark", "from flowwarden.spark import get_or_create_session; get_or_create_session()"),
        ("pyspark", "from flowwarden.spark import change_event_struct_type; change_event_struct_type()"),
    ],
)
def test_a_missing_extra_names_the_pip_command(blocked: str, use: str) -> None:
    result = run_python(
        f"""
        import sys
        for name in list(sys.modules):
            if name.split(".")[0] == {blocked!r}:
                del sys.modules[name]
        sys.modules[{blocked!r}] = None  # makes every import of it fail
        from flowwarden.errors import MissingDependencyError
        try:
            {use}
        except MissingDependencyError as error:
            print("package", error.package, "extra", error.extra)
            print(error)
        """
    )
    assert result.returncode == 0, result.stderr
    extra = "arrow" if blocked == "pyarrow" else "spark"  # a cluster's PySpark: pyarrow alone
    assert f"package {blocked} extra {extra}" in result.stdout
    assert f'pip install "flowwarden[{extra}]"' in result.stdout
