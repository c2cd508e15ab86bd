"""Resume tokens of the embedded replica set, encoded as MongoDB encodes them.

A token is ``{"_data": "<UPPERCASE hex>"}``: the KeyString (version 1) encoding of the sequence
``clusterTime, version, tokenType, txnOpIndex, fromInvalidate, uuid, eventIdentifier`` that MongoDB
7/8 writes for version-2 tokens. Because KeyString preserves order byte by byte, comparing two
``_data`` strings compares the oplog positions they stand for:

* the cluster time comes first (``0x82`` + 4-byte big-endian seconds + 4-byte big-endian increment),
  so a client's token decoder (flowwarden's ``token_cluster_time``) decodes any token;
* ``tokenType`` is 0 for a high-water mark and 128 for an event, so a high-water-mark token at time
  ``T`` sorts before every event at ``T`` and after every event before ``T`` ("resume at ``T``
  inclusive", which is exactly what ``startAtOperationTime: T`` means);
* ``txnOpIndex`` orders the events of one transaction, all sharing one cluster time;
* ``fromInvalidate`` puts an invalidate right after the command that caused it;
* a fragment of an event split by ``$changeStreamSplitLargeEvent`` carries the event's token with
  ``fragmentNum`` (0-based) appended after the event identifier, so the fragments of an event sort
  after the event's own token, in fragment order, and before the next event.

This module never reads the oplog and never raises anything but
:class:`~flowwarden_embedded.errors.CommandError` for a token a client sent.

Numbers that are not integral (doubles with a fraction, decimals) inside a document key are encoded
in an order-preserving form of our own rather than MongoDB's exact bytes: only equality of tokens
for one event ever depends on those bytes, never the order between two events.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import Binary, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.rawstrings import text_bytes

TOKEN_VERSION = 2
TOKEN_TYPE_HIGH_WATER_MARK = 0
TOKEN_TYPE_EVENT = 128

# KeyString type bytes (ascending order of BSON types as MongoDB compares them).
_MIN_KEY = 10
_NULLISH = 20
_NUMERIC = 30
_NUMERIC_NAN = _NUMERIC
_NUMERIC_NEGATIVE_LARGE = _NUMERIC + 1
_NUMERIC_NEGATIVE_1_BYTE_INT = _NUMERIC + 9
_NUMERIC_ZERO = _NUMERIC + 11
_NUMERIC_POSITIVE_1_BYTE_INT = _NUMERIC + 13
_NUMERIC_POSITIVE_LARGE = _NUMERIC + 21
_STRING = 60
_OBJECT = 70
_ARRAY = 80
_BINDATA = 90
_OID = 100
_BOOL_FALSE = 110
_BOOL_TRUE = 111
_DATE = 120
_TIMESTAMP = 130
_REGEX = 140
_MAX_KEY = 240
_END = 4

_HEX = re.compile(r"\A(?:[0-9A-Fa-f]{2})+\Z")
_DOUBLE_BITS = struct.Struct(">Q")
_PACK_D = struct.Struct(">d")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


@dataclass(frozen=True, slots=True)
class ResumeTokenData:
    """The decoded prefix of a resume token: what orders it in the oplog.

    ``uuid`` is the collection UUID the token names (None for high-water marks and database-level
    events). ``data`` is the upper-case hex the token was decoded from. ``fragment_num`` is set on
    the token of a fragment of a split event: the 0-based number of that fragment.
    """

    cluster_time: Timestamp
    version: int
    token_type: int
    txn_op_index: int
    from_invalidate: bool
    uuid: bytes | None
    data: str
    fragment_num: int | None = None

    @property
    def is_high_water_mark(self) -> bool:
        return self.token_type == TOKEN_TYPE_HIGH_WATER_MARK

    @property
    def ts_key(self) -> int:
        """The cluster time as one integer, ordered like the timestamp."""
        return (self.cluster_time.time << 32) | self.cluster_time.inc

    def position(self) -> tuple[int, int, int, int]:
        """A tuple ordered exactly like the token bytes, down to ``fromInvalidate``."""
        return (self.ts_key, self.token_type, self.txn_op_index, int(self.from_invalidate))

    @property
    def event_data(self) -> str:
        """The ``_data`` of the whole event's token: ``data`` without its ``fragmentNum``."""
        if self.fragment_num is None:
            return self.data
        cut = 2 * len(_int_body(self.fragment_num)) + 2
        return self.data[:-cut] + self.data[-2:]


def ts_key(ts: Timestamp) -> int:
    """A cluster time as one integer, ordered like the timestamp."""
    return (ts.time << 32) | ts.inc


def key_timestamp(key: int) -> Timestamp:
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


# --- encoding ---------------------------------------------------------------------------------


def _int_body(value: int) -> bytes:
    """KeyString bytes of an integer: type byte from the magnitude's width, then ``|n| << 1``."""
    if 0 <= value < 256:
        return _SMALL_INTS[value]
    if 0 < value < 1 << 62:
        shifted = value << 1
        width = (shifted.bit_length() + 7) >> 3
        return _POSITIVE_INT_TYPES[width] + shifted.to_bytes(width, "big")
    return _int_body_uncached(value)


def _int_body_uncached(value: int) -> bytes:
    if value == 0:
        return bytes((_NUMERIC_ZERO,))
    magnitude = -value if value < 0 else value
    if magnitude >= 1 << 63:
        return _double_body(float(value))
    shifted = magnitude << 1
    width = (shifted.bit_length() + 7) // 8
    if value > 0:
        return bytes((_NUMERIC_POSITIVE_1_BYTE_INT + width - 1,)) + shifted.to_bytes(width, "big")
    inverted = (~shifted) & ((1 << (8 * width)) - 1)
    return bytes((_NUMERIC_NEGATIVE_1_BYTE_INT - (width - 1),)) + inverted.to_bytes(width, "big")


_SMALL_INTS = [_int_body_uncached(i) for i in range(256)]
_POSITIVE_INT_TYPES = [b""] + [bytes((_NUMERIC_POSITIVE_1_BYTE_INT + w - 1,)) for w in range(1, 9)]


def _double_body(value: float) -> bytes:
    if math.isnan(value):
        return bytes((_NUMERIC_NAN,))
    if value.is_integer() and abs(value) < 2.0**63:
        return _int_body(int(value))
    # Order-preserving IEEE bits (see the module docstring: only equality matters here).
    (bits,) = _DOUBLE_BITS.unpack(_PACK_D.pack(value))
    if value > 0:
        return bytes((_NUMERIC_POSITIVE_LARGE,)) + _DOUBLE_BITS.pack(bits)
    return bytes((_NUMERIC_NEGATIVE_LARGE,)) + _DOUBLE_BITS.pack(~bits & 0xFFFFFFFFFFFFFFFF)


def _string_body(value: str) -> bytes:
    return bytes((_STRING,)) + text_bytes(value).replace(b"\x00", b"\x00\xff") + b"\x00"


def _binary_body(data: bytes, subtype: int) -> bytes:
    size = len(data)
    head = bytes((size,)) if size < 0xFF else b"\xff" + size.to_bytes(4, "big")
    return bytes((_BINDATA,)) + head + bytes((subtype,)) + data


_UUID_HEAD = bytes((_BINDATA, 16, 4))
_OID_BYTE = bytes((_OID,))


def _uuid_body(uuid: bytes) -> bytes:
    return _UUID_HEAD + uuid if len(uuid) == 16 else _binary_body(uuid, 4)


def _ctype(value: Any) -> int:
    """The generic type byte KeyString writes before a field name inside an object."""
    if value is None:
        return _NULLISH
    if isinstance(value, bool):
        return _BOOL_FALSE
    if isinstance(value, (int, float, Decimal128)):
        return _NUMERIC
    if isinstance(value, str):
        return _STRING
    if isinstance(value, Mapping):
        return _OBJECT
    if isinstance(value, (list, tuple)):
        return _ARRAY
    if isinstance(value, (bytes, Binary)):
        return _BINDATA
    if isinstance(value, ObjectId):
        return _OID
    if isinstance(value, _dt.datetime):
        return _DATE
    if isinstance(value, Timestamp):
        return _TIMESTAMP
    if isinstance(value, Regex):
        return _REGEX
    if isinstance(value, MinKey):
        return _MIN_KEY
    if isinstance(value, MaxKey):
        return _MAX_KEY
    return _STRING


def encode_value(value: Any) -> bytes:
    """KeyString bytes (type byte + body) of one BSON value, ascending order."""
    kind = type(value)
    if kind is ObjectId:
        return _OID_BYTE + bytes(value.binary)
    if kind is int:
        return _int_body(value)
    if kind is str:
        return _string_body(value)
    if value is None:
        return bytes((_NULLISH,))
    if value is True:
        return bytes((_BOOL_TRUE,))
    if value is False:
        return bytes((_BOOL_FALSE,))
    if isinstance(value, int):
        return _int_body(int(value))
    if isinstance(value, float):
        return _double_body(value)
    if isinstance(value, str):
        return _string_body(value)
    if isinstance(value, ObjectId):
        return bytes((_OID,)) + value.binary
    if isinstance(value, Mapping):
        return encode_object(value)
    if isinstance(value, (list, tuple)):
        return bytes((_ARRAY,)) + b"".join(encode_value(v) for v in value) + b"\x00"
    if isinstance(value, Binary):
        return _binary_body(bytes(value), value.subtype)
    if isinstance(value, bytes):
        return _binary_body(value, 0)
    if isinstance(value, _dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)
        millis = (aware - _EPOCH) // _dt.timedelta(milliseconds=1)
        return bytes((_DATE,)) + ((millis ^ (1 << 63)) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
    if isinstance(value, Timestamp):
        return bytes((_TIMESTAMP,)) + ts_key(value).to_bytes(8, "big")
    if isinstance(value, MinKey):
        return bytes((_MIN_KEY,))
    if isinstance(value, MaxKey):
        return bytes((_MAX_KEY,))
    if isinstance(value, Decimal128):
        return _string_body(str(value))
    return _string_body(repr(value))


def encode_object(doc: Mapping[str, Any]) -> bytes:
    parts = [bytes((_OBJECT,))]
    for key, value in doc.items():
        parts.append(bytes((_ctype(value),)))
        parts.append(text_bytes(key) + b"\x00")
        parts.append(encode_value(value))
    parts.append(b"\x00")
    return b"".join(parts)


_VERSION_BYTES = _int_body(TOKEN_VERSION)
_EVENT_TYPE_BYTES = _int_body(TOKEN_TYPE_EVENT)
_HWM_TYPE_BYTES = _int_body(TOKEN_TYPE_HIGH_WATER_MARK)
_FALSE = bytes((_BOOL_FALSE,))
_TRUE = bytes((_BOOL_TRUE,))
_NULL = bytes((_NULLISH,))
_TIMESTAMP_BYTE = bytes((_TIMESTAMP,))
_OP_TYPE_FIELD = bytes((_STRING,)) + b"operationType\x00"
_DOC_KEY_FIELD = bytes((_OBJECT,)) + b"documentKey\x00"
_OP_DESC_FIELD = bytes((_OBJECT,)) + b"operationDescription\x00"
_END_BYTE = bytes((_END,))


_IDENTIFIER_HEADS: dict[str, bytes] = {}
_ID_FIELD = b"_id\x00"
_OBJECT_BYTE = bytes((_OBJECT,))


_MIDDLES: dict[tuple[bytes | None, str, int], bytes] = {}


_ID_OF_OID = bytes((_OBJECT, _OID)) + b"_id\x00" + bytes((_OID,))
_ID_OF_NUMBER = bytes((_OBJECT, _NUMERIC)) + b"_id\x00"
_ID_OF_STRING = bytes((_OBJECT, _STRING)) + b"_id\x00"


def _key_object(document_key: Mapping[str, Any]) -> bytes:
    """KeyString of a document key; ``{_id: ObjectId|int|str}`` (nearly all of them) inline."""
    if len(document_key) == 1:
        value = document_key.get("_id", _ABSENT)
        kind = type(value)
        if kind is ObjectId:
            return _ID_OF_OID + bytes(value.binary) + b"\x00"
        if kind is int:
            return _ID_OF_NUMBER + _int_body(value) + b"\x00"
        if kind is str:
            return _ID_OF_STRING + _string_body(value) + b"\x00"
    return encode_object(document_key)


_ABSENT = object()


def _document_identifier(operation_type: str, document_key: Mapping[str, Any]) -> bytes:
    """``operationType`` + ``documentKey`` fields of an event identifier (the hot path of tokens)."""
    head = _IDENTIFIER_HEADS.get(operation_type)
    if head is None:
        head = _OP_TYPE_FIELD + _string_body(operation_type) + _DOC_KEY_FIELD
        _IDENTIFIER_HEADS[operation_type] = head
    if len(document_key) == 1 and "_id" in document_key:
        value = document_key["_id"]
        return b"".join(
            (head, _OBJECT_BYTE, bytes((_ctype(value),)), _ID_FIELD, encode_value(value), b"\x00")
        )
    return head + encode_object(document_key)


def fragment_token_data(event_data: str, fragment_num: int) -> str:
    """The ``_data`` of fragment ``fragment_num`` (0-based) of the event whose token is ``event_data``.

    MongoDB appends ``fragmentNum`` to the token's KeyString after the event identifier, so it goes
    in right before the end byte.
    """
    return event_data[:-2] + _int_body(fragment_num).hex().upper() + event_data[-2:]


def high_water_mark(cluster_time: Timestamp) -> dict[str, str]:
    """A high-water-mark token: "every event at ``cluster_time`` or later is still to come"."""
    raw = b"".join(
        (
            _TIMESTAMP_BYTE,
            ts_key(cluster_time).to_bytes(8, "big"),
            _VERSION_BYTES,
            _HWM_TYPE_BYTES,
            _int_body(0),
            _FALSE,
            _NULL,
            _END_BYTE,
        )
    )
    return {"_data": raw.hex().upper()}


def event_token_data(
    cluster_time_key: int,
    txn_op_index: int,
    uuid: bytes | None,
    operation_type: str,
    document_key: Mapping[str, Any] | None,
    operation_description: Mapping[str, Any] | None,
    *,
    from_invalidate: bool = False,
) -> str:
    """The ``_data`` hex of an event token.

    The event identifier is ``{operationType, documentKey}`` for document events and
    ``{operationType, operationDescription}`` (the latter omitted when empty) for commands, as in
    MongoDB's version-2 tokens.
    """
    if document_key is not None and not from_invalidate:
        # The hot path: everything between the cluster time and the document key is the same for
        # every event of one collection, operation type and transaction position.
        middle_key = (uuid, operation_type, txn_op_index)
        middle = _MIDDLES.get(middle_key)
        if middle is None:
            if len(_MIDDLES) > 10_000:
                _MIDDLES.clear()
            middle = _MIDDLES[middle_key] = b"".join(
                (
                    _VERSION_BYTES,
                    _EVENT_TYPE_BYTES,
                    _int_body(txn_op_index),
                    _FALSE,
                    _uuid_body(uuid) if uuid is not None else _NULL,
                    _OBJECT_BYTE,
                    _OP_TYPE_FIELD,
                    _string_body(operation_type),
                    _DOC_KEY_FIELD,
                )
            )
        raw = b"".join(
            (
                _TIMESTAMP_BYTE,
                cluster_time_key.to_bytes(8, "big"),
                middle,
                _key_object(document_key),
                b"\x00\x04",
            )
        )
        return raw.hex().upper()
    if document_key is not None:
        identifier = _document_identifier(operation_type, document_key)
    elif operation_description is not None:
        identifier = (
            _OP_TYPE_FIELD
            + _string_body(operation_type)
            + _OP_DESC_FIELD
            + encode_object(operation_description)
        )
    else:
        identifier = _OP_TYPE_FIELD + _string_body(operation_type)
    raw = b"".join(
        (
            _TIMESTAMP_BYTE,
            cluster_time_key.to_bytes(8, "big"),
            _VERSION_BYTES,
            _EVENT_TYPE_BYTES,
            _int_body(txn_op_index),
            _TRUE if from_invalidate else _FALSE,
            _uuid_body(uuid) if uuid is not None else _NULL,
            _OBJECT_BYTE,
            identifier,
            b"\x00",
            _END_BYTE,
        )
    )
    return raw.hex().upper()


# --- decoding ---------------------------------------------------------------------------------


def _bad(message: str) -> CommandError:
    return CommandError(260, message)


def _read_int(raw: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(raw):
        raise _bad("Invalid resume token: truncated")
    kind = raw[pos]
    if kind == _NUMERIC_ZERO:
        return 0, pos + 1
    if _NUMERIC_POSITIVE_1_BYTE_INT <= kind < _NUMERIC_POSITIVE_1_BYTE_INT + 8:
        width = kind - _NUMERIC_POSITIVE_1_BYTE_INT + 1
        chunk = raw[pos + 1 : pos + 1 + width]
        if len(chunk) != width:
            raise _bad("Invalid resume token: truncated")
        return int.from_bytes(chunk, "big") >> 1, pos + 1 + width
    raise _bad("Invalid resume token: expected a non-negative integer")


_NO_BODY = frozenset({_MIN_KEY, _NULLISH, _NUMERIC_NAN, _NUMERIC_ZERO, _BOOL_FALSE, _BOOL_TRUE, _MAX_KEY})
_EIGHT_BYTE_BODY = frozenset({_NUMERIC_NEGATIVE_LARGE, _NUMERIC_POSITIVE_LARGE, _DATE, _TIMESTAMP})


def _skip_value(raw: bytes, pos: int) -> int:
    """The position after the KeyString value at ``pos``, as :func:`encode_value` writes values.

    Raises IndexError or ValueError for bytes it did not write.
    """
    kind = raw[pos]
    pos += 1
    if kind in _NO_BODY:
        return pos
    if kind in _EIGHT_BYTE_BODY:
        return pos + 8
    if _NUMERIC_POSITIVE_1_BYTE_INT <= kind < _NUMERIC_POSITIVE_1_BYTE_INT + 8:
        return pos + kind - _NUMERIC_POSITIVE_1_BYTE_INT + 1
    if _NUMERIC_NEGATIVE_1_BYTE_INT - 7 <= kind <= _NUMERIC_NEGATIVE_1_BYTE_INT:
        return pos + _NUMERIC_NEGATIVE_1_BYTE_INT - kind + 1
    if kind == _STRING:
        while True:
            nul = raw.index(0, pos)
            if nul + 1 < len(raw) and raw[nul + 1] == 0xFF:  # an escaped NUL inside the string
                pos = nul + 2
                continue
            return nul + 1
    if kind == _OBJECT:
        while raw[pos] != 0:
            pos = _skip_value(raw, raw.index(0, pos + 1) + 1)  # type byte, field name, value
        return pos + 1
    if kind == _ARRAY:
        while raw[pos] != 0:
            pos = _skip_value(raw, pos)
        return pos + 1
    if kind == _BINDATA:
        size = raw[pos]
        pos += 1
        if size == 0xFF:
            size = int.from_bytes(raw[pos : pos + 4], "big")
            pos += 4
        return pos + 1 + size
    if kind == _OID:
        return pos + 12
    raise ValueError(f"KeyString type {kind} is not one this server writes")


def _fragment_num(raw: bytes, pos: int) -> int | None:
    """The ``fragmentNum`` that follows the UUID (or null) at ``pos`` and the event identifier.

    None when the token has none, and for a token whose identifier this server cannot read (such a
    token resumes nothing here anyway: the cursor reports it not found).
    """
    try:
        pos = _skip_value(raw, pos)
        if raw[pos] != _OBJECT:
            return None
        pos = _skip_value(raw, pos)
        if raw[pos] == _END:
            return None
    except (IndexError, ValueError):
        return None
    kind = raw[pos]
    if kind != _NUMERIC_ZERO and not _NUMERIC_POSITIVE_1_BYTE_INT <= kind < _NUMERIC_POSITIVE_1_BYTE_INT + 4:
        raise CommandError(7182501, "Resume token 'fragmentNum' must be a non-negative integer.")
    fragment, pos = _read_int(raw, pos)
    if pos != len(raw) - 1 or raw[pos] != _END:
        raise CommandError(40646, "invalid oversized resume token")
    return fragment


def decode_token(token: Any) -> ResumeTokenData:
    """Decode what orders a client-supplied resume token; errors are MongoDB's for a bad token."""
    data = token.get("_data") if isinstance(token, Mapping) else None
    if not isinstance(data, str):
        raise CommandError(
            40647, f"Bad resume token: _data of missing or of wrong type. Expected string, got {token!r}"
        )
    if not _HEX.match(data):
        raise CommandError(9, "resume token string was not a valid hex string")
    raw = bytes.fromhex(data)
    if len(raw) < 9 or raw[0] != _TIMESTAMP:
        raise CommandError(40649, "invalid empty resume token")
    key = int.from_bytes(raw[1:9], "big")
    version, pos = _read_int(raw, 9)
    if version not in (1, 2):
        raise CommandError(50795, "Invalid Resume Token: only supports version 0, 1 and 2")
    token_type, pos = _read_int(raw, pos)
    if token_type not in (TOKEN_TYPE_EVENT, TOKEN_TYPE_HIGH_WATER_MARK):
        raise CommandError(51057, f"Token type {token_type} not recognized")
    txn_op_index, pos = _read_int(raw, pos)
    if pos >= len(raw) or raw[pos] not in (_BOOL_FALSE, _BOOL_TRUE):
        raise CommandError(50872, "Resume Token does not contain fromInvalidate")
    from_invalidate = raw[pos] == _BOOL_TRUE
    pos += 1
    uuid: bytes | None = None
    if pos + 19 <= len(raw) and raw[pos] == _BINDATA and raw[pos + 1] == 16 and raw[pos + 2] == 4:
        uuid = raw[pos + 3 : pos + 19]
    fragment = _fragment_num(raw, pos) if version >= 2 and token_type == TOKEN_TYPE_EVENT else None
    return ResumeTokenData(
        cluster_time=key_timestamp(key),
        version=version,
        token_type=token_type,
        txn_op_index=txn_op_index,
        from_invalidate=from_invalidate,
        uuid=uuid,
        data=data.upper(),
        fragment_num=fragment,
    )


__all__ = [
    "TOKEN_TYPE_EVENT",
    "TOKEN_TYPE_HIGH_WATER_MARK",
    "TOKEN_VERSION",
    "ResumeTokenData",
    "decode_token",
    "encode_object",
    "encode_value",
    "event_token_data",
    "fragment_token_data",
    "high_water_mark",
    "key_timestamp",
    "ts_key",
]
