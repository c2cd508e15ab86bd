"""Text as clients sent it: strings and field names that are not valid UTF-8, kept byte for byte.

mongod checks the structure of the BSON it receives, not the UTF-8 of its text (only its full
BSON checks look, such as ``validate`` with ``checkBSONConformance``), so a string or a field name
holding bytes that are not UTF-8 is stored as given and every read returns those bytes. The
server decodes requests with :data:`DECODE_ERRORS`: each such byte becomes a lone surrogate in a
Python ``str``, which the query engine compares, copies and stores like any other text (equal
bytes, equal strings). :func:`encode` writes such text back as the original bytes;
:func:`text_bytes` does the same for one string. Sorts and range comparisons order text by code
point where mongod compares bytes: the two agree except between such text and other non-ASCII
text.

Hard rule: BSON the server builds from stored data is written by :func:`encode`, never by
``bson.encode`` alone, which refuses lone surrogates. Its fast path is ``bson.encode`` itself:
only a document that call refuses is walked, and within it only the values that hold such text.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import bson
from bson import Code, DBRef, Regex
from bson.errors import InvalidDocument

__all__ = ["DECODE_ERRORS", "encode", "encode_embedded", "text_bytes"]

DECODE_ERRORS = "surrogateescape"
"""The ``unicode_decode_error_handler`` requests are decoded with: undecodable bytes survive."""

_INT32 = struct.Struct("<i")
_STRING = b"\x02"
_DOCUMENT = b"\x03"
_ARRAY = b"\x04"
_REGEX = b"\x0b"
_CODE = b"\x0d"
_CODE_WITH_SCOPE = b"\x0f"


def text_bytes(value: str) -> bytes:
    """The bytes a decoded string came from: its UTF-8, lone surrogates back to their bytes."""
    return value.encode("utf-8", DECODE_ERRORS)


def encode(doc: Mapping[str, Any]) -> bytes:
    """``bson.encode(doc)``, also for a document holding text that is not UTF-8 (the bytes the
    client sent are written back). A top-level ``_id`` goes first, as ``bson.encode`` puts it."""
    try:
        return bson.encode(doc)
    except UnicodeEncodeError:
        return _document(doc, top_level=True)


def encode_embedded(doc: Mapping[str, Any]) -> bytes:
    """The BSON of ``doc`` as an embedded document: its fields in their own order, where
    :func:`encode` would move ``_id`` first."""
    try:
        if "_id" not in doc or next(iter(doc)) == "_id":
            return bson.encode(doc)
        return bson.encode({"d": doc})[7:-1]  # top-level encoding would move _id first
    except UnicodeEncodeError:
        return _document(doc, top_level=False)


def _document(doc: Mapping[str, Any], *, top_level: bool) -> bytes:
    if top_level and "_id" in doc:
        parts = [_element("_id", doc["_id"])]
        parts += (_element(key, value) for key, value in doc.items() if key != "_id")
    else:
        parts = [_element(key, value) for key, value in doc.items()]
    return _framed(b"".join(parts))


def _array(values: list[Any] | tuple[Any, ...]) -> bytes:
    return _framed(b"".join(_element(str(index), value) for index, value in enumerate(values)))


def _framed(body: bytes) -> bytes:
    return _INT32.pack(len(body) + 5) + body + b"\x00"


def _cstring(text: str, what: str) -> bytes:
    data = text_bytes(text)
    if b"\x00" in data:
        raise InvalidDocument(f"{what} must not contain the NULL byte: {text!r}")
    return data + b"\x00"


def _string(text: str) -> bytes:
    data = text_bytes(text)
    return _INT32.pack(len(data) + 1) + data + b"\x00"


def _element(name: Any, value: Any) -> bytes:
    """One element, type byte to last value byte. Values without such text are written by
    ``bson.encode`` (under an empty name, which is then replaced); only the rest is walked."""
    if not isinstance(name, str):
        raise InvalidDocument(f"documents must have only string keys, key was {name!r}")
    key = _cstring(name, "key names")
    try:
        element = bson.encode({"": value})
    except UnicodeEncodeError:
        pass
    else:
        return element[4:5] + key + element[6:-1]
    if isinstance(value, Code):
        if value.scope is None:
            return _CODE + key + _string(value)
        body = _string(value) + _document(value.scope, top_level=False)
        return _CODE_WITH_SCOPE + key + _INT32.pack(len(body) + 4) + body
    if isinstance(value, str):
        return _STRING + key + _string(value)
    if isinstance(value, Mapping):
        return _DOCUMENT + key + _document(value, top_level=False)
    if isinstance(value, (list, tuple)):
        return _ARRAY + key + _array(value)
    if isinstance(value, DBRef):
        return _DOCUMENT + key + _document(value.as_doc(), top_level=False)
    if isinstance(value, Regex):
        # The flags as bson.encode spells them, from the same flags on an empty pattern.
        flags = bson.encode({"": Regex("", value.flags)})[7:-1]
        return _REGEX + key + _cstring(str(value.pattern), "regular expressions") + flags
    raise InvalidDocument(f"cannot encode {type(value).__name__} holding text that is not UTF-8")
