"""MongoDB wire-protocol framing for the embedded replica set: parse requests, build replies.

This module owns bytes only: message headers, OP_MSG sections and checksums, the legacy OP_QUERY
handshake and its OP_REPLY, and OP_COMPRESSED unwrapping. It never interprets a command. Any byte
sequence it cannot parse raises :class:`MalformedMessage`, and the server closes only the
connection that sent it. A well-framed request holding an object over the request limit raises
:class:`ObjectTooLarge` instead, which the server answers, as MongoDB does.

Hard rule: the work a message costs is bounded by its size on the wire and the limits, never by
what it claims. A compressed payload is inflated to its declared size and one byte past it at
most, and every byte is checked by compiled code, so a hostile message holds up the server's
other clients for milliseconds.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import bson
import google_crc32c
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import BSONError

from flowwarden_embedded.keys import format_value
from flowwarden_embedded.limits import (
    MAX_MESSAGE_SIZE,
    MAX_REQUEST_OBJECT_SIZE,
    object_too_large_message,
)
from flowwarden_embedded.rawstrings import DECODE_ERRORS

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

# OP_MSG flag bits.
CHECKSUM_PRESENT = 1 << 0
MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
_KNOWN_MSG_FLAGS = CHECKSUM_PRESENT | MORE_TO_COME | EXHAUST_ALLOWED
# The low 16 bits are "required" flags: a receiver must reject a message carrying one it does
# not know (the wire-protocol rule that keeps old servers from misreading new messages).
_REQUIRED_FLAG_MASK = 0xFFFF

HEADER = struct.Struct("<iiii")
HEADER_SIZE = HEADER.size
# The compressors ``hello`` can negotiate: zlib only, which is in the standard library and which
# every driver speaks. ``_ZLIB_ID`` is its id in OP_COMPRESSED headers.
SERVER_COMPRESSORS = ("zlib",)
_ZLIB_ID = 2

_INT32 = struct.Struct("<i")
_UINT32 = struct.Struct("<I")
_REPLY_PREFIX = struct.Struct("<iqii")
_COMPRESSION_HEADER = struct.Struct("<iiB")


class MalformedMessage(ValueError):
    """The bytes received are not a message this server can read; the connection is closed."""


class ObjectTooLarge(ValueError):
    """A request holds a BSON object over :data:`MAX_REQUEST_OBJECT_SIZE`.

    MongoDB reads the message but not the command, and answers it with BSONObjectTooLarge (10334);
    the connection stays open. This carries what the server needs to answer in kind.
    """

    def __init__(
        self,
        size: int,
        first_element: str,
        *,
        op_code: int,
        checksum: bool = False,
        more_to_come: bool = False,
    ) -> None:
        self.size = size
        self.op_code = op_code
        self.checksum = checksum
        self.more_to_come = more_to_come
        self.errmsg = object_too_large_message(size, first_element)
        super().__init__(self.errmsg)


@dataclass(slots=True)
class Request:
    """One decoded request: the command document plus what the reply must echo."""

    request_id: int
    op_code: int
    command: dict[str, Any]
    db: str
    more_to_come: bool = False
    exhaust_allowed: bool = False
    checksum: bool = False
    # Legacy OP_QUERY only: the collection name it addressed ("admin.$cmd").
    full_collection_name: str | None = None
    sequences: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


# Every BSON date is a valid int64 to MongoDB; the ones Python's datetime cannot hold (before
# year 1 or after 9999) are kept as DatetimeMS instead of failing the whole request. Text that is
# not UTF-8 is kept too, as mongod keeps it (see rawstrings): it is no reason to drop a connection.
_DECODE: CodecOptions[dict[str, Any]] = CodecOptions(
    datetime_conversion=DatetimeConversion.DATETIME_AUTO, unicode_decode_error_handler=DECODE_ERRORS
)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum OP_MSG uses when ``checksumPresent`` is set.

    Compiled code: the largest message costs milliseconds, not seconds.
    """
    return int(google_crc32c.value(data))


def parse_header(header: bytes) -> tuple[int, int, int, int]:
    """``(message_length, request_id, response_to, op_code)``; rejects impossible lengths."""
    length, request_id, response_to, op_code = HEADER.unpack(header)
    if length < HEADER_SIZE or length > MAX_MESSAGE_SIZE:
        raise MalformedMessage(f"message length {length} out of range")
    return length, request_id, response_to, op_code


def parse_message(
    request_id: int, op_code: int, message: bytes, compressors: Collection[str] = ()
) -> Request:
    """Decode one whole message (header included) into a :class:`Request`.

    ``compressors`` are the names the connection's ``hello`` negotiated; an OP_COMPRESSED message
    using any other is malformed.
    """
    body = memoryview(message)[HEADER_SIZE:]
    if op_code == OP_MSG:
        return _parse_op_msg(request_id, message, body)
    if op_code == OP_QUERY:
        return _parse_op_query(request_id, body)
    if op_code == OP_COMPRESSED:
        return _parse_op_compressed(request_id, body, compressors)
    raise MalformedMessage(f"unsupported opCode {op_code}")


def decoded_size(op_code: int, length: int, start: bytes) -> int:
    """How many bytes :func:`parse_message` reads to decode a message of ``length`` bytes that
    begins with ``start`` (its header and the first bytes of its body): an OP_COMPRESSED message's
    declared uncompressed size (a lie is caught one byte past it), else its length."""
    if op_code == OP_COMPRESSED and len(start) >= HEADER_SIZE + _COMPRESSION_HEADER.size:
        size: int = _COMPRESSION_HEADER.unpack_from(start, HEADER_SIZE)[1]
        return max(length, min(size + 1, MAX_MESSAGE_SIZE))
    return length


def negotiate_compressors(offered: list[str]) -> tuple[str, ...]:
    """The compressors a connection may use: those the client offered that the server has, in the
    client's order of preference (MongoDB's rule; the client compresses with the first)."""
    return tuple(name for name in dict.fromkeys(offered) if name in SERVER_COMPRESSORS)


def _decode(data: bytes | memoryview) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = bson.decode(bytes(data), codec_options=_DECODE)
    except (BSONError, ValueError, TypeError, IndexError) as exc:
        raise MalformedMessage(f"invalid BSON: {exc}") from None
    return doc


def _parse_op_msg(request_id: int, message: bytes, body: memoryview) -> Request:
    if len(body) < 5:
        raise MalformedMessage("OP_MSG too short")
    (flags,) = _UINT32.unpack_from(body, 0)
    unknown_required = flags & _REQUIRED_FLAG_MASK & ~_KNOWN_MSG_FLAGS
    if unknown_required:
        raise MalformedMessage(f"OP_MSG has unknown required flag bits {unknown_required:#x}")
    end = len(body)
    has_checksum = bool(flags & CHECKSUM_PRESENT)
    if has_checksum:
        if end < 9:
            raise MalformedMessage("OP_MSG too short for its checksum")
        end -= 4
        (expected,) = _UINT32.unpack_from(body, end)
        if crc32c(message[: HEADER_SIZE + end]) != expected:
            raise MalformedMessage("OP_MSG checksum mismatch")
    pos = 4
    command: dict[str, Any] | None = None
    sequences: dict[str, list[dict[str, Any]]] = {}
    while pos < end:
        kind = body[pos]
        pos += 1
        if kind == 0:
            if command is not None:
                raise MalformedMessage("OP_MSG has more than one body section")
            if pos + 4 > end:
                raise MalformedMessage("truncated body section")
            (size,) = _INT32.unpack_from(body, pos)
            if size < 5 or pos + size > end:
                raise MalformedMessage("body section size out of range")
            if size > MAX_REQUEST_OBJECT_SIZE:
                raise _too_large(body[pos : pos + size], OP_MSG, flags)
            command = _decode(body[pos : pos + size])
            pos += size
        elif kind == 1:
            if pos + 4 > end:
                raise MalformedMessage("truncated document sequence")
            (size,) = _INT32.unpack_from(body, pos)
            if size < 5 or pos + size > end:
                raise MalformedMessage("document sequence size out of range")
            section = body[pos + 4 : pos + size]
            nul = bytes(section).find(b"\x00")
            if nul < 0:
                raise MalformedMessage("document sequence identifier is not terminated")
            identifier = bytes(section[:nul]).decode("utf-8", "replace")
            # Only a section longer than the limit can hold a document longer than it.
            if len(section) - nul - 1 > MAX_REQUEST_OBJECT_SIZE:
                _check_sequence_sizes(section[nul + 1 :], flags)
            try:
                docs: list[dict[str, Any]] = bson.decode_all(bytes(section[nul + 1 :]), codec_options=_DECODE)
            except (BSONError, ValueError, TypeError, IndexError) as exc:
                raise MalformedMessage(f"invalid BSON in document sequence: {exc}") from None
            sequences.setdefault(identifier, []).extend(docs)
            pos += size
        else:
            raise MalformedMessage(f"unknown OP_MSG section kind {kind}")
    if command is None:
        raise MalformedMessage("OP_MSG has no body section")
    for identifier, docs in sequences.items():
        if identifier in command:
            raise MalformedMessage(f"field {identifier!r} is both in the body and a document sequence")
        command[identifier] = docs
    db = command.get("$db")
    if not isinstance(db, str):
        raise MalformedMessage("OP_MSG command has no $db")
    return Request(
        request_id=request_id,
        op_code=OP_MSG,
        command=command,
        db=db,
        more_to_come=bool(flags & MORE_TO_COME),
        exhaust_allowed=bool(flags & EXHAUST_ALLOWED),
        checksum=has_checksum,
        sequences=sequences,
    )


def _parse_op_query(request_id: int, body: memoryview) -> Request:
    if len(body) < 4 + 1 + 8 + 5:
        raise MalformedMessage("OP_QUERY too short")
    raw = bytes(body)
    nul = raw.find(b"\x00", 4)
    if nul < 0:
        raise MalformedMessage("OP_QUERY collection name is not terminated")
    full_name = raw[4:nul].decode("utf-8", "replace")
    pos = nul + 1 + 8  # numberToSkip, numberToReturn
    if pos + 4 > len(raw):
        raise MalformedMessage("OP_QUERY has no query document")
    (size,) = _INT32.unpack_from(raw, pos)
    if size < 5 or pos + size > len(raw):
        raise MalformedMessage("OP_QUERY query size out of range")
    if size > MAX_REQUEST_OBJECT_SIZE:
        raise _too_large(memoryview(raw)[pos : pos + size], OP_QUERY, 0)
    query = _decode(raw[pos : pos + size])
    # Drivers wrap legacy commands as {$query: {...}, $readPreference: ...}.
    if "$query" in query and isinstance(query["$query"], dict):
        query = dict(query["$query"])
    db, _, coll = full_name.partition(".")
    if coll != "$cmd":
        raise MalformedMessage(f"OP_QUERY is only accepted for commands, not {full_name!r}")
    return Request(
        request_id=request_id,
        op_code=OP_QUERY,
        command=query,
        db=db,
        full_collection_name=full_name,
    )


def _too_large(obj: memoryview, op_code: int, flags: int) -> ObjectTooLarge:
    return ObjectTooLarge(
        len(obj),
        _first_element(obj),
        op_code=op_code,
        checksum=bool(flags & CHECKSUM_PRESENT),
        more_to_come=bool(flags & MORE_TO_COME),
    )


def _check_sequence_sizes(docs: memoryview, flags: int) -> None:
    """Raise :class:`ObjectTooLarge` for the first document of a sequence over the limit."""
    pos, end = 0, len(docs)
    while pos + 4 <= end:
        (size,) = _INT32.unpack_from(docs, pos)
        if size < 5 or pos + size > end:
            return  # not a document: decoding the sequence reports it
        if size > MAX_REQUEST_OBJECT_SIZE:
            raise _too_large(docs[pos : pos + size], OP_MSG, flags)
        pos += size


# Value lengths of the BSON types whose first element mongod's message can show in full.
_FIXED_VALUE_SIZES = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}
_SHOWN_STRING_CHARS = 150


def _first_element(obj: memoryview) -> str:
    """The ``name: value`` mongod prints after "First element:" for an object too large to read.

    Only the first element is read, never the whole object; a long string is cut as mongod cuts
    it, and a value of another kind is left out.
    """
    kind = obj[4]
    if kind == 0:
        return "EOO"
    nul = bytes(obj[5 : 5 + 1024]).find(b"\x00")
    if nul < 0:
        return "..."
    name = bytes(obj[5 : 5 + nul]).decode("utf-8", DECODE_ERRORS)
    start = 5 + nul + 1
    if kind in _FIXED_VALUE_SIZES:
        element = bytes(obj[4 : start + _FIXED_VALUE_SIZES[kind]])
        try:
            value = bson.decode(_INT32.pack(len(element) + 5) + element + b"\x00")[name]
        except (BSONError, ValueError, TypeError, IndexError, KeyError):
            return f"{name}: ?"
        return f"{name}: {format_value(value)}"
    if kind == 0x02 and start + 4 <= len(obj):
        (length,) = _INT32.unpack_from(obj, start)
        shown = bytes(obj[start + 4 : start + 4 + min(max(length - 1, 0), _SHOWN_STRING_CHARS)])
        text = shown.decode("utf-8", DECODE_ERRORS)
        return f'{name}: "{text}..."' if length - 1 > _SHOWN_STRING_CHARS else f'{name}: "{text}"'
    return f"{name}: ..."


def _parse_op_compressed(request_id: int, body: memoryview, compressors: Collection[str]) -> Request:
    # mongod's order of checks, and the same verdict for each: the connection is closed.
    if len(body) < _COMPRESSION_HEADER.size:
        raise MalformedMessage("OP_COMPRESSED too short")
    original_op, size, compressor = _COMPRESSION_HEADER.unpack_from(body, 0)
    if compressor != _ZLIB_ID:
        raise MalformedMessage(
            f"compressor id {compressor} is not available; this server compresses with zlib only"
        )
    if "zlib" not in compressors:
        raise MalformedMessage(
            "compressor zlib was not negotiated for this connection; offer it in hello's compression field"
        )
    if size < 0 or HEADER_SIZE + size > MAX_MESSAGE_SIZE:
        raise MalformedMessage(
            f"OP_COMPRESSED declares {size} bytes uncompressed; a message may be at most {MAX_MESSAGE_SIZE}"
        )
    if original_op == OP_COMPRESSED:
        raise MalformedMessage("OP_COMPRESSED may not wrap another OP_COMPRESSED")
    inflater = zlib.decompressobj()
    try:
        # One byte past the declared size is enough to know it was a lie: never inflate more.
        data = inflater.decompress(body[_COMPRESSION_HEADER.size :], size + 1)
    except zlib.error as exc:
        raise MalformedMessage(f"bad zlib payload: {exc}") from None
    if len(data) != size or not inflater.eof or inflater.unused_data:
        raise MalformedMessage(f"OP_COMPRESSED payload does not inflate to the {size} bytes it declares")
    inner = HEADER.pack(HEADER_SIZE + size, request_id, 0, original_op) + data
    return parse_message(request_id, original_op, inner)


def build_op_msg(
    request_id: int, response_to: int, payload: bytes, *, more_to_come: bool = False, checksum: bool = False
) -> bytes:
    """An OP_MSG reply whose single body section is ``payload`` (an already encoded document)."""
    flags = (MORE_TO_COME if more_to_come else 0) | (CHECKSUM_PRESENT if checksum else 0)
    length = HEADER_SIZE + 4 + 1 + len(payload) + (4 if checksum else 0)
    message = b"".join(
        (HEADER.pack(length, request_id, response_to, OP_MSG), _UINT32.pack(flags), b"\x00", payload)
    )
    if checksum:
        message += _UINT32.pack(crc32c(message))
    return message


def build_op_reply(request_id: int, response_to: int, payload: bytes) -> bytes:
    """A legacy OP_REPLY carrying one document (the answer to an OP_QUERY command)."""
    length = HEADER_SIZE + _REPLY_PREFIX.size + len(payload)
    return b"".join(
        (
            HEADER.pack(length, request_id, response_to, OP_REPLY),
            _REPLY_PREFIX.pack(0, 0, 0, 1),
            payload,
        )
    )
