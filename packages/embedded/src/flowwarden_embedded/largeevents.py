"""Change events over 16 MB, as mongod 7.0 treats them: refused whole, or split into fragments.

A stream without ``$changeStreamSplitLargeEvent`` fails on an event whose BSON is over
:data:`~flowwarden_embedded.limits.MAX_INTERNAL_OBJECT_SIZE` (16 MiB + 16 KiB) with
BSONObjectTooLarge (10334): :func:`too_large`. A stream with it gets an event over
:data:`~flowwarden_embedded.limits.MAX_CHANGE_EVENT_SIZE` (16 MiB + 8 KiB) as fragments:
:func:`split_event`, mongod's ``change_stream_split_event::splitChangeEvent``:

* the event's top-level fields but ``_id``, ordered by the size of their BSON element and then by
  name, go greedily into fragments: each fragment takes fields until the next one would push it
  over the limit, and at least one (so the first fragment holds the most, smallest, fields);
* a fragment is ``{_id: <its token>, splitEvent: {fragment: n, of: total}, <fields>}``, ``n``
  counting from 1, its token the event's with ``fragmentNum`` ``n - 1``;
* the limit is 16 MiB + 8 KiB less the BSON of the event's token, and mongod counts a fragment's
  size with its ``$sortKey`` (the token once more), which never reaches the client;
* a field too big for any fragment fails the stream with code 7182500.

Nothing here decides what an event contains or where a stream stands: it reads and cuts BSON.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from typing import Any

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import format_value
from flowwarden_embedded.limits import MAX_CHANGE_EVENT_SIZE, object_too_large_message
from flowwarden_embedded.rawstrings import DECODE_ERRORS, text_bytes
from flowwarden_embedded.tokens import fragment_token_data

Fragment = tuple[RawBSONDocument, dict[str, str]]
"""One fragment of a split event and its resume token."""

_INT32 = struct.Struct("<i")
_TEXT_AS_SENT: CodecOptions[dict[str, Any]] = CodecOptions(unicode_decode_error_handler=DECODE_ERRORS)
# BSON element types whose value has a fixed size, and that size.
_FIXED_SIZES = {
    0x01: 8,  # double
    0x06: 0,  # undefined
    0x07: 12,  # ObjectId
    0x08: 1,  # bool
    0x09: 8,  # date
    0x0A: 0,  # null
    0x10: 4,  # int32
    0x11: 8,  # timestamp
    0x12: 8,  # int64
    0x13: 16,  # decimal128
    0x7F: 0,  # MaxKey
    0xFF: 0,  # MinKey
}
_LENGTH_PREFIXED = frozenset({0x02, 0x0D, 0x0E})  # string, code, symbol: int32 length, then bytes
_SELF_SIZED = frozenset({0x03, 0x04, 0x0F})  # document, array, code with scope: int32 counts itself
# mongod prints at most this many characters of a long string in an error message.
_SHOWN_STRING_CHARS = 150
_ID_ELEMENT = b"\x03_id\x00"
_SPLIT_EVENT_ELEMENT = b"\x03splitEvent\x00"


def _elements(document: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The top-level elements of a BSON document, in order: ``(name, whole element)``, sliced
    from ``document`` without decoding a value."""
    pos = 4
    end = len(document) - 1
    while pos < end:
        kind = document[pos]
        name_end = document.index(0, pos + 1)
        value = name_end + 1
        if kind in _FIXED_SIZES:
            after = value + _FIXED_SIZES[kind]
        elif kind in _LENGTH_PREFIXED:
            after = value + 4 + _INT32.unpack_from(document, value)[0]
        elif kind in _SELF_SIZED:
            after = value + _INT32.unpack_from(document, value)[0]
        elif kind == 0x05:  # binary: int32 length, subtype, bytes
            after = value + 5 + _INT32.unpack_from(document, value)[0]
        elif kind == 0x0B:  # regex: pattern and options, two C strings
            after = document.index(0, document.index(0, value) + 1) + 1
        elif kind == 0x0C:  # DBPointer: a string, then an ObjectId
            after = value + 4 + _INT32.unpack_from(document, value)[0] + 12
        else:
            raise ValueError(f"BSON element type {kind:#x} is not one a change event holds")
        yield document[pos + 1 : name_end], document[pos:after]
        pos = after


def _show(value: Any) -> str:
    """A value as mongod's ``BSONElement::toString`` prints it in an error message."""
    if isinstance(value, str):
        text = text_bytes(value)
        if len(text) + 1 > 160:
            return '"' + text[:_SHOWN_STRING_CHARS].decode("utf-8", DECODE_ERRORS) + '..."'
        return f'"{value}"'
    if isinstance(value, Mapping):
        inner = ", ".join(f"{key}: {_show(item)}" for key, item in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    return format_value(value)


def too_large(event: bytes) -> CommandError:
    """BSONObjectTooLarge for an event over the limit, worded as mongod words it."""
    name, element = next(_elements(event))
    key = name.decode("utf-8", DECODE_ERRORS)
    value = bson.decode(_INT32.pack(len(element) + 5) + element + b"\x00", codec_options=_TEXT_AS_SENT)[key]
    shown = f"{key}: {_show(value)}"
    return CommandError(10334, object_too_large_message(len(event), shown))


def split_event(event: bytes, token_data: str) -> list[Fragment]:
    """The fragments of an event over :data:`MAX_CHANGE_EVENT_SIZE`, first to last.

    ``token_data`` is the ``_data`` of the event's own resume token.
    """
    limit = MAX_CHANGE_EVENT_SIZE - len(bson.encode({"_data": token_data}))
    fields = sorted((len(element), name, element) for name, element in _elements(event) if name != b"_id")
    if not fields:
        raise CommandError(7182502, "Cannot split an empty event or an event containing solely '_id' field")
    groups: list[tuple[dict[str, str], list[bytes]]] = []
    index = 0
    while index < len(fields):
        token = {"_data": fragment_token_data(token_data, len(groups))}
        head = {"_id": token, "splitEvent": {"fragment": len(groups) + 1, "of": 0}, "$sortKey": [token]}
        size = len(bson.encode(head))
        members: list[bytes] = []
        while True:
            field_size, _, element = fields[index]
            members.append(element)
            size += field_size
            index += 1
            if index == len(fields) or size + fields[index][0] > limit:
                break
        if size > limit:
            raise CommandError(
                7182500,
                f"Splitting change event failed: fragment size {size} is greater than maximum allowed "
                f"fragment size {limit}",
            )
        groups.append((token, members))
    total = len(groups)
    fragments: list[Fragment] = []
    for number, (token, members) in enumerate(groups, start=1):
        body = b"".join(
            (
                _ID_ELEMENT,
                bson.encode(token),
                _SPLIT_EVENT_ELEMENT,
                bson.encode({"fragment": number, "of": total}),
                *members,
            )
        )
        fragments.append((RawBSONDocument(_INT32.pack(len(body) + 5) + body + b"\x00"), token))
    return fragments


__all__ = ["Fragment", "split_event", "too_large"]
