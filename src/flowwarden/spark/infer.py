"""Full-document schemas inferred from a sample of a collection: :func:`infer_schema`.

Owns how a schema is found when a stream says ``schema="infer"``: up to ``sample_size`` documents
drawn by ``$sample`` (:func:`sample_pipeline`), each typed and the types merged
(:func:`spec_of_documents`) by the MongoDB Spark connector's rules (its ``InferSchema``), then
``hints`` laid over what sampling found (:func:`apply_hints`).

How values are typed: a document is a struct, an array an array of its elements' merged type,
a string or an ObjectId a string, int32 an int, int64 a bigint, a double a double, a
Decimal128 the decimal of its digits, a date a timestamp, binary data binary, a boolean a
boolean; every other BSON type (a bson Timestamp, a regex, code, MinKey...) is a string
holding its Extended JSON. How types merge: null gives way to anything; int widens to bigint
and both to double; decimals widen to hold both (beyond 38 digits: double); structs merge
field by field (fields sorted by name, as the connector sorts them); arrays merge their
elements; a document with 250 keys or more is a map of its merged values; any other two
types conflict and the field becomes a string holding each value's Extended JSON. Unlike the
connector, an empty array adds nothing to its element type (the connector counts it as an
array of strings, which would turn every array that is sometimes empty into Extended JSON).
A field seen only as null is an Extended JSON string.

Extended JSON positions are kept in the ``StructType`` as field metadata
(:data:`~flowwarden.spark.convert.spec_compiler.EXTENDED_JSON_METADATA`), so a schema
:func:`infer_schema` returns converts the same way wherever it is handed on.

Hard rules: inference reads the collection once, at start, never per batch; it never fails
for what it finds in a document (every value has a type); every inferred field is nullable.
Importing this module imports neither pyspark nor pyarrow.
"""

from __future__ import annotations

import datetime as dt
import inspect
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from flowwarden.errors import ConfigurationError
from flowwarden.spark.convert.spec_compiler import EXTENDED_JSON_METADATA, document_spec
from flowwarden.spark.convert.valuespec import FieldSpec, Kind, ValueSpec
from flowwarden.spark.hints import parse_hints

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "DEFAULT_SAMPLE_SIZE",
    "MAP_MINIMUM_KEYS",
    "apply_hints",
    "document_ddl",
    "infer_document_spec",
    "infer_document_spec_async",
    "infer_schema",
    "parse_hints",
    "sample_pipeline",
    "spec_of_documents",
    "spec_struct_type",
]

DEFAULT_SAMPLE_SIZE = 1000
MAP_MINIMUM_KEYS = 250
"""A document with this many keys or more is inferred as a map (the connector's default)."""

_INT32 = (-(2**31), 2**31)
_JSON = ValueSpec(Kind.JSON)
_NUMERIC_RANK = {Kind.INT32: 0, Kind.INT64: 1, Kind.DOUBLE: 2}
_INTEGRAL_DECIMALS = {Kind.INT32: (10, 0), Kind.INT64: (20, 0), Kind.DOUBLE: (30, 15)}


def sample_pipeline(sample_size: int) -> list[dict[str, Any]]:
    """The aggregation that draws the sample."""
    return [{"$sample": {"size": sample_size}}]


# ----------------------------------------------------------------------------------------------
# Types of values, and how they merge (None: only nulls seen so far)


def _type_of(value: Any) -> ValueSpec | None:
    if value is None:
        return None
    kind = type(value)
    if kind is bool:
        return ValueSpec(Kind.BOOL)
    if kind is Int64:
        return ValueSpec(Kind.INT64)
    if kind is int:
        return ValueSpec(Kind.INT32 if _INT32[0] <= value < _INT32[1] else Kind.INT64)
    if kind is float:
        return ValueSpec(Kind.DOUBLE)
    if kind is str or kind is ObjectId:
        return ValueSpec(Kind.STRING)
    if kind is dt.datetime:
        return ValueSpec(Kind.TIMESTAMP)
    if kind is bytes or kind is Binary:
        return ValueSpec(Kind.BINARY)
    if kind is Decimal128:
        return _decimal_type(value.to_decimal())
    if isinstance(value, dict):
        return _struct_type(value)
    if kind is list:
        element: ValueSpec | None = None
        for item in value:
            element = _merge(element, _type_of(item))
        return ValueSpec(Kind.LIST, element=element)
    if kind is uuid.UUID:
        return ValueSpec(Kind.UUID)
    return _JSON  # Timestamp, Regex, Code, MinKey, MaxKey, DBRef, dates out of range ...


def _decimal_type(value: Decimal) -> ValueSpec:
    if not value.is_finite():
        return _JSON
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(-exponent, 0)
    precision = max(len(digits) + max(exponent, 0), scale, 1)
    if precision > 38:
        return _JSON
    return ValueSpec(Kind.DECIMAL, precision=precision, scale=scale)


def _struct_type(document: Mapping[str, Any], nested: bool = True) -> ValueSpec:
    fields = [
        FieldSpec(key, key, _type_of(value) or _NULL_FIELD, none_ok=True) for key, value in document.items()
    ]
    return _finish_struct(fields, nested)


# A field whose values were all null so far: replaced by the first real type merged into it,
# and by Extended JSON if none comes (see _resolved).
_NULL_FIELD = ValueSpec(Kind.JSON, choices=frozenset({"<null>"}))


def _finish_struct(fields: list[FieldSpec], nested: bool = True) -> ValueSpec:
    """A struct of ``fields`` sorted by name; a nested one with many keys is a map."""
    fields.sort(key=lambda f: f.name)
    if nested and len(fields) >= MAP_MINIMUM_KEYS:
        value: ValueSpec | None = None
        for field in fields:
            value = _merge(value, _nullable(field.value))
        return ValueSpec(Kind.MAP, element=value)
    return ValueSpec(Kind.STRUCT, fields=tuple(fields))


def _nullable(spec: ValueSpec) -> ValueSpec | None:
    return None if spec is _NULL_FIELD else spec


def _merge(a: ValueSpec | None, b: ValueSpec | None) -> ValueSpec | None:
    if a is None or a is _NULL_FIELD:
        return b
    if b is None or b is _NULL_FIELD or a == b:
        return a
    ka, kb = a.kind, b.kind
    if ka in _NUMERIC_RANK and kb in _NUMERIC_RANK:
        return a if _NUMERIC_RANK[ka] >= _NUMERIC_RANK[kb] else b
    if ka is Kind.DECIMAL or kb is Kind.DECIMAL:
        return _merge_decimals(a, b)
    if ka is Kind.STRUCT and kb is Kind.STRUCT:
        return _merge_structs(a, b)
    if ka is Kind.LIST and kb is Kind.LIST:
        return ValueSpec(Kind.LIST, element=_merge(a.element, b.element))
    if {ka, kb} == {Kind.MAP, Kind.STRUCT}:
        mapping, struct = (a, b) if ka is Kind.MAP else (b, a)
        value = mapping.element
        for field in struct.fields:
            value = _merge(value, _nullable(field.value))
        return ValueSpec(Kind.MAP, element=value)
    if ka is Kind.MAP and kb is Kind.MAP:
        return ValueSpec(Kind.MAP, element=_merge(a.element, b.element))
    return _JSON


def _merge_decimals(a: ValueSpec, b: ValueSpec) -> ValueSpec:
    """Two decimals, or a decimal and a number: the decimal that holds both (as Spark widens
    decimals), a double past 38 digits; a decimal and anything else: Extended JSON."""
    digits = []
    for spec in (a, b):
        if spec.kind is Kind.DECIMAL:
            digits.append((spec.precision, spec.scale))
        elif spec.kind in _INTEGRAL_DECIMALS:
            digits.append(_INTEGRAL_DECIMALS[spec.kind])
        else:
            return _JSON
    scale = max(s for _, s in digits)
    whole = max(p - s for p, s in digits)
    if whole + scale > 38:
        return ValueSpec(Kind.DOUBLE)
    return ValueSpec(Kind.DECIMAL, precision=whole + scale, scale=scale)


def _merge_structs(a: ValueSpec, b: ValueSpec, nested: bool = True) -> ValueSpec:
    merged = {field.name: field.value for field in a.fields}
    for field in b.fields:
        if field.name in merged:
            merged[field.name] = _merge(merged[field.name], field.value) or _NULL_FIELD
        else:
            merged[field.name] = field.value
    fields = [FieldSpec(name, name, value, none_ok=True) for name, value in merged.items()]
    return _finish_struct(fields, nested)


def _resolved(spec: ValueSpec | None) -> ValueSpec:
    """Every type still unknown (only nulls, empty arrays) as Extended JSON."""
    if spec is None or spec is _NULL_FIELD:
        return _JSON
    if spec.kind in (Kind.LIST, Kind.MAP):
        return ValueSpec(spec.kind, element=_resolved(spec.element))
    if spec.kind is Kind.STRUCT:
        return ValueSpec(
            Kind.STRUCT,
            fields=tuple(FieldSpec(f.name, f.key, _resolved(f.value), none_ok=True) for f in spec.fields),
        )
    return spec


def spec_of_documents(documents: Iterable[Mapping[str, Any]], hints: Any = None) -> ValueSpec:
    """The merged STRUCT spec of ``documents`` (decoded by PyMongo), ``hints`` laid over it."""
    # The documents themselves stay structs, whatever their number of keys.
    merged = ValueSpec(Kind.STRUCT)
    for document in documents:
        merged = _merge_structs(merged, _struct_type(document, nested=False), nested=False)
    spec = _resolved(merged)
    return apply_hints(spec, hints) if hints is not None else spec


# ----------------------------------------------------------------------------------------------
# Hints


def apply_hints(spec: ValueSpec, hints: Any) -> ValueSpec:
    """``spec`` with ``hints`` laid over it: a DDL string whose field names may be dotted paths
    into nested documents (``"qty BIGINT, addr.zip STRING"``), or a StructType / pyarrow schema
    whose top-level fields replace the inferred ones. A hinted field that sampling did not find
    is added (with the documents it is nested in)."""
    if isinstance(hints, str):
        overrides = parse_hints(hints)
    else:
        overrides = [((field.name,), field.value) for field in document_spec(hints).fields]
    for path, value in overrides:
        spec = _override(spec, path, value)
    return spec


def _override(spec: ValueSpec, path: tuple[str, ...], value: ValueSpec) -> ValueSpec:
    head, rest = path[0], path[1:]
    fields = list(spec.fields) if spec.kind is Kind.STRUCT else []
    for index, field in enumerate(fields):
        if field.name == head:
            inner = value if not rest else _override(_as_struct(field.value), rest, value)
            fields[index] = FieldSpec(head, head, inner, none_ok=True)
            break
    else:
        inner = value if not rest else _override(ValueSpec(Kind.STRUCT), rest, value)
        fields.append(FieldSpec(head, head, inner, none_ok=True))
    return ValueSpec(Kind.STRUCT, fields=tuple(fields))


def _as_struct(spec: ValueSpec) -> ValueSpec:
    return spec if spec.kind is Kind.STRUCT else ValueSpec(Kind.STRUCT)


# ----------------------------------------------------------------------------------------------
# Specs as Spark schemas and DDL


def spec_struct_type(spec: ValueSpec) -> StructType:
    """The StructType of a document spec, Extended JSON positions marked in field metadata."""
    result: StructType = _spark_of(spec)
    return result


def _spark_of(spec: ValueSpec) -> Any:
    from flowwarden.spark.schema import spark_type

    t = _spark_types()
    if spec.kind is Kind.STRUCT:
        fields = []
        for field in spec.fields:
            positions = _json_positions(field.value, "")
            metadata = {EXTENDED_JSON_METADATA: positions} if positions else None
            fields.append(t.StructField(field.name, _spark_of(field.value), True, metadata))
        return t.StructType(fields)
    if spec.kind is Kind.LIST and spec.element is not None:
        return t.ArrayType(_spark_of(spec.element), True)
    if spec.kind is Kind.MAP and spec.element is not None:
        return t.MapType(t.StringType(), _spark_of(spec.element), True)
    return spark_type(spec)


def _json_positions(spec: ValueSpec, position: str) -> list[str]:
    """Where in a field's type (itself: "", its elements: "[]", map values: "{}") values are
    Extended JSON; nested structs mark their own fields."""
    if spec.kind is Kind.JSON:
        return [position]
    if spec.kind in (Kind.LIST, Kind.MAP) and spec.element is not None:
        return _json_positions(spec.element, position + ("[]" if spec.kind is Kind.LIST else "{}"))
    return []


def _spark_types() -> Any:
    from flowwarden.spark._extra import require

    return require("pyspark.sql.types", "infer_schema")


def document_ddl(spec: ValueSpec) -> str:
    """A document spec as a Spark DDL field list (Extended JSON fields are STRING), for logs
    and the streaming source's schema."""
    from flowwarden.spark.schema import document_fields_ddl

    return document_fields_ddl(spec)


# ----------------------------------------------------------------------------------------------
# Sampling


def _check_sample_size(sample_size: int) -> None:
    if type(sample_size) is not int or sample_size < 1:
        raise ConfigurationError(
            f"sample_size {sample_size!r} is not a positive int",
            option="sample_size",
            value=sample_size,
            allowed="an int >= 1",
        )


def infer_document_spec(
    uri_or_client: Any,
    database: str,
    collection: str,
    *,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    hints: Any = None,
) -> ValueSpec:
    """The inferred document spec of ``database.collection`` (see :func:`infer_schema`)."""
    _check_sample_size(sample_size)
    if isinstance(uri_or_client, str):
        import pymongo

        client: pymongo.MongoClient[dict[str, Any]]
        with pymongo.MongoClient(uri_or_client, appname="flowwarden-infer") as client:
            documents = list(client[database][collection].aggregate(sample_pipeline(sample_size)))
    else:
        documents = list(uri_or_client[database][collection].aggregate(sample_pipeline(sample_size)))
    return spec_of_documents(documents, hints)


async def infer_document_spec_async(
    collection: Any, *, sample_size: int = DEFAULT_SAMPLE_SIZE, hints: Any = None
) -> ValueSpec:
    """The inferred document spec of an async collection (PyMongo's async API or motor)."""
    _check_sample_size(sample_size)
    cursor = collection.aggregate(sample_pipeline(sample_size))
    if inspect.isawaitable(cursor):  # PyMongo's async aggregate is a coroutine; motor's is not
        cursor = await cursor
    documents = await cursor.to_list(None)
    return spec_of_documents(documents, hints)


def infer_schema(
    uri_or_client: Any,
    database: str,
    collection: str,
    *,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    hints: Any = None,
) -> StructType:
    """The schema of ``database.collection``'s documents, inferred from a ``$sample`` of
    ``sample_size`` of them as the MongoDB Spark connector infers it (see the module
    docstring for the rules), with ``hints`` laid over it.

    ``uri_or_client``: a MongoDB URI or a ``pymongo.MongoClient``. ``hints``: a DDL field list
    whose names may be dotted paths into nested documents (``"qty BIGINT, addr.zip STRING"``),
    or a StructType whose fields replace the inferred ones of the same name. Every field is
    nullable; a field holding Extended JSON is a string whose StructField metadata says so,
    which :func:`~flowwarden.spark.events_to_dataframe` and the streaming source read.
    """
    return spec_struct_type(
        infer_document_spec(uri_or_client, database, collection, sample_size=sample_size, hints=hints)
    )
