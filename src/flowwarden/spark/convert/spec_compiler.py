"""Full-document schemas compiled into :class:`~flowwarden.spark.convert.valuespec.ValueSpec` trees.

Owns reading the schemas users give: a pydantic model class, a pyspark ``StructType``, or a
pyarrow ``Schema``/``StructType`` (:func:`document_spec`). Each becomes the STRUCT spec the
Arrow and Spark types and both converters follow.

pydantic annotation -> Spark type: ``str`` -> string, ``int`` -> bigint, ``float`` -> double,
``bool`` -> boolean, ``datetime`` -> timestamp, ``date`` -> date, ``Decimal`` -> decimal(38,18)
or ``Field(max_digits=p, decimal_places=s)`` -> decimal(p,s), ``bytes`` -> binary, ``UUID`` ->
string, ``ObjectIdStr`` / ``bson.ObjectId`` -> string (24 hex digits), an ``Enum`` or ``Literal``
-> the type of its values, ``list[T]`` / ``set[T]`` / ``tuple[T, ...]`` -> array, ``dict[str, T]``
-> map, a nested model -> struct, ``Any`` (and bare ``dict`` / ``list``) -> string holding
canonical Extended JSON, ``T | None`` -> T. A pydantic field becomes a struct field named after
the Python attribute and is read from the document key of its alias.

Hard rule: a schema with no exact column type (a union of two types, a recursive model, a
fixed-length tuple, non-string map keys, a Spark or Arrow type with no BSON counterpart) is
refused here with a :class:`~flowwarden.errors.ConfigurationError` naming the field, never
approximated. Compiling runs once per schema, never per event. Importing this module imports
none of pydantic, pyarrow and pyspark: their models and schema objects are recognised only when
their module is already loaded, and read through it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import sys
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Union

from bson.decimal128 import Decimal128
from bson.objectid import ObjectId

from flowwarden.errors import ConfigurationError
from flowwarden.spark._extra import require
from flowwarden.spark.convert.valuespec import NO_DEFAULT, FieldSpec, Kind, ValueSpec

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["DEFAULT_DECIMAL", "EXTENDED_JSON_METADATA", "document_spec"]

DEFAULT_DECIMAL = (38, 18)
"""(precision, scale) of a ``Decimal`` annotated without ``max_digits`` / ``decimal_places``."""

EXTENDED_JSON_METADATA = "flowwarden.extended_json"
"""The StructField metadata key naming where in a string field's type the values are Extended
JSON of any BSON value rather than strings: ``""`` the field itself, ``"[]"`` its array's
elements, ``"{}"`` its map's values (``"[][]"``...). :func:`~flowwarden.spark.infer.infer_schema`
marks the fields whose sampled types conflicted this way."""



def _is_model_class(value: Any) -> bool:
    """Whether ``value`` is a pydantic model class. pydantic is not imported to answer: no value is
    a model unless its program imported pydantic, and a Spark worker converting events, which
    compiles no model, then never loads it."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, type) and issubclass(value, pydantic.BaseModel)

def document_spec(schema: Any) -> ValueSpec:
    """Compile a full-document schema into a STRUCT :class:`ValueSpec`.

    ``schema`` is a pydantic model class, a pyspark ``StructType``, or a pyarrow ``Schema`` or
    ``StructType``. Raises :class:`~flowwarden.errors.ConfigurationError` naming the field and
    annotation for anything that has no exact column type (a ``Union`` of two types, ``time``).
    """
    if isinstance(schema, ValueSpec):
        if schema.kind is not Kind.STRUCT:
            raise ConfigurationError("a document schema must be a struct", option="schema", value=schema)
        return schema
    if _is_model_class(schema):
        return _model_spec(schema, ())
    if _is_spark_struct(schema):
        return _spark_spec(schema, "schema")
    pa = _pyarrow_if_loaded()
    if pa is not None and isinstance(schema, (pa.Schema, pa.StructType)):
        return _arrow_struct_spec(list(schema), "schema")
    raise ConfigurationError(
        f"cannot use {schema!r} as a full-document schema",
        option="schema",
        value=schema,
        allowed="a pydantic BaseModel subclass, a pyspark StructType, or a pyarrow Schema/StructType",
    )


def _is_spark_struct(value: Any) -> bool:
    module = sys.modules.get("pyspark.sql.types")
    struct = getattr(module, "StructType", None)
    return isinstance(struct, type) and isinstance(value, struct)


def _pyarrow_if_loaded() -> Any:
    return sys.modules.get("pyarrow")


def _model_spec(model: type[BaseModel], stack: tuple[type[BaseModel], ...]) -> ValueSpec:
    if model in stack:
        chain = " -> ".join(m.__name__ for m in (*stack, model))
        raise ConfigurationError(
            f"model {model.__name__} contains itself ({chain}); a Spark struct cannot be recursive. "
            "Annotate the recursive field as Any to keep it as Extended JSON",
            option="schema",
            value=model,
        )
    stack = (*stack, model)
    if not model.__pydantic_complete__:
        try:
            model.model_rebuild()
        except Exception as exc:  # pydantic's undefined-annotation errors have several classes
            raise ConfigurationError(
                f"model {model.__name__} is not fully defined ({exc}); define the types its "
                f"annotations name, then call {model.__name__}.model_rebuild()",
                option="schema",
                value=model,
            ) from exc
    fields = []
    for name, info in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        key = info.validation_alias if info.validation_alias is not None else info.alias
        if key is None:
            key = name
        if not isinstance(key, str):
            raise ConfigurationError(
                f"field {where} uses validation_alias {key!r}; only a plain string alias names a "
                "document key",
                option="schema",
                value=model,
            )
        value, none_ok = _annotation_spec(info.annotation, list(info.metadata), where, stack)
        default: Any = NO_DEFAULT
        factory: Callable[[], Any] | None = None
        if info.default_factory is not None:
            factory = _factory(info)
        elif not info.is_required():
            default = _document_form(info.default)
            if default is None:
                none_ok = True
        fields.append(
            FieldSpec(
                name=name, key=key, value=value, none_ok=none_ok, default=default, default_factory=factory
            )
        )
    return ValueSpec(Kind.STRUCT, fields=tuple(fields))


def _factory(info: Any) -> Callable[[], Any]:
    def make() -> Any:
        return _document_form(info.get_default(call_default_factory=True, validated_data={}))

    return make


def _document_form(value: Any) -> Any:
    """A pydantic default as it would look in a MongoDB document (models -> dicts, enums -> values)."""
    if _is_model_class(type(value)):
        return value.model_dump(by_alias=True)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_document_form(v) for v in value]
    if isinstance(value, dict):
        return {k: _document_form(v) for k, v in value.items()}
    return value


def _decimal_digits(metadata: Iterable[Any]) -> tuple[int, int] | None:
    for item in metadata:
        nested = getattr(item, "metadata", None)
        if isinstance(nested, list):
            found = _decimal_digits(nested)
            if found:
                return found
        digits = getattr(item, "max_digits", None)
        places = getattr(item, "decimal_places", None)
        if digits is not None or places is not None:
            precision = digits if digits is not None else DEFAULT_DECIMAL[0]
            scale = places if places is not None else min(DEFAULT_DECIMAL[1], precision)
            return precision, scale
    return None


_SCALARS: dict[Any, Kind] = {
    str: Kind.STRING,
    ObjectId: Kind.STRING,
    uuid.UUID: Kind.UUID,
    int: Kind.INT64,
    float: Kind.DOUBLE,
    bool: Kind.BOOL,
    dt.datetime: Kind.TIMESTAMP,
    dt.date: Kind.DATE,
    bytes: Kind.BINARY,
    Any: Kind.JSON,
    object: Kind.JSON,
    dict: Kind.JSON,
    list: Kind.JSON,
}

_SEQUENCES = (list, set, frozenset, tuple, Sequence)
_MAPPINGS = (dict, Mapping)


def _annotation_spec(
    annotation: Any, metadata: list[Any], where: str, stack: tuple[type[BaseModel], ...]
) -> tuple[ValueSpec, bool]:
    """(spec, None allowed) of one annotation."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        inner, *extra = typing.get_args(annotation)
        return _annotation_spec(inner, [*metadata, *extra], where, stack)
    supertype = getattr(annotation, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return _annotation_spec(supertype, metadata, where, stack)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        allows_none = len(members) < len(typing.get_args(annotation))
        if len(members) == 1:
            spec, inner_none = _annotation_spec(members[0], metadata, where, stack)
            return spec, allows_none or inner_none
        raise ConfigurationError(
            f"field {where}: {annotation!r} is a union of several types, which has no single Spark "
            "type; annotate it as Any to keep the value as Extended JSON",
            option="schema",
            value=annotation,
        )
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        return ValueSpec(_common_kind(values, where, annotation), choices=frozenset(values)), None in values
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = tuple(member.value for member in annotation)
        return ValueSpec(_common_kind(values, where, annotation), choices=frozenset(values)), False
    if _is_model_class(annotation):
        return _model_spec(annotation, stack), False
    if annotation in (Decimal, Decimal128):
        precision, scale = _decimal_digits(metadata) or DEFAULT_DECIMAL
        return _decimal_spec(precision, scale, where), False
    if annotation is None or annotation is type(None):
        raise ConfigurationError(f"field {where} can only be None", option="schema", value=annotation)
    kind = _SCALARS.get(annotation)
    if kind is not None:
        return ValueSpec(kind), False
    args = typing.get_args(annotation)
    if origin in _SEQUENCES:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise ConfigurationError(
                f"field {where}: fixed-length {annotation!r} has no Spark type; use tuple[T, ...] or list[T]",
                option="schema",
                value=annotation,
            )
        element, element_none = _annotation_spec(args[0], [], f"{where}[]", stack)
        return ValueSpec(Kind.LIST, element=element, element_nullable=element_none), False
    if origin in _MAPPINGS:
        key, value = args
        if key is not str:
            raise ConfigurationError(
                f"field {where}: {annotation!r} has non-string keys; document keys are strings",
                option="schema",
                value=annotation,
            )
        element, element_none = _annotation_spec(value, [], f"{where}{{}}", stack)
        return ValueSpec(Kind.MAP, element=element, element_nullable=element_none), False
    raise ConfigurationError(
        f"field {where}: {annotation!r} has no Spark column type",
        option="schema",
        value=annotation,
        allowed="str, int, float, bool, datetime, date, Decimal, bytes, UUID, ObjectIdStr, Enum, Literal, "
        "list/set/tuple[T, ...], dict[str, T], a nested BaseModel, Any, or T | None of these",
    )


def _common_kind(values: Sequence[Any], where: str, annotation: Any) -> Kind:
    members = [v for v in values if v is not None]
    kinds = {Kind.BOOL if type(v) is bool else _SCALARS.get(type(v)) for v in members}
    if len(kinds) == 1:
        (kind,) = kinds
        if kind in (Kind.STRING, Kind.INT64, Kind.DOUBLE, Kind.BOOL):
            return kind
    raise ConfigurationError(
        f"field {where}: the values of {annotation!r} must all be str, all int, all float or all bool",
        option="schema",
        value=annotation,
    )


def _decimal_spec(precision: int, scale: int, where: str) -> ValueSpec:
    """decimal(precision,scale), refused unless Spark has that decimal type."""
    if not (1 <= precision <= 38 and 0 <= scale <= precision):
        raise ConfigurationError(
            f"field {where}: decimal({precision},{scale}) is not a Spark decimal",
            option="schema",
            allowed="1 <= max_digits <= 38 and 0 <= decimal_places <= max_digits",
        )
    return ValueSpec(Kind.DECIMAL, precision=precision, scale=scale)


def _struct_spec(
    fields: Iterable[tuple[str, Any, Any]], where: str, value_spec: Callable[[Any, str], ValueSpec]
) -> ValueSpec:
    """The STRUCT of a Spark or Arrow struct's ``(name, type, nullable)`` fields, each read
    from the document key of its name and typed by ``value_spec``."""
    return ValueSpec(
        Kind.STRUCT,
        fields=tuple(
            FieldSpec(
                name=name,
                key=name,
                value=value_spec(data_type, f"{where}.{name}"),
                none_ok=bool(nullable),
            )
            for name, data_type, nullable in fields
        ),
    )


def _spark_spec(struct: Any, where: str) -> ValueSpec:
    fields = ((field.name, field.dataType, field.nullable) for field in struct.fields)
    spec = _struct_spec(fields, where, _spark_value_spec)
    marked = {f.name: f.metadata.get(EXTENDED_JSON_METADATA) for f in struct.fields if f.metadata}
    if not any(marked.values()):
        return spec
    fields_ = []
    for field in spec.fields:
        value = field.value
        for position in marked.get(field.name) or ():
            value = _json_at(value, str(position), f"{where}.{field.name}")
        fields_.append(dataclasses.replace(field, value=value))
    return dataclasses.replace(spec, fields=tuple(fields_))


def _json_at(spec: ValueSpec, position: str, where: str) -> ValueSpec:
    """``spec`` with the string at ``position`` ("", "[]", "{}", "[]{}"...) read as Extended JSON."""
    if not position:
        if spec.kind is not Kind.STRING:
            raise ConfigurationError(
                f"field {where}: metadata {EXTENDED_JSON_METADATA} marks a {spec.describe()} as "
                "Extended JSON; only string fields hold it",
                option="schema",
            )
        return ValueSpec(Kind.JSON)
    step, rest = position[:2], position[2:]
    wanted = {"[]": Kind.LIST, "{}": Kind.MAP}.get(step)
    if wanted is None or spec.kind is not wanted or spec.element is None:
        raise ConfigurationError(
            f"field {where}: metadata {EXTENDED_JSON_METADATA} names position {position!r}, which "
            f"a {spec.describe()} does not have",
            option="schema",
        )
    return dataclasses.replace(spec, element=_json_at(spec.element, rest, where + step))


def _spark_value_spec(data_type: Any, where: str) -> ValueSpec:
    t = require("pyspark.sql.types", "a StructType schema")
    simple = {
        t.StringType: Kind.STRING,
        t.CharType: Kind.STRING,
        t.VarcharType: Kind.STRING,
        t.ByteType: Kind.INT8,
        t.ShortType: Kind.INT16,
        t.IntegerType: Kind.INT32,
        t.LongType: Kind.INT64,
        t.FloatType: Kind.FLOAT,
        t.DoubleType: Kind.DOUBLE,
        t.BooleanType: Kind.BOOL,
        t.TimestampType: Kind.TIMESTAMP,
        t.TimestampNTZType: Kind.TIMESTAMP_NTZ,
        t.DateType: Kind.DATE,
        t.BinaryType: Kind.BINARY,
    }
    kind = simple.get(type(data_type))
    if kind is not None:
        return ValueSpec(kind)
    if isinstance(data_type, t.DecimalType):
        return _decimal_spec(data_type.precision, data_type.scale, where)
    if isinstance(data_type, t.ArrayType):
        return ValueSpec(
            Kind.LIST,
            element=_spark_value_spec(data_type.elementType, f"{where}[]"),
            element_nullable=bool(data_type.containsNull),
        )
    if isinstance(data_type, t.MapType) and isinstance(data_type.keyType, t.StringType):
        return ValueSpec(
            Kind.MAP,
            element=_spark_value_spec(data_type.valueType, f"{where}{{}}"),
            element_nullable=bool(data_type.valueContainsNull),
        )
    if isinstance(data_type, t.StructType):
        return _spark_spec(data_type, where)
    raise ConfigurationError(
        f"field {where}: Spark type {data_type.simpleString()} has no BSON counterpart",
        option="schema",
        value=data_type,
        allowed="string, tinyint, smallint, int, bigint, float, double, boolean, timestamp, "
        "timestamp_ntz, date, decimal(p,s), binary, array, map<string,_>, struct",
    )


def _arrow_struct_spec(fields: Sequence[Any], where: str) -> ValueSpec:
    return _struct_spec(((f.name, f.type, f.nullable) for f in fields), where, _arrow_value_spec)


def _arrow_value_spec(data_type: Any, where: str) -> ValueSpec:
    pa = require("pyarrow", "a pyarrow schema")
    types_ = pa.types
    checks = (
        (types_.is_string, Kind.STRING),
        (types_.is_large_string, Kind.STRING),
        (types_.is_int8, Kind.INT8),
        (types_.is_int16, Kind.INT16),
        (types_.is_int32, Kind.INT32),
        (types_.is_int64, Kind.INT64),
        (types_.is_float32, Kind.FLOAT),
        (types_.is_float64, Kind.DOUBLE),
        (types_.is_boolean, Kind.BOOL),
        (types_.is_date32, Kind.DATE),
        (types_.is_binary, Kind.BINARY),
        (types_.is_large_binary, Kind.BINARY),
    )
    for check, kind in checks:
        if check(data_type):
            return ValueSpec(kind)
    if types_.is_timestamp(data_type):
        return ValueSpec(Kind.TIMESTAMP if data_type.tz is not None else Kind.TIMESTAMP_NTZ)
    if types_.is_decimal(data_type):
        return _decimal_spec(data_type.precision, data_type.scale, where)
    if types_.is_map(data_type) and types_.is_string(data_type.key_type):
        return ValueSpec(
            Kind.MAP,
            element=_arrow_value_spec(data_type.item_type, f"{where}{{}}"),
            element_nullable=bool(data_type.item_field.nullable),
        )
    if types_.is_list(data_type) or types_.is_large_list(data_type):
        return ValueSpec(
            Kind.LIST,
            element=_arrow_value_spec(data_type.value_type, f"{where}[]"),
            element_nullable=bool(data_type.value_field.nullable),
        )
    if types_.is_struct(data_type):
        return _arrow_struct_spec(list(data_type), where)
    raise ConfigurationError(
        f"field {where}: Arrow type {data_type} has no BSON counterpart", option="schema", value=data_type
    )
