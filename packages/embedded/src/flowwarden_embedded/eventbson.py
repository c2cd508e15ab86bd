"""The BSON of document events as streams with default options see them, built from pieces.

Encoding a change event is most of what serving a long oplog costs, so the events of document
writes (insert, update, replace, delete) are assembled from pre-encoded parts instead of encoding
a freshly built dict: the token, the operation type, the namespace and the field names are bytes
already, and only the documents themselves go through the BSON encoder.

Hard rule: the result is byte-identical to :func:`~flowwarden_embedded.rawstrings.encode`
of the event document the change stream builds for the same record, text that is not UTF-8
included (a property test holds the two together). This module never decides what an event
contains; it only spells it faster.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bson import ObjectId

from flowwarden_embedded.rawstrings import encode, encode_embedded, text_bytes
from flowwarden_embedded.updates import update_description

if TYPE_CHECKING:
    from flowwarden_embedded.oplog import OplogRecord

DOCUMENT_EVENTS = ("insert", "update", "replace", "delete")
_ABSENT = object()

_I32 = struct.Struct("<i")
_ID_ELEMENT = b"\x03_id\x00"
_DATA_ELEMENT = b"\x02_data\x00"
_OPERATION_TYPES = {
    kind: b"\x02operationType\x00" + _I32.pack(len(kind) + 1) + kind.encode() + b"\x00"
    for kind in DOCUMENT_EVENTS
}
_CLUSTER_TIME = b"\x11clusterTime\x00"
_WALL_TIME = b"\x09wallTime\x00"
_FULL_DOCUMENT = b"\x03fullDocument\x00"
_NS = b"\x03ns\x00"
_DOCUMENT_KEY = b"\x03documentKey\x00"
_UPDATE_DESCRIPTION = b"\x03updateDescription\x00"
_TXN_NUMBER = b"\x12txnNumber\x00"
_LSID = b"\x03lsid\x00"
_NS_BSON: dict[tuple[str, str | None], bytes] = {}
_KEY_OID = b"\x16\x00\x00\x00\x07_id\x00"
_KEY_INT = b"\x0e\x00\x00\x00\x10_id\x00"


def _key_bson(key: Mapping[str, Any]) -> bytes:
    """BSON of a document key; ``{_id: ObjectId|int32|str}`` (nearly all of them) built inline."""
    if len(key) == 1:
        value = key.get("_id", _ABSENT)
        kind = type(value)
        if kind is ObjectId:
            return _KEY_OID + bytes(value.binary) + b"\x00"
        if kind is int and -(2**31) <= value < 2**31:
            return _KEY_INT + int(value).to_bytes(4, "little", signed=True) + b"\x00"
        if kind is str:
            text = text_bytes(value)
            if b"\x00" not in text:
                size = len(text)
                return b"".join(
                    (_I32.pack(size + 15), b"\x02_id\x00", _I32.pack(size + 1), text, b"\x00\x00")
                )
    return encode_embedded(key)


def classic_document_event_bson(record: OplogRecord) -> bytes:
    """The BSON of a document event as a stream with default options sees it.

    Byte-identical to encoding the event document, but built from pre-encoded pieces: this runs
    once per oplog record and is most of what serving a long oplog costs.
    """
    op = record.op
    kind = record.kind
    data = record.data().encode("ascii")
    size = len(data)
    ns_key = (record.db, record.coll)
    ns = _NS_BSON.get(ns_key)
    if ns is None:
        if len(_NS_BSON) > 10_000:
            _NS_BSON.clear()
        ns = _NS_BSON[ns_key] = encode(record.ns_doc())
    parts = [
        b"",  # the length, filled in below
        _ID_ELEMENT,
        _I32.pack(size + 17),
        _DATA_ELEMENT,
        _I32.pack(size + 1),
        data,
        b"\x00\x00",
        _OPERATION_TYPES[kind],
        _CLUSTER_TIME,
        record.key.to_bytes(8, "little"),
        _WALL_TIME,
        record.wall_ms.to_bytes(8, "little", signed=True),
    ]
    if kind == "insert" or kind == "replace":
        parts += (_FULL_DOCUMENT, encode_embedded(op.after or {}))
    parts += (_NS, ns, _DOCUMENT_KEY, _key_bson(op.document_key or {}))
    if kind == "update":
        parts += (_UPDATE_DESCRIPTION, encode(update_description(record.update_diff())))
    if record.lsid is not None:
        parts += (_LSID, encode_embedded(record.lsid))
    if record.txn_number is not None:
        parts += (_TXN_NUMBER, record.txn_number.to_bytes(8, "little", signed=True))
    parts.append(b"\x00")
    parts[0] = _I32.pack(sum(map(len, parts)) + 4)
    return b"".join(parts)


__all__ = ["DOCUMENT_EVENTS", "classic_document_event_bson"]
