"""Schemas of change-event tables: Arrow and Spark types of the change-event columns.

Owns the public schema API: the change-event columns (:data:`EVENT_COLUMNS`,
:data:`CORRUPT_RECORD_COLUMN`), the Arrow and Spark types of a
:class:`~flowwarden.spark.convert.valuespec.ValueSpec` (:func:`arrow_type`, :func:`spark_type`), the
schemas of whole tables and DataFrames (:func:`change_event_arrow_schema`,
:func:`change_event_struct_type`, :func:`change_event_ddl`, :func:`model_to_struct_type` ...),
and :data:`ObjectIdStr` for pydantic models. The columns and their types are declared once,
here; every other list of them (the compiled converter's, the streaming source's) is derived
from this one or checked against it by a test. A full-document schema is first compiled into a
``ValueSpec`` tree (:func:`~flowwarden.spark.convert.spec_compiler.document_spec`, re-exported here
with the spec types); both the Arrow and the Spark types are derived from that one tree, so
the two can never disagree.

Rules that hold for every schema:

- Every Arrow/Spark field, array element and map value is nullable, whatever the schema says:
  in PERMISSIVE mode a value that does not fit is written as null. Whether a value may be null or
  missing is checked during conversion instead (``Optional`` / a default in a model,
  ``nullable`` in a StructType).
- Arrow types are exactly what Spark's own ``to_arrow_schema(..., timezone="UTC")`` produces
  (``timestamp[us, tz=UTC]``, list items named ``element``, map entries ``key``/``value``).

Nothing here runs per event. Importing this module imports none of pydantic, pyarrow and pyspark:
each function that needs one imports it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from bson.objectid import ObjectId

from flowwarden.config import SchemaMode
from flowwarden.spark._extra import require
from flowwarden.spark.convert.spec_compiler import document_spec
from flowwarden.spark.convert.valuespec import FieldSpec, Kind, ValueSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pydantic import BaseModel, GetCoreSchemaHandler
    from pydantic_core import CoreSchema
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "CORRUPT_RECORD_COLUMN",
    "EVENT_COLUMNS",
    "RESCUED_DATA_COLUMN",
    "FieldSpec",
    "Kind",
    "ObjectIdStr",
    "ValueSpec",
    "arrow_type",
    "change_event_arrow_schema",
    "change_event_ddl",
    "change_event_struct_type",
    "document_fields_ddl",
    "document_spec",
    "model_to_arrow_schema",
    "model_to_struct_type",
    "non_nullable_paths",
    "spark_type",
    "struct_type_to_arrow_schema",
]


def _objectid_to_str(value: Any) -> Any:
    return str(value) if isinstance(value, ObjectId) else value


class _ObjectIdText:
    """pydantic's validation of :data:`ObjectIdStr`: an ObjectId becomes its text before ``str``
    validates it, and the value serializes as ``str``. Declared through pydantic's custom-type
    hook so that importing this module (as a Spark worker does) does not import pydantic."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(
            _objectid_to_str,
            handler(str),
            serialization=core_schema.plain_serializer_function_ser_schema(
                str, return_schema=core_schema.str_schema()
            ),
        )


ObjectIdStr = Annotated[str, _ObjectIdText]
"""A pydantic field type for ObjectIds: validates a ``bson.ObjectId`` (or its 24-hex text) into
``str``, and becomes a Spark ``string`` column. A plain ``str`` field also receives ObjectIds in
DataFrames, but only ``ObjectIdStr`` makes ``ChangeEvent.document(Model)`` accept them."""


_TEXT = ValueSpec(Kind.STRING)
_TRUNCATION = ValueSpec(
    Kind.STRUCT,
    fields=(
        FieldSpec("field", "field", _TEXT, none_ok=True),
        FieldSpec("new_size", "newSize", ValueSpec(Kind.INT32), none_ok=True),
    ),
)
_DOCUMENT_COLUMNS = ("full_document", "full_document_before_change")
_EVENT_FIELDS: tuple[tuple[str, ValueSpec], ...] = (
    ("_id", _TEXT),
    ("operation_type", _TEXT),
    ("cluster_time", ValueSpec(Kind.TIMESTAMP)),
    # Timestamp.inc is an unsigned 32-bit number: int would not hold the upper half.
    ("cluster_time_increment", ValueSpec(Kind.INT64)),
    ("wall_time", ValueSpec(Kind.TIMESTAMP)),
    ("database", _TEXT),
    ("collection", _TEXT),
    ("to_database", _TEXT),
    ("to_collection", _TEXT),
    ("document_key", ValueSpec(Kind.JSON)),
    ("full_document", ValueSpec(Kind.JSON)),  # or the schema's struct
    ("full_document_before_change", ValueSpec(Kind.JSON)),  # or the schema's struct
    ("updated_fields", ValueSpec(Kind.JSON)),
    ("removed_fields", ValueSpec(Kind.LIST, element=_TEXT)),
    ("truncated_arrays", ValueSpec(Kind.LIST, element=_TRUNCATION)),
)

EVENT_COLUMNS: tuple[str, ...] = tuple(name for name, _ in _EVENT_FIELDS)
"""The change-event columns, in DataFrame order (docs/spark.md, "Columns")."""

CORRUPT_RECORD_COLUMN = "_corrupt_record"
"""Added after the event columns in PERMISSIVE mode with a typed schema: the Extended JSON of a
document that did not fit the schema, null for rows that fit."""

RESCUED_DATA_COLUMN = "_rescued_data"
"""Added last with ``rescued_data=True`` (``schema="infer"``): the Extended JSON of what the typed
document columns could not take, ``{"full_document": {...}, "full_document_before_change":
{...}}`` (keys not in the schema, values that do not fit their field), null when nothing was
(:mod:`flowwarden.spark.convert.rescue`)."""

# ----------------------------------------------------------------------------------------------
# Specs to Arrow and Spark types


def arrow_type(spec: ValueSpec) -> pa.DataType:
    """The Arrow type of a spec, as Spark's ``to_arrow_type(..., timezone="UTC")`` spells it."""
    pa = require("pyarrow", "Arrow conversion")
    kind = spec.kind
    if kind in (Kind.STRING, Kind.UUID, Kind.JSON):
        return pa.string()
    if kind is Kind.LIST:
        assert spec.element is not None
        return pa.list_(pa.field("element", arrow_type(spec.element), nullable=True))
    if kind is Kind.MAP:
        assert spec.element is not None
        return pa.map_(
            pa.field("key", pa.string(), nullable=False),
            pa.field("value", arrow_type(spec.element), nullable=True),
        )
    if kind is Kind.STRUCT:
        return pa.struct([pa.field(f.name, arrow_type(f.value), nullable=True) for f in spec.fields])
    if kind is Kind.DECIMAL:
        return pa.decimal128(spec.precision, spec.scale)
    if kind is Kind.TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if kind is Kind.TIMESTAMP_NTZ:
        return pa.timestamp("us")
    scalars = {
        Kind.INT8: pa.int8,
        Kind.INT16: pa.int16,
        Kind.INT32: pa.int32,
        Kind.INT64: pa.int64,
        Kind.FLOAT: pa.float32,
        Kind.DOUBLE: pa.float64,
        Kind.BOOL: pa.bool_,
        Kind.DATE: pa.date32,
        Kind.BINARY: pa.binary,
    }
    return scalars[kind]()


def spark_type(spec: ValueSpec) -> DataType:
    """The Spark type of a spec (every field, element and map value nullable)."""
    t = require("pyspark.sql.types", "Spark schemas")
    kind = spec.kind
    result: DataType
    if kind is Kind.LIST:
        assert spec.element is not None
        result = t.ArrayType(spark_type(spec.element), containsNull=True)
    elif kind is Kind.MAP:
        assert spec.element is not None
        result = t.MapType(t.StringType(), spark_type(spec.element), valueContainsNull=True)
    elif kind is Kind.STRUCT:
        result = t.StructType(
            [t.StructField(f.name, spark_type(f.value), nullable=True) for f in spec.fields]
        )
    elif kind is Kind.DECIMAL:
        result = t.DecimalType(spec.precision, spec.scale)
    else:
        scalars = {
            Kind.STRING: t.StringType,
            Kind.UUID: t.StringType,
            Kind.JSON: t.StringType,
            Kind.INT8: t.ByteType,
            Kind.INT16: t.ShortType,
            Kind.INT32: t.IntegerType,
            Kind.INT64: t.LongType,
            Kind.FLOAT: t.FloatType,
            Kind.DOUBLE: t.DoubleType,
            Kind.BOOL: t.BooleanType,
            Kind.TIMESTAMP: t.TimestampType,
            Kind.TIMESTAMP_NTZ: t.TimestampNTZType,
            Kind.DATE: t.DateType,
            Kind.BINARY: t.BinaryType,
        }
        result = scalars[kind]()
    return result


def model_to_arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The Arrow schema of a pydantic model's documents (one field per model field)."""
    pa = require("pyarrow", "model_to_arrow_schema")
    return pa.schema(list(arrow_type(document_spec(model))))


def model_to_struct_type(model: type[BaseModel]) -> StructType:
    """The Spark StructType of a pydantic model's documents (nested models become structs)."""
    result: StructType = spark_type(document_spec(model))  # type: ignore[assignment]
    return result


def struct_type_to_arrow_schema(struct: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for ``struct`` (the same as Spark's ``to_arrow_schema`` with
    ``timezone="UTC"`` after flowwarden's all-nullable rule)."""
    pa = require("pyarrow", "struct_type_to_arrow_schema")
    return pa.schema(list(arrow_type(document_spec(struct))))


# ----------------------------------------------------------------------------------------------
# The change-event table


def _event_fields(
    document: ValueSpec | None, corrupt_record: bool, rescued_data: bool = False
) -> list[tuple[str, ValueSpec]]:
    columns = [
        (name, document if document is not None and name in _DOCUMENT_COLUMNS else spec)
        for name, spec in _EVENT_FIELDS
    ]
    if corrupt_record:
        columns.append((CORRUPT_RECORD_COLUMN, ValueSpec(Kind.JSON)))
    if rescued_data:
        columns.append((RESCUED_DATA_COLUMN, ValueSpec(Kind.JSON)))
    return columns


def has_corrupt_record(schema: Any, mode: SchemaMode | str) -> bool:
    """Whether the table carries ``_corrupt_record``: a typed schema in PERMISSIVE mode."""
    return schema is not None and SchemaMode(mode) is SchemaMode.PERMISSIVE


def change_event_arrow_schema(
    schema: Any = None, *, mode: SchemaMode | str = SchemaMode.PERMISSIVE, rescued_data: bool = False
) -> pa.Schema:
    """The Arrow schema of converted change events for a full-document ``schema`` and ``mode``
    (``rescued_data``: with ``_rescued_data`` last)."""
    pa = require("pyarrow", "change_event_arrow_schema")
    document = document_spec(schema) if schema is not None else None
    return pa.schema(
        [
            pa.field(name, arrow_type(spec), nullable=True)
            for name, spec in _event_fields(document, has_corrupt_record(schema, mode), rescued_data)
        ]
    )


def change_event_struct_type(
    schema: Any = None, *, mode: SchemaMode | str = SchemaMode.PERMISSIVE, rescued_data: bool = False
) -> StructType:
    """The Spark schema of change-event DataFrames for a full-document ``schema`` and ``mode``
    (``rescued_data``: with ``_rescued_data`` last)."""
    t = require("pyspark.sql.types", "change_event_struct_type")
    document = document_spec(schema) if schema is not None else None
    return t.StructType(  # type: ignore[no-any-return]
        [
            t.StructField(name, spark_type(spec), nullable=True)
            for name, spec in _event_fields(document, has_corrupt_record(schema, mode), rescued_data)
        ]
    )


def _ddl(spec: ValueSpec) -> str:
    kind = spec.kind
    if kind is Kind.LIST:
        assert spec.element is not None
        return f"ARRAY<{_ddl(spec.element)}>"
    if kind is Kind.MAP:
        assert spec.element is not None
        return f"MAP<STRING, {_ddl(spec.element)}>"
    if kind is Kind.STRUCT:
        return "STRUCT<" + ", ".join(f"{_quoted(f.name)}: {_ddl(f.value)}" for f in spec.fields) + ">"
    if kind is Kind.DECIMAL:
        return f"DECIMAL({spec.precision},{spec.scale})"
    if kind in (Kind.STRING, Kind.UUID, Kind.JSON):
        return "STRING"
    return str(kind.value).upper()


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def change_event_ddl(
    document_ddl: str | None = None, *, corrupt_record: bool = False, rescued_data: bool = False
) -> str:
    """The change-event columns as a Spark DDL field list, what a Python data source's
    ``schema()`` returns: the same columns and types as :func:`change_event_struct_type`, without
    building pyspark types. ``document_ddl`` (a DDL field list such as ``"sku STRING, qty INT"``)
    types both document columns as ``STRUCT<document_ddl>``; None keeps them Extended JSON.
    ``corrupt_record`` appends ``_corrupt_record``, ``rescued_data`` then ``_rescued_data``."""
    document = f"STRUCT<{document_ddl}>" if document_ddl else None
    return ", ".join(
        f"{_quoted(name)} {document if document is not None and name in _DOCUMENT_COLUMNS else _ddl(spec)}"
        for name, spec in _event_fields(None, corrupt_record, rescued_data)
    )


def document_fields_ddl(spec: ValueSpec) -> str:
    """A STRUCT spec's fields as a Spark DDL field list (``"sku STRING, qty BIGINT"``); Extended
    JSON and UUID fields are STRING."""
    return ", ".join(f"{_quoted(f.name)} {_ddl(f.value)}" for f in spec.fields)


def non_nullable_paths(data_type: Any, path: str) -> list[str]:
    """Paths of the fields, elements and map values ``data_type`` declares non-nullable."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    found: list[str] = []
    if isinstance(data_type, StructType):
        for field in data_type.fields:
            child = f"{path}.{field.name}"
            if not field.nullable:
                found.append(child)
            found.extend(non_nullable_paths(field.dataType, child))
    elif isinstance(data_type, ArrayType):
        if not data_type.containsNull:
            found.append(f"{path}[]")
        found.extend(non_nullable_paths(data_type.elementType, f"{path}[]"))
    elif isinstance(data_type, MapType):
        if not data_type.valueContainsNull:
            found.append(f"{path}{{}}")
        found.extend(non_nullable_paths(data_type.valueType, f"{path}{{}}"))
    return found
