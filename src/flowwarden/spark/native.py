"""The compiled converter: raw change-event BSON straight to the change-event Arrow columns.

``flowwarden.spark._native`` (C, built by ``pip install`` when a compiler is there, see
setup.py) reads each event's BSON bytes once and writes the Arrow buffers of every column;
this module wraps them as Arrow arrays without copying, and says whether the module is there
(:data:`AVAILABLE`).

Hard rule: a table from here equals, column for column and byte for byte, what the Python path
of :func:`~flowwarden.spark.arrow.events_to_arrow` builds from the same events decoded with
:data:`DECODE_OPTIONS`. Whatever the C code does not convert exactly (a rare BSON type, bytes
``bson.decode`` would refuse, a document with a repeated key) makes :func:`convert` return the
reason instead of a table, and the caller converts the batch in Python. The differential tests
in tests/spark/test_native*.py hold the two paths to the same output.

This module imports pyarrow, never pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

from flowwarden.spark._extra import require
from flowwarden.spark.extjson import JsonMode

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

try:
    from flowwarden.spark import _native
except ImportError:  # built without a compiler: the Python path converts every batch
    _native = None  # type: ignore[assignment]

__all__ = ["AVAILABLE", "DECODE_OPTIONS", "convert"]

AVAILABLE: bool = _native is not None
"""Whether the compiled converter is installed (``False``: every batch converts in Python)."""

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
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_STRING_LIST = pa.list_(pa.field("element", pa.string()))
_KINDS = (
    _STRING,  # _id
    _STRING,  # operation_type
    _TIMESTAMP,  # cluster_time
    _TIMESTAMP,  # wall_time
    _STRING,  # database
    _STRING,  # collection
    _STRING,  # document_key
    _STRING,  # full_document
    _STRING,  # full_document_before_change
    _STRING,  # updated_fields
    _STRING_LIST,  # removed_fields
)


def _buffer(data: bytes | None) -> Any:
    return None if data is None else pa.py_buffer(data)


def _array(kind: Any, count: int, column: tuple[Any, ...]) -> Any:
    validity, nulls = column[0], column[1]
    if kind is _STRING_LIST:
        _, _, offsets, elements, element_offsets, element_data = column
        strings = pa.Array.from_buffers(
            _STRING, elements, [None, pa.py_buffer(element_offsets), pa.py_buffer(element_data)], 0
        )
        return pa.Array.from_buffers(
            kind, count, [_buffer(validity), pa.py_buffer(offsets)], nulls, children=[strings]
        )
    return pa.Array.from_buffers(kind, count, [_buffer(validity), *map(pa.py_buffer, column[2:])], nulls)


def convert(events: list[Mapping[str, Any]], json_mode: JsonMode) -> list[Any] | str | None:
    """The eleven change-event columns of ``events`` with Extended JSON ``full_document``,
    when every event is a ``RawBSONDocument``: None when one is not (nothing converted), a str
    naming the event the compiled converter leaves to Python and why. Never call it when
    :data:`AVAILABLE` is false."""
    assert _native is not None, "flowwarden.spark._native is not built"
    result = _native.convert(events, json_mode is JsonMode.RELAXED, RawBSONDocument, _RAW_SLOT)
    if result is None or isinstance(result, str):
        return result
    count = len(events)
    return [_array(kind, count, column) for kind, column in zip(_KINDS, result, strict=True)]
