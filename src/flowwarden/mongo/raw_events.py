"""Change events kept as the BSON the server sent, read a field at a time.

Streams whose events go to Arrow (``@on_dataframe``, the Spark source) never need them as dicts:
the converter reads their bytes. Yet PyMongo reads every event's ``_id`` (its resume token),
and the read loop its ``operationType``; on a ``RawBSONDocument`` either read decodes every
top-level field and keeps them: a dict and one ``RawBSONDocument`` per sub-document, about eight
objects per event, which cost more than the read itself, and far more once events wait in a
batch and the cyclic garbage collector visits them on every collection.

:class:`RawEvent` answers a top-level lookup by walking the top-level elements to the one asked
for and decoding that one alone (a token or a string: no object the collector tracks), and
decodes the whole top level, as ``RawBSONDocument`` does, only for anything else.
:func:`lean` drops what was decoded from any ``RawBSONDocument``.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import Struct
from typing import Any

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

__all__ = ["RAW_EVENT_OPTIONS", "RawEvent", "lean", "value_size"]

_INT32 = Struct("<i")
_DOCUMENT, _STRING = 0x03, 0x02
# The size of the value of each fixed-size BSON type.
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}
_FIXED.update({0x7F: 0, 0xFF: 0})

_INFLATED = vars(RawBSONDocument).get("_RawBSONDocument__inflated_doc")

# Sub-documents looked up are decoded leniently: a document key whose text is not UTF-8 still
# compares equal to the same _id read from the collection with surrogateescape.
_LENIENT: CodecOptions[dict[str, Any]] = CodecOptions(unicode_decode_error_handler="surrogateescape")

_MISSING = object()
_UNKNOWN = object()


def value_size(kind: int, data: bytes, start: int) -> int | None:
    """The size of the value of BSON type ``kind`` starting at ``data[start]`` (the byte after the
    element's name); None for a type it does not know."""
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return fixed
    if kind in (0x02, 0x0D, 0x0E):  # string, code, symbol: an int32 length, then the bytes
        return 4 + int(_INT32.unpack_from(data, start)[0])
    if kind in (0x03, 0x04, 0x0F):  # document, array, code with scope: an int32 of the whole
        return int(_INT32.unpack_from(data, start)[0])
    if kind == 0x05:  # binary: an int32 length, a subtype byte, the bytes
        return 5 + int(_INT32.unpack_from(data, start)[0])
    if kind == 0x0C:  # DBPointer: a string, then an ObjectId
        return 4 + int(_INT32.unpack_from(data, start)[0]) + 12
    if kind == 0x0B:  # regular expression: two C strings
        return data.index(0, data.index(0, start) + 1) + 1 - start
    return None


class RawEvent(RawBSONDocument):
    """A ``RawBSONDocument`` whose ``_id``, ``operationType``, ``documentKey`` and ``ns`` are read
    without decoding the rest.

    ``event["_id"]`` is a plain dict (``{"_data": "<hex>"}``), as in a decoded event, and so are
    ``event["documentKey"]`` and ``event["ns"]``; every other field reads as it does from a
    ``RawBSONDocument``. The token and the operation are looked up once and kept (the driver, the
    read loop and the batch each read them): a token as its ``_data`` string, handed out as a new
    dict every time, so no reader can change what the next one gets.
    """

    __slots__ = ("_operation", "_token_data")

    def __init__(self, bson_bytes: bytes | memoryview, codec_options: Any = None) -> None:
        super().__init__(bson_bytes, codec_options)
        self._token_data: str | None = None  # None: not looked up yet
        self._operation: str | None = None

    def __getitem__(self, key: str) -> Any:
        if key == "_id":
            data = self._token_data
            if data is None:
                token = _lookup(self.raw, key)
                if token is _MISSING:
                    raise KeyError(key)
                if token is _UNKNOWN:
                    return super().__getitem__(key)
                data = token.get("_data") if isinstance(token, dict) and len(token) == 1 else None
                if not isinstance(data, str):
                    return token  # not a resume token: read again each time
                self._token_data = data
            return {"_data": data}
        if key == "operationType":
            operation = self._operation
            if operation is None:
                operation = _lookup(self.raw, key)
                if operation is _MISSING:
                    raise KeyError(key)
                if operation is _UNKNOWN:
                    return super().__getitem__(key)
                if not isinstance(operation, str):
                    return operation
                self._operation = operation
            return operation
        if key == "documentKey" or key == "ns":
            value = _lookup(self.raw, key)
            if value is _MISSING:
                raise KeyError(key)
            if value is not _UNKNOWN:
                return value
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


RAW_EVENT_OPTIONS: CodecOptions[Any] = CodecOptions(document_class=RawEvent)
"""Codec options for change streams whose events are read as :class:`RawEvent`."""


def _lookup(raw: bytes | memoryview, key: str) -> Any:
    """The top-level field ``key`` of ``raw`` (a document or a string), ``_MISSING`` when there is
    none, ``_UNKNOWN`` when it is of another type or the walk meets a type it does not size."""
    wanted = key.encode()
    data = raw if isinstance(raw, bytes) else bytes(raw)
    end = len(data) - 1
    pos = 4
    while pos < end:
        kind = data[pos]
        name_end = data.index(0, pos + 1)
        value = name_end + 1
        if data[pos + 1 : name_end] == wanted:
            if kind == _DOCUMENT:
                length = _INT32.unpack_from(data, value)[0]
                return bson.decode(data[value : value + length], codec_options=_LENIENT)
            if kind == _STRING:
                length = _INT32.unpack_from(data, value)[0]
                return data[value + 4 : value + 3 + length].decode()
            return _UNKNOWN
        size = value_size(kind, data, value)
        if size is None:
            return _UNKNOWN
        pos = value + size
    return _MISSING


def lean(change: Mapping[str, Any]) -> Mapping[str, Any]:
    """``change`` without the fields decoded from it so far, when it is a ``RawBSONDocument``.

    A field read later is decoded again. ``RawBSONDocument`` keeps its decoded fields in a
    private slot; should a PyMongo release rename it, an undecoded copy is made instead.
    """
    if not isinstance(change, RawBSONDocument):
        return change
    if _INFLATED is not None:
        _INFLATED.__set__(change, None)
        return change
    return type(change)(change.raw)
