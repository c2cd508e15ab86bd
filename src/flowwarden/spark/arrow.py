"""Change events to an Arrow table, column by column.

:func:`events_to_arrow` turns a batch of raw change events (the documents PyMongo decoded, i.e.
``ChangeEvent.raw``) into a ``pyarrow.Table`` with the change-event columns of DESIGN.md. Each
column is one Python list handed to pyarrow whole; a row is never assembled as a dict. A typed
full document is split into one list per struct field, reading each document once for all its
fields (recursively for nested structs, lists and maps), and a column whose values already have
the exact Python types pyarrow takes as they are goes to pyarrow without a per-value step.

BSON values map exactly or not at all: a value that would change in the conversion (1.5 into a
bigint column, a datetime with a time of day into a date, a Decimal with more places than the
column's scale) does not fit, and the schema mode decides what happens to its row. The rules
per target type are in docs/spark.md ("Which values fit").

This module imports pyarrow, never pyspark.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import logging
import math
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date, datetime, timezone
from decimal import Context, Decimal
from typing import Any, NamedTuple

import bson
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.errors import InvalidBSON
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from flowwarden.config import SchemaMode
from flowwarden.errors import FlowWardenError, SchemaMismatchError
from flowwarden.events import ChangeEvent, InvalidTokenError
from flowwarden.spark import native
from flowwarden.spark._extra import require
from flowwarden.spark.decimal128 import (
    COEFFICIENT_HIGH,
    COMBINATION,
    EXPONENT_BIAS,
    EXPONENT_MASK,
    EXPONENT_SHIFT,
    MAX_COEFFICIENT,
)
from flowwarden.spark.extjson import Encoder, JsonMode, encoder_for
from flowwarden.spark.schema import (
    FieldSpec,
    Kind,
    ValueSpec,
    arrow_type,
    change_event_arrow_schema,
    document_spec,
    has_corrupt_record,
)

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

__all__ = ["ArrowBatch", "MalformedRow", "UndecodableEventError", "events_to_arrow"]

log = logging.getLogger(__name__)

_MISSING_TYPE = type("_Missing", (), {"__repr__": lambda self: "<missing>"})
_MISSING: Any = _MISSING_TYPE()
_NONE = type(None)
_ONLY_NONE = frozenset({_NONE})
_DICTS = frozenset({dict, _NONE})
_LISTS = frozenset({list, _NONE})
_STRINGS_AND_IDS = frozenset({str, ObjectId, _NONE})
_ZERO_WORD = bytes(16)
_EVENT_KEYS = (
    "operationType",
    "clusterTime",
    "wallTime",
    "ns",
    "documentKey",
    "updateDescription",
    "fullDocument",
    "fullDocumentBeforeChange",
)
_WIDE = Context(prec=200, Emax=999_999, Emin=-999_999)
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)
_INT_RANGES = {
    Kind.INT8: (-(2**7), 2**7),
    Kind.INT16: (-(2**15), 2**15),
    Kind.INT32: (-(2**31), 2**31),
    Kind.INT64: (-(2**63), 2**63),
}


@dataclasses.dataclass(frozen=True)
class MalformedRow:
    """An event whose full document did not fit the schema."""

    index: int
    """Position of the event in the batch given to :func:`events_to_arrow`."""
    token: Mapping[str, Any]
    """The event's resume token (its ``_id``)."""
    field: str
    """The first field that did not fit, as a column path: ``full_document.items[].qty``."""
    error: str
    """What was expected and what was found."""


class ArrowBatch(NamedTuple):
    """The table of a converted batch, and the rows that did not fit the schema.

    In PERMISSIVE mode the malformed rows are in the table (nulls where values did not fit, the
    document's Extended JSON in ``_corrupt_record``); in DROPMALFORMED mode they are not, and
    ``malformed`` is the list to dead-letter. Either way ``malformed`` is in event order.
    """

    table: Any
    """A ``pyarrow.Table`` with :data:`~flowwarden.spark.schema.EVENT_COLUMNS` (and
    ``_corrupt_record`` in PERMISSIVE mode with a typed schema)."""
    malformed: tuple[MalformedRow, ...]


class UndecodableEventError(FlowWardenError, ValueError):
    """A raw event of the batch is not BSON that PyMongo can decode."""

    def __init__(self, index: int, reason: str) -> None:
        self.index = index
        self.reason = reason
        super().__init__(
            f"event {index} of the batch is not valid BSON ({reason}); the bytes were damaged "
            "between the server and here. Dead-letter that event's raw bytes or read the stream "
            "with PyMongo's decoding to see which field is affected"
        )


class _Misfit(Exception):
    """One value does not fit its column; the message says what was expected and found."""


def _found(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


class _Problems:
    """The first misfit per event, by event index."""

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: dict[int, tuple[str, str]] = {}

    def add(self, owner: int, path: str, reason: str) -> None:
        if owner not in self.first:
            self.first[owner] = (path, reason)


# ----------------------------------------------------------------------------------------------
# Scalar conversion: one function per kind, raising _Misfit for a value that does not fit.


def _to_string(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, ObjectId):
        return str(value)
    # str subclasses (bson Code) carry more than their text, so they do not fit either.
    raise _Misfit(f"expected string, got {_found(value)}")


def _to_uuid(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Binary) and value.subtype == 4 and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    if type(value) is str:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            pass
    raise _Misfit(f"expected a UUID (uuid.UUID, binary subtype 4 or UUID text), got {_found(value)}")


def _integer(kind: Kind) -> Callable[[Any], int]:
    low, high = _INT_RANGES[kind]
    name = kind.value

    def convert(value: Any) -> int:
        if type(value) is bool:
            raise _Misfit(f"expected {name}, got {_found(value)}")
        if isinstance(value, int):
            number = int(value)
        elif type(value) is float and value.is_integer():
            number = int(value)
        else:
            raise _Misfit(f"expected {name}, got {_found(value)}")
        if not low <= number < high:
            raise _Misfit(f"{number} is out of the {name} range")
        return number

    return convert


def _to_double(value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, int) and type(value) is not bool:
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if number != value:
            raise _Misfit(f"{int(value)} has no exact double value")
        return number
    raise _Misfit(f"expected double, got {_found(value)}")


def _to_float(value: Any) -> float:
    if type(value) is float or (isinstance(value, int) and type(value) is not bool):
        return float(value)
    raise _Misfit(f"expected float, got {_found(value)}")


def _to_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise _Misfit(f"expected boolean, got {_found(value)}")


def _to_timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    raise _Misfit(f"expected a datetime, got {_found(value)}")


def _to_timestamp_ntz(value: Any) -> datetime:
    if isinstance(value, datetime):
        if value.utcoffset() is not None:
            return value.astimezone(timezone.utc).replace(tzinfo=None)
        return value
    raise _Misfit(f"expected a datetime, got {_found(value)}")


def _to_date(value: Any) -> date:
    if isinstance(value, datetime):
        if (value.hour, value.minute, value.second, value.microsecond) != (0, 0, 0, 0):
            raise _Misfit(f"expected a date, got a datetime with a time of day: {value.isoformat()}")
        return value.date()
    if isinstance(value, date):
        return value
    raise _Misfit(f"expected a date, got {_found(value)}")


def _to_binary(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    raise _Misfit(f"expected binary, got {_found(value)}")


# Types pyarrow converts exactly as they are into each kind's Arrow type: a column whose values
# all have one of them skips the per-value conversion. Out-of-range numbers and decimals that
# would lose digits make pyarrow raise, and the column falls back to per-value conversion, which
# finds and reports the culprits.
_EXACT: dict[Kind, frozenset[type]] = {
    Kind.STRING: frozenset({str, _NONE}),
    Kind.INT8: frozenset({int, _NONE}),
    Kind.INT16: frozenset({int, _NONE}),
    Kind.INT32: frozenset({int, _NONE}),
    Kind.INT64: frozenset({int, Int64, _NONE}),
    Kind.DOUBLE: frozenset({float, int, Int64, _NONE}),
    Kind.FLOAT: frozenset({float, int, Int64, _NONE}),
    Kind.BOOL: frozenset({bool, _NONE}),
    Kind.TIMESTAMP: frozenset({datetime, _NONE}),
    Kind.TIMESTAMP_NTZ: frozenset({_NONE}),
    Kind.DATE: frozenset({date, _NONE}),
    Kind.BINARY: frozenset({bytes, Binary, _NONE}),
    Kind.UUID: frozenset({_NONE}),
    Kind.JSON: frozenset({_NONE}),
}


# ----------------------------------------------------------------------------------------------
# Column builders: compiled once per schema, then called once per column per batch.


class _Owners(Sequence[int]):
    """Event index of each flattened child value (array elements, map values), computed only
    when a misfit has to be reported: the common, fitting batch never materialises it."""

    __slots__ = ("offsets", "parent")

    def __init__(self, parent: Sequence[int], offsets: list[int]) -> None:
        self.parent = parent
        self.offsets = offsets

    def __len__(self) -> int:
        return self.offsets[-1]

    @typing.overload
    def __getitem__(self, index: int) -> int: ...

    @typing.overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return list(self)[index]
        return self.parent[bisect.bisect_right(self.offsets, index) - 1]

    def __iter__(self) -> Iterator[int]:
        offsets = self.offsets
        for row, owner in enumerate(self.parent):
            yield from itertools.repeat(owner, offsets[row + 1] - offsets[row])


def _validity(nulls: list[bool]) -> Any:
    """The mask argument of pyarrow's from_arrays: None when no value is null."""
    return pa.array(nulls, type=pa.bool_()) if True in nulls else None


@functools.lru_cache(maxsize=256)
def _columns_reader(keys: tuple[str, ...]) -> Callable[[Sequence[Any], Any], list[list[Any]]]:
    """A function reading ``keys`` from every document in one pass: one list per key.

    Its source is generated (as ``collections.namedtuple`` does) so the loop body is one
    ``get`` per key and no inner loop: each document is read once, while it is in the CPU cache,
    instead of once per field, which halves the cost on documents scattered over the heap.
    Keys enter the source only as ``repr()`` string literals. A None document gives None in
    every column, a missing key gives ``missing``.
    """
    count = len(keys)
    columns = ", ".join(f"c{i}" for i in range(count))
    source = "\n".join(
        [
            "def read(documents, missing):",
            *(f"    c{i} = []; a{i} = c{i}.append" for i in range(count)),
            "    for document in documents:",
            "        if document is None:",
            *(f"            a{i}(None)" for i in range(count)),
            "            continue",
            "        get = document.get",
            *(f"        a{i}(get({key!r}, missing))" for i, key in enumerate(keys)),
            f"    return [{columns}]",
        ]
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<flowwarden columns {keys!r:.60}>", "exec"), namespace)
    reader: Callable[[Sequence[Any], Any], list[list[Any]]] = namespace["read"]
    return reader


class _Column:
    """Builds one Arrow array from the list of values of one column (or nested field).

    ``owners[i]`` is the index of the event ``values[i]`` came from, for misfit reports.
    """

    __slots__ = ("arrow_type", "path", "spec")

    def __init__(self, spec: ValueSpec, path: str) -> None:
        self.spec = spec
        self.path = path
        self.arrow_type = arrow_type(spec)

    def build(
        self, values: list[Any], owners: Sequence[int], problems: _Problems, kinds: set[type] | None = None
    ) -> Any:
        raise NotImplementedError


class _ScalarColumn(_Column):
    __slots__ = ("convert", "exact")

    def __init__(self, spec: ValueSpec, path: str, json: Encoder) -> None:
        super().__init__(spec, path)
        self.exact = _EXACT[spec.kind] if spec.choices is None else frozenset({_NONE})
        self.convert = self._converter(spec, json)

    @staticmethod
    def _converter(spec: ValueSpec, json: Encoder) -> Callable[[Any], Any]:
        kind = spec.kind
        if kind in _INT_RANGES:
            return _integer(kind)
        if kind is Kind.JSON:
            return json
        simple: dict[Kind, Callable[[Any], Any]] = {
            Kind.STRING: _to_string,
            Kind.UUID: _to_uuid,
            Kind.DOUBLE: _to_double,
            Kind.FLOAT: _to_float,
            Kind.BOOL: _to_bool,
            Kind.TIMESTAMP: _to_timestamp,
            Kind.TIMESTAMP_NTZ: _to_timestamp_ntz,
            Kind.DATE: _to_date,
            Kind.BINARY: _to_binary,
        }
        return simple[kind]

    def build(
        self, values: list[Any], owners: Sequence[int], problems: _Problems, kinds: set[type] | None = None
    ) -> Any:
        if kinds is None:
            kinds = set(map(type, values))
        if kinds <= self.exact:
            if kinds == _ONLY_NONE:
                return pa.nulls(len(values), type=self.arrow_type)
            try:
                return pa.array(values, type=self.arrow_type)
            except _ARROW_ERRORS:
                pass  # a number out of range: find it below
        elif kinds <= _STRINGS_AND_IDS and self.spec.kind is Kind.STRING and self.spec.choices is None:
            return pa.array([str(v) if type(v) is ObjectId else v for v in values], type=self.arrow_type)
        return pa.array(self.convert_each(values, owners, problems), type=self.arrow_type)

    def convert_each(self, values: list[Any], owners: Sequence[int], problems: _Problems) -> list[Any]:
        convert = self.convert
        choices = self.spec.choices
        out: list[Any] = []
        append = out.append
        for value, owner in zip(values, owners, strict=True):
            if value is None:
                append(None)
                continue
            try:
                converted = convert(value)
                if choices is not None and converted not in choices:
                    raise _Misfit(f"{converted!r} is not one of {sorted(map(repr, choices))}")
            except _Misfit as misfit:
                problems.add(owner, self.path, str(misfit))
                converted = None
            append(converted)
        return out


class _DecimalColumn(_Column):
    """decimal(p,s) straight into Arrow's 128-bit buffer: Decimal128 values never become
    ``decimal.Decimal`` objects, their coefficient is rescaled as an integer."""

    __slots__ = ("limit", "name", "scale")

    def __init__(self, spec: ValueSpec, path: str) -> None:
        super().__init__(spec, path)
        self.scale = spec.scale
        self.limit = 10**spec.precision
        self.name = spec.describe()

    def build(
        self, values: list[Any], owners: Sequence[int], problems: _Problems, kinds: set[type] | None = None
    ) -> Any:
        unscaled = self.unscaled
        words: list[bytes] = []
        valid: list[bool] = []
        for value, owner in zip(values, owners, strict=True):
            number = None
            if value is not None:
                try:
                    number = unscaled(value)
                except _Misfit as misfit:
                    problems.add(owner, self.path, str(misfit))
            if number is None:
                words.append(_ZERO_WORD)
                valid.append(False)
            else:
                words.append(number.to_bytes(16, "little", signed=True))
                valid.append(True)
        bitmap = None if False not in valid else pa.array(valid, type=pa.bool_()).buffers()[1]
        return pa.Array.from_buffers(self.arrow_type, len(values), [bitmap, pa.py_buffer(b"".join(words))])

    def unscaled(self, value: Any) -> int:
        """The value times 10**scale as an exact integer, or _Misfit."""
        kind = type(value)
        if kind is Decimal128:
            high, low = value.__getstate__()
            if high & COMBINATION != COMBINATION:
                shift = ((high >> EXPONENT_SHIFT) & EXPONENT_MASK) - EXPONENT_BIAS + self.scale
                number = ((high & COEFFICIENT_HIGH) << 64) | low
                if number > MAX_COEFFICIENT:
                    number = 0  # a non-canonical coefficient is zero (IEEE 754-2008 BID)
                if shift >= 0:
                    number *= 10**shift
                else:
                    number, rest = divmod(number, 10**-shift)
                    if rest:
                        raise _Misfit(f"{value} has more than {self.scale} decimal places for {self.name}")
                if high >> 63:
                    number = -number
                return self._checked(number, value)
            value = value.to_decimal()
        elif isinstance(value, int) and kind is not bool:
            return self._checked(int(value) * 10**self.scale, value)
        elif kind is float:
            # The shortest text that reads back as this double: what was written (0.1, not
            # 0.1000000000000000055511151231257827).
            value = Decimal(repr(value))
        elif not isinstance(value, Decimal):
            raise _Misfit(f"expected {self.name}, got {_found(value)}")
        if not value.is_finite():
            raise _Misfit(f"{value} has no {self.name} value")
        scaled = value.scaleb(self.scale, context=_WIDE)
        if scaled != scaled.to_integral_value(context=_WIDE):
            raise _Misfit(f"{value} has more than {self.scale} decimal places for {self.name}")
        return self._checked(int(scaled), value)

    def _checked(self, number: int, value: Any) -> int:
        if -self.limit < number < self.limit:
            return number
        raise _Misfit(
            f"{value} has more than {self.spec.precision - self.scale} integer digits for {self.name}"
        )


class _ListColumn(_Column):
    __slots__ = ("element",)

    def __init__(self, spec: ValueSpec, path: str, element: _Column) -> None:
        super().__init__(spec, path)
        self.element = element

    def build(
        self, values: list[Any], owners: Sequence[int], problems: _Problems, kinds: set[type] | None = None
    ) -> Any:
        if kinds is None:
            kinds = set(map(type, values))
        if not kinds <= _LISTS:
            values = [self._array_or_none(v, o, problems) for v, o in zip(values, owners, strict=True)]
            kinds = set(map(type, values))
        offsets = [0, *itertools.accumulate([len(v) if v is not None else 0 for v in values])]
        flat = list(itertools.chain.from_iterable(filter(None, values)))
        flat_owners = _Owners(owners, offsets)
        if not self.spec.element_nullable and _NONE in set(map(type, flat)):
            for item, owner in zip(flat, flat_owners, strict=True):
                if item is None:
                    problems.add(owner, self.element.path, "null element in an array of non-null elements")
        return pa.ListArray.from_arrays(
            pa.array(offsets, type=pa.int32()),
            self.element.build(flat, flat_owners, problems),
            type=self.arrow_type,
            mask=_validity([v is None for v in values]) if _NONE in kinds else None,
        )

    def _array_or_none(self, value: Any, owner: int, problems: _Problems) -> Any:
        if value is None or type(value) is list:
            return value
        if isinstance(value, (list, tuple)):
            return list(value)
        problems.add(owner, self.path, f"expected an array, got {_found(value)}")
        return None


class _MapColumn(_Column):
    __slots__ = ("value",)

    def __init__(self, spec: ValueSpec, path: str, value: _Column) -> None:
        super().__init__(spec, path)
        self.value = value

    def build(
        self, values: list[Any], owners: Sequence[int], problems: _Problems, kinds: set[type] | None = None
    ) -> Any:
        offsets = [0]
        keys: list[str] = []
        items: list[Any] = []
        nulls: list[bool] = []
        for value, owner in zip(values, owners, strict=True):
            if isinstance(value, Mapping):
                for key, item in value.items():
                    if type(key) is not str:
                        problems.add(owner, self.path, f"map key {key!r} is not a string")
                        continue
                    if item is None and not self.spec.element_nullable:
                        problems.add(owner, self.value.path, f"null value for key {key!r}")
                    keys.append(key)
                    items.append(item)
                nulls.append(False)
            else:
                if value is not None:
                    problems.add(owner, self.path, f"expected a document (map), got {_found(value)}")
                nulls.append(True)
            offsets.append(len(keys))
        return pa.MapArray.from_arrays(
            pa.array(offsets, type=pa.int32()),
            pa.array(keys, type=pa.string()),
            self.value.build(items, _Owners(owners, offsets), problems),
            type=self.arrow_type,
            mask=_validity(nulls),
        )


class _StructColumn(_Column):
    __slots__ = ("children", "fields", "read_columns")

    def __init__(self, spec: ValueSpec, path: str, children: list[_Column]) -> None:
        super().__init__(spec, path)
        self.fields: tuple[FieldSpec, ...] = spec.fields
        self.children = children
        self.read_columns = _columns_reader(tuple(f.key for f in spec.fields))

    def build(
        self, values: list[Any], owners: Sequence[int], problems: _Problems, kinds: set[type] | None = None
    ) -> Any:
        if kinds is None:
            kinds = set(map(type, values))
        if kinds == _ONLY_NONE:
            return pa.nulls(len(values), type=self.arrow_type)
        docs = values
        if not kinds <= _DICTS:
            docs = [self._document_or_none(v, o, problems) for v, o in zip(values, owners, strict=True)]
            kinds = set(map(type, docs))
        null_count = sum(doc is None for doc in docs) if _NONE in kinds else 0
        arrays = []
        columns = self.read_columns(docs, _MISSING)
        for field, child, column in zip(self.fields, self.children, columns, strict=True):
            # Type sets, not `in`/count: those call __eq__ on every BSON value in the column.
            column_kinds = set(map(type, column))
            if _MISSING_TYPE in column_kinds or (not field.none_ok and _NONE in column_kinds):
                self._fill(field, child.path, column, docs, owners, problems)
                arrays.append(child.build(column, owners, problems))  # defaults replaced values
            else:
                arrays.append(child.build(column, owners, problems, column_kinds))
        return pa.StructArray.from_arrays(
            arrays,
            fields=list(self.arrow_type),
            mask=_validity([doc is None for doc in docs]) if null_count else None,
        )

    def _document_or_none(self, value: Any, owner: int, problems: _Problems) -> Any:
        if value is None or isinstance(value, Mapping):
            return value
        problems.add(owner, self.path, f"expected a document, got {_found(value)}")
        return None

    @staticmethod
    def _fill(
        field: FieldSpec,
        path: str,
        column: list[Any],
        docs: list[Any],
        owners: Sequence[int],
        problems: _Problems,
    ) -> None:
        """Defaults for missing keys; a missing or null required value is a misfit."""
        for i, value in enumerate(column):
            if value is _MISSING:
                if field.has_default:
                    column[i] = field.default_value()
                    continue
                column[i] = None
                if not field.none_ok:
                    problems.add(owners[i], path, "required field is missing")
            elif value is None and not field.none_ok and docs[i] is not None:
                problems.add(owners[i], path, "null in a required field")


def _compile(spec: ValueSpec, path: str, json: Encoder) -> _Column:
    if spec.kind is Kind.STRUCT:
        children = [_compile(f.value, f"{path}.{f.name}", json) for f in spec.fields]
        return _StructColumn(spec, path, children)
    if spec.kind is Kind.LIST:
        assert spec.element is not None
        return _ListColumn(spec, path, _compile(spec.element, f"{path}[]", json))
    if spec.kind is Kind.MAP:
        assert spec.element is not None
        return _MapColumn(spec, path, _compile(spec.element, f"{path}{{}}", json))
    if spec.kind is Kind.DECIMAL:
        return _DecimalColumn(spec, path)
    return _ScalarColumn(spec, path, json)


class _Plan(NamedTuple):
    schema: Any  # pyarrow.Schema of the table
    full_document: _Column | None
    before_change: _Column | None
    native_document: native.Document | None  # the compiled converter's plan of a typed document
    corrupt_record: bool


@functools.lru_cache(maxsize=64)
def _cached_plan(schema: Any, mode: SchemaMode, json_mode: JsonMode) -> _Plan:
    return _make_plan(schema, mode, json_mode)


def _make_plan(schema: Any, mode: SchemaMode, json_mode: JsonMode) -> _Plan:
    table_schema = change_event_arrow_schema(schema, mode=mode)
    if schema is None:
        return _Plan(table_schema, None, None, None, False)
    spec = document_spec(schema)
    json = encoder_for(json_mode)
    return _Plan(
        table_schema,
        _compile(spec, "full_document", json),
        _compile(spec, "full_document_before_change", json),
        native.compile_document(spec, arrow_type(spec)) if native.AVAILABLE else None,
        has_corrupt_record(schema, mode),
    )


def _plan(schema: Any, mode: SchemaMode, json_mode: JsonMode) -> _Plan:
    try:
        return _cached_plan(schema, mode, json_mode)
    except TypeError:  # an unhashable schema object: compile it for this batch only
        return _make_plan(schema, mode, json_mode)


# ----------------------------------------------------------------------------------------------
# The event table


def _raw(events: Sequence[Mapping[str, Any] | ChangeEvent]) -> list[Mapping[str, Any]]:
    return [event.raw if isinstance(event, ChangeEvent) else event for event in events]


def _native_table(
    events: Sequence[Mapping[str, Any] | ChangeEvent], plan: _Plan, json_mode: JsonMode
) -> tuple[Any, tuple[int, ...]] | None:
    """The table of a batch of RawBSONDocuments (or ChangeEvents over them) from the compiled
    converter, without the events it leaves to Python (every event with a document that does
    not fit the schema: the Python path reports those), and their positions; None when it is
    not built, not every event is raw, or it leaves every event to Python."""
    if not native.AVAILABLE or (plan.full_document is not None and plan.native_document is None):
        return None
    # A list of RawBSONDocuments, what a raw-reading stream delivers, goes as it is; ChangeEvents
    # are unwrapped first, which costs a pass in Python.
    converted = native.convert(events, json_mode, plan.native_document) if type(events) is list else None
    if converted is None:
        if type(events) is list and not any(isinstance(event, ChangeEvent) for event in events):
            return None  # not every event is raw: nothing to convert here
        converted = native.convert(_raw(events), json_mode, plan.native_document)
    if isinstance(converted, str):
        log.debug("%d raw events converted in Python: %s", len(events), converted)
        return None
    if converted is None:
        return None
    columns, left = converted
    if left:
        index, reason = left[0]
        log.debug(
            "%d of %d raw events converted in Python; event %d: %s", len(left), len(events), index, reason
        )
    if plan.corrupt_record:
        columns.append(pa.nulls(len(events) - len(left), type=pa.string()))
    return pa.Table.from_arrays(columns, schema=plan.schema), tuple(index for index, _ in left)


def _put_back(table: Any, rest: Any, positions: tuple[int, ...]) -> Any:
    """The rows of ``table`` with the rows of ``rest`` put back at ``positions`` (ascending):
    one table in event order, each column copied once (a gather by row index costs several
    times as much)."""
    pieces = []
    start = 0
    for k, position in enumerate(positions):
        end = position - k  # the converted rows before this one
        if end > start:
            pieces.append(table.slice(start, end - start))
        pieces.append(rest.slice(k, 1))
        start = end
    if start < table.num_rows:
        pieces.append(table.slice(start))
    merged = pa.concat_tables(pieces)
    return pa.Table.from_arrays(
        [pa.concat_arrays(column.chunks) for column in merged.columns], schema=table.schema
    )


def _decoded(
    raws: list[Mapping[str, Any]], positions: Sequence[int] | None = None
) -> list[Mapping[str, Any]]:
    """Every RawBSONDocument decoded with :data:`~flowwarden.spark.native.DECODE_OPTIONS`
    (whatever codec options it carries): the Python path's input, also for mixed batches.
    ``positions``: where each of ``raws`` is in the batch (default: ``raws`` is the batch)."""
    out: list[Mapping[str, Any]] = []
    for index, raw in enumerate(raws):
        if not isinstance(raw, RawBSONDocument):
            out.append(raw)
            continue
        try:
            decoded: dict[str, Any] = bson.decode(raw.raw, codec_options=native.DECODE_OPTIONS)
        except InvalidBSON as error:
            raise UndecodableEventError(positions[index] if positions else index, str(error)) from error
        out.append(decoded)
    return out


def _token_data(raws: list[Mapping[str, Any]]) -> list[str]:
    try:
        return [raw["_id"]["_data"] for raw in raws]
    except (KeyError, TypeError):
        for index, raw in enumerate(raws):
            token = raw.get("_id") if isinstance(raw, Mapping) else None
            if not isinstance(token, Mapping) or not isinstance(token.get("_data"), str):
                raise InvalidTokenError(
                    f"event {index} of the batch has no resume token _id._data (got {token!r}); "
                    "a pipeline stage must not remove or rewrite _id"
                ) from None
        raise


def _document_keys(keys: list[Any], json: Encoder) -> list[str | None]:
    """Extended JSON of each documentKey; the common ``{_id: ObjectId}`` without the encoder
    (the text is the same: the tests compare both paths)."""
    out: list[str | None] = []
    append = out.append
    for key in keys:
        if type(key) is dict and len(key) == 1:
            oid = key.get("_id")
            if type(oid) is ObjectId:
                append(f'{{"_id":{{"$oid":"{oid.binary.hex()}"}}}}')
                continue
        append(json(key) if key is not None else None)
    return out


def events_to_arrow(
    events: Sequence[Mapping[str, Any] | ChangeEvent],
    *,
    schema: Any = None,
    mode: SchemaMode | str = SchemaMode.PERMISSIVE,
    json_mode: JsonMode | str = JsonMode.CANONICAL,
) -> ArrowBatch:
    """Convert a batch of change events into an Arrow table with the change-event columns.

    ``events`` are raw change documents as PyMongo decodes them (``ChangeEvent.raw``),
    ``bson.raw_bson.RawBSONDocument`` events as a raw-reading change stream delivers them, or
    :class:`~flowwarden.events.ChangeEvent` objects over either. A batch of RawBSONDocuments
    with ``schema=None`` goes through the compiled converter when it is built
    (:mod:`flowwarden.spark.native`); every other batch, and any batch the compiled converter
    leaves to Python, is decoded with :data:`~flowwarden.spark.native.DECODE_OPTIONS` and
    converted in Python, to the same table. Bytes PyMongo cannot decode raise
    :class:`UndecodableEventError`. ``schema`` types ``full_document`` and
    ``full_document_before_change``: a pydantic model class, a pyspark ``StructType`` or a
    pyarrow ``Schema``; None keeps both as Extended JSON strings (``json_mode``, canonical by
    default: lossless).

    ``mode`` decides the fate of an event whose document does not fit ``schema``:
    PERMISSIVE keeps the row with nulls where values did not fit and the document's Extended
    JSON in ``_corrupt_record``; DROPMALFORMED leaves the row out; FAILFAST raises
    :class:`~flowwarden.errors.SchemaMismatchError` naming the field and the event's token,
    for the first such event in batch order. Both other modes report the rows in
    :attr:`ArrowBatch.malformed`. Table rows keep the order of ``events``.
    """
    mode = SchemaMode(mode)
    json_mode = JsonMode(json_mode)
    plan = _plan(schema, mode, json_mode)
    converted = _native_table(events, plan, json_mode)
    if converted is None:
        table, malformed = _python_table(_decoded(_raw(events)), plan, json_mode)
    else:
        table, positions = converted
        malformed = ()
        if positions:
            rest, rest_malformed = _python_table(
                _decoded(_raw([events[i] for i in positions]), positions), plan, json_mode
            )
            table = _put_back(table, rest, positions)
            malformed = tuple(dataclasses.replace(row, index=positions[row.index]) for row in rest_malformed)
    if malformed and mode is SchemaMode.FAILFAST:
        first = malformed[0]
        raise SchemaMismatchError(field=first.field, token=first.token, index=first.index, reason=first.error)
    if malformed and mode is SchemaMode.DROPMALFORMED:
        dropped = {row.index for row in malformed}
        keep = [i for i in range(table.num_rows) if i not in dropped]
        table = table.take(pa.array(keep, type=pa.int64()))
    return ArrowBatch(table, malformed)


def _python_table(
    raws: list[Mapping[str, Any]], plan: _Plan, json_mode: JsonMode
) -> tuple[Any, tuple[MalformedRow, ...]]:
    """The table of decoded events, with every row (the malformed ones with nulls where values
    did not fit and, when the plan has one, their Extended JSON in ``_corrupt_record``), and
    the malformed rows in event order."""
    json = encoder_for(json_mode)
    count = len(raws)

    ids = _token_data(raws)
    operation, cluster, wall, ns, keys, updates, full, before = _columns_reader(_EVENT_KEYS)(raws, None)
    cluster_us = [ts.time * 1_000_000 if type(ts) is Timestamp else None for ts in cluster]
    namespaces = [n if n is not None else {} for n in ns]

    problems = _Problems()
    owners = range(count)
    if plan.full_document is None or plan.before_change is None:
        full_array = pa.array([json(d) if d is not None else None for d in full], type=pa.string())
        before_array = pa.array([json(d) if d is not None else None for d in before], type=pa.string())
        full_misfits: set[int] = set()
    else:
        full_array = plan.full_document.build(full, owners, problems)
        full_misfits = set(problems.first)
        before_array = plan.before_change.build(before, owners, problems)

    arrays = [
        pa.array(ids, type=pa.string()),
        pa.array(operation, type=pa.string()),
        pa.array(cluster_us, type=pa.timestamp("us", tz="UTC")),
        pa.array([w if isinstance(w, datetime) else None for w in wall], type=pa.timestamp("us", tz="UTC")),
        pa.array([ns.get("db") for ns in namespaces], type=pa.string()),
        pa.array([ns.get("coll") for ns in namespaces], type=pa.string()),
        pa.array(_document_keys(keys, json), type=pa.string()),
        full_array,
        before_array,
        pa.array(
            [json(u.get("updatedFields")) if u is not None else None for u in updates],
            type=pa.string(),
        ),
        pa.array(
            [u.get("removedFields") if u is not None else None for u in updates],
            type=pa.list_(pa.field("element", pa.string())),
        ),
    ]

    malformed = tuple(
        MalformedRow(index, raws[index]["_id"], path, reason)
        for index, (path, reason) in sorted(problems.first.items())
    )
    if plan.corrupt_record:
        corrupt: list[str | None] = [None] * count
        for row in malformed:
            document = full[row.index] if row.index in full_misfits else before[row.index]
            corrupt[row.index] = json(document)
        arrays.append(pa.array(corrupt, type=pa.string()))
    return pa.Table.from_arrays(arrays, schema=plan.schema), malformed
