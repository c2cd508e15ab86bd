"""The compiled converter: raw change-event BSON straight to the change-event Arrow columns.

``flowwarden.spark.convert._native`` (C, built by ``pip install`` when a compiler is there, see
setup.py) reads each event's BSON bytes once and writes the Arrow buffers of every column;
this module wraps them as Arrow arrays without copying, and says whether the module is there
(:data:`AVAILABLE`).

Hard rule: a table from here equals, column for column and byte for byte, what the Python path
of :func:`~flowwarden.spark.convert.arrow.events_to_arrow` builds from the same events decoded with
:data:`DECODE_OPTIONS`. An event the C code does not convert exactly (a rare BSON type, bytes
``bson.decode`` would refuse, a document with a repeated key, a value that does not fit the
schema) is left out of the columns and listed in :attr:`Converted.left` with the reason; the
caller converts those events in Python and puts them back in their places. The differential
tests in tests/spark/convert/test_native*.py hold the two paths to the same output.

This module imports pyarrow, never pyspark.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import InvalidDocument
from bson.raw_bson import RawBSONDocument

from flowwarden.spark._extra import require
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.convert.valuespec import FieldSpec, Kind, ValueSpec
from flowwarden.spark.schema import EVENT_COLUMNS, change_event_arrow_schema

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

try:
    from flowwarden.spark.convert import _native
except ImportError:  # built without a compiler: the Python path converts every batch
    _native = None  # type: ignore[assignment]

__all__ = [
    "AVAILABLE",
    "DECODE_OPTIONS",
    "THREADS",
    "Converted",
    "Document",
    "compile_document",
    "convert",
    "pooled_memory",
    "release_memory",
]

AVAILABLE: bool = _native is not None
"""Whether the compiled converter is installed (``False``: every batch converts in Python)."""

THREADS: int = min(os.cpu_count() or 1, 8)
"""How many threads convert one large batch (a slice of at least 2048 events each)."""

DECODE_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
"""How raw events are decoded for the Python path: PyMongo's defaults (naive UTC datetimes,
binary subtypes 3 and 4 as ``Binary``), except that a date outside years 1-9999 becomes a
``DatetimeMS`` instead of failing the batch: its Extended JSON is the ``$numberLong`` form, and
a timestamp column takes it as null (``wall_time``) or as a value that does not fit."""

# The document's bytes are read from its private slot when it is one (a property call per event
# costs a fifth of the whole conversion), else through the public ``raw`` property.
_RAW_SLOT = vars(RawBSONDocument).get("_RawBSONDocument__raw")
if type(_RAW_SLOT).__name__ != "member_descriptor":
    _RAW_SLOT = None

_STRING = pa.string()
_KINDS = tuple(field.type for field in change_event_arrow_schema())
"""The Arrow types of the columns _native.c writes, in its order (EVENT_COLUMNS), with both
document columns as Extended JSON strings."""


# Kind codes and default kinds as _native.c numbers them.
_KIND_CODES = {
    Kind.STRING: 1,
    Kind.UUID: 2,
    Kind.JSON: 3,
    Kind.INT8: 4,
    Kind.INT16: 5,
    Kind.INT32: 6,
    Kind.INT64: 7,
    Kind.FLOAT: 8,
    Kind.DOUBLE: 9,
    Kind.BOOL: 10,
    Kind.TIMESTAMP: 11,
    Kind.TIMESTAMP_NTZ: 12,
    Kind.DATE: 13,
    Kind.DECIMAL: 14,
    Kind.BINARY: 15,
    Kind.LIST: 16,
    Kind.MAP: 17,
    Kind.STRUCT: 18,
}
_DOCUMENT_COLUMNS = (EVENT_COLUMNS.index("full_document"), EVENT_COLUMNS.index("full_document_before_change"))
_NO_DEFAULT, _NULL_DEFAULT, _BSON_DEFAULT, _PYTHON_DEFAULT = range(4)

Document = tuple[tuple[Any, ...], Any]
"""A typed full document for :func:`convert`: the compiled plan and the struct's Arrow type."""


def _default(field: FieldSpec) -> tuple[int, bytes | None]:
    """What a missing key gives: nothing, null, a BSON value the C code converts like a present
    one, or "ask Python" (a default factory, or a default BSON does not carry exactly, such as
    a Decimal or a datetime with microseconds)."""
    if not field.has_default:
        return _NO_DEFAULT, None
    if field.default_factory is not None:
        return _PYTHON_DEFAULT, None
    if field.default is None:
        return _NULL_DEFAULT, None
    try:
        data = bson.encode({"v": field.default})
    except (InvalidDocument, TypeError, OverflowError, ValueError):
        return _PYTHON_DEFAULT, None
    if repr(bson.decode(data, codec_options=DECODE_OPTIONS)["v"]) != repr(field.default):
        return _PYTHON_DEFAULT, None
    return _BSON_DEFAULT, data


def _program(spec: ValueSpec) -> tuple[Any, ...]:
    choices = None
    if spec.choices is not None:
        choices = tuple(c.encode() if isinstance(c, str) else c for c in spec.choices)
    child = _program(spec.element) if spec.element is not None else None
    fields = tuple(
        (field.key.encode(), _program(field.value), int(field.none_ok), *_default(field))
        for field in spec.fields
    )
    return (
        _KIND_CODES[spec.kind],
        int(spec.element_nullable),
        spec.precision,
        spec.scale,
        choices,
        child,
        fields,
    )


def compile_document(spec: ValueSpec, arrow_type: Any) -> Document:
    """The plan the C code follows for a typed full document (compile once per schema)."""
    return _program(spec), arrow_type


def _buffer(data: bytes | None) -> Any:
    return None if data is None else pa.py_buffer(data)


def _array(kind: Any, count: int, column: tuple[Any, ...]) -> Any:
    """The array of one default column; list columns hold strings (removed_fields) or
    {field, new_size} structs (truncated_arrays), neither with a null element."""
    if not pa.types.is_list(kind):
        validity, nulls = column[0], column[1]
        return pa.Array.from_buffers(kind, count, [_buffer(validity), *map(pa.py_buffer, column[2:])], nulls)
    sizes = None
    if pa.types.is_struct(kind.value_type):
        column, sizes = column
    validity, nulls, offsets, elements, element_offsets, element_data = column
    values = pa.Array.from_buffers(
        _STRING, elements, [None, pa.py_buffer(element_offsets), pa.py_buffer(element_data)], 0
    )
    if sizes is not None:
        new_sizes = pa.Array.from_buffers(pa.int32(), elements, [None, pa.py_buffer(sizes)], 0)
        values = pa.StructArray.from_arrays([values, new_sizes], fields=list(kind.value_type))
    return pa.Array.from_buffers(
        kind, count, [_buffer(validity), pa.py_buffer(offsets)], nulls, children=[values]
    )


def _typed_array(kind: Any, column: tuple[Any, ...]) -> Any:
    """The array of one node of a typed plan: (validity, nulls, length, buffers, children)."""
    validity, nulls, count, buffers, children = column
    if count and nulls == count:
        # What the Python path builds for a column without a value; Spark also reads an all-null
        # struct of pa.nulls twice as fast as one with all-null children of their own.
        return pa.nulls(count, type=kind)
    head = [_buffer(validity), *map(pa.py_buffer, buffers)]
    if pa.types.is_struct(kind):
        arrays = [_typed_array(field.type, child) for field, child in zip(kind, children, strict=True)]
        return pa.Array.from_buffers(kind, count, head, nulls, children=arrays)
    if pa.types.is_map(kind):
        keys = _typed_array(_STRING, children[0])
        items = _typed_array(kind.item_type, children[1])
        entries = pa.StructArray.from_arrays([keys, items], fields=[kind.key_field, kind.item_field])
        return pa.Array.from_buffers(kind, count, head, nulls, children=[entries])
    if pa.types.is_list(kind):
        return pa.Array.from_buffers(
            kind, count, head, nulls, children=[_typed_array(kind.value_type, children[0])]
        )
    return pa.Array.from_buffers(kind, count, head, nulls)


class Converted(NamedTuple):
    """What :func:`convert` made of a batch."""

    columns: list[Any]
    """The change-event columns (:data:`~flowwarden.spark.schema.EVENT_COLUMNS`) of every event
    not in ``left``, in event order."""
    left: tuple[tuple[int, str], ...]
    """(index in the batch, reason) of each event left to Python, in event order."""


def convert(
    events: list[Any], json_mode: JsonMode, document: Document | None = None, *, closed: bool = False
) -> Converted | str | None:
    """The change-event columns of ``events``, when every event is a ``RawBSONDocument``: None
    when one is not (nothing converted). An event the compiled converter leaves to Python (any
    event with a value that does not fit ``document`` is one: the Python path reports misfits)
    is not in the columns but in :attr:`Converted.left`; when every event is, the result is a
    str naming the first and why. ``document`` types both full-document columns
    (:func:`compile_document`); None writes them as Extended JSON. ``closed``: an event whose
    typed document has a key the plan does not name is left to Python too (which rescues it,
    see :mod:`flowwarden.spark.convert.rescue`). Large batches are converted
    in :data:`THREADS` slices at once (the GIL is released), and their columns are chunked
    arrays with one chunk per slice. Never call it when :data:`AVAILABLE` is false."""
    assert _native is not None, "flowwarden.spark.convert._native is not built"
    program = document[0] if document is not None else None
    result = _native.convert(
        events, json_mode is JsonMode.RELAXED, RawBSONDocument, _RAW_SLOT, program, THREADS, closed
    )
    if result is None or isinstance(result, str):
        return result
    left = tuple(event for _, _, slice_left in result for event in slice_left)
    slices = [_slice_arrays(count, columns, document) for count, columns, _ in result]
    if len(slices) == 1:
        return Converted(slices[0], left)
    chunked = [pa.chunked_array(chunks, type=chunks[0].type) for chunks in zip(*slices, strict=True)]
    return Converted(chunked, left)


def pooled_memory() -> tuple[int, int]:
    """How many output blocks the compiled converter keeps for reuse, and their bytes.

    Writing into fresh memory costs a page fault per 4 KiB page on first touch, about a fifth of
    a conversion. So output blocks of 1 MiB or more (the large columns of a batch of a few
    thousand events) return to a pool when their Arrow buffers are released, and the next batch
    is written into them. The pool keeps at most 256 MiB; (0, 0) without the compiled module."""
    return _native.pool() if _native is not None else (0, 0)


def release_memory() -> int:
    """Free every block the pool keeps (after a large backfill, say); returns their bytes."""
    return _native.release_memory() if _native is not None else 0


def _slice_arrays(count: int, columns: tuple[Any, ...], document: Document | None) -> list[Any]:
    return [
        _typed_array(document[1], column)
        if document is not None and index in _DOCUMENT_COLUMNS
        else _array(kind, count, column)
        for index, (kind, column) in enumerate(zip(_KINDS, columns, strict=True))
    ]
