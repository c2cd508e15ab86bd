"""What an initial snapshot copies and the rows it hands over, shared by the connector
(:mod:`flowwarden.runtime.snapshot`) and the Spark source (:mod:`flowwarden.spark.source.snapshot`).

A snapshot row is the change event a copied document reaches the methods as: ``operationType``
``"snapshot"``, ``clusterTime`` (the cluster time of the position the changes follow from),
``ns``, ``documentKey`` and ``fullDocument``, and no ``_id``: a row is not a position.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from typing import Any

import bson
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from bson.raw_bson import RawBSONDocument

from flowwarden.mongo.raw_events import RawEvent

# Databases a cluster stream's snapshot never copies: the server's own.
SYSTEM_DATABASES = frozenset({"admin", "config", "local"})
# flowwarden's own collections (checkpoints, dead letters, leases) are not the user's data.
INTERNAL_PREFIX = "_fw_"


# MongoDB's sort order of _id values across types: one tuple of $type aliases per bracket. A
# query comparison ($gt, $lte) only matches values of its own bracket, so a range of _ids is
# "greater within the first one's bracket, any of a bracket between, or not greater within the
# last one's bracket".
ID_TYPE_ORDER: tuple[tuple[str, ...], ...] = (
    ("null",),
    ("int", "long", "double", "decimal"),
    ("symbol", "string"),
    ("object",),
    ("binData",),
    ("objectId",),
    ("bool",),
    ("date",),
    ("timestamp",),
    ("regex",),
    ("maxKey",),
)


def id_range(after: Any, through: Any) -> dict[str, Any]:
    """The find filter of the documents whose ``_id`` sorts after ``after`` (:class:`MinKey`:
    from the first) and not after ``through`` (an ``_id`` read before), across types, in
    MongoDB's sort order. Each part reads one bracket or a list of whole brackets, so the
    server answers it from the ``_id`` index."""
    if isinstance(through, MinKey):
        raise ValueError("an _id range ends at an _id; MinKey ends none")
    low = -1 if isinstance(after, MinKey) else _bracket(after)
    high = _bracket(through)
    if low > high:
        return {"_id": {"$in": []}}  # ``after`` sorts past ``through``: an empty range
    if low == high:
        return {"_id": {"$gt": after, "$lte": through}}
    parts: list[dict[str, Any]] = []
    if low >= 0:
        parts.append({"_id": {"$gt": after}})
    between = [alias for aliases in ID_TYPE_ORDER[low + 1 : high] for alias in aliases]
    if between:
        parts.append({"_id": {"$type": between}})
    parts.append({"_id": {"$lte": through}})
    return parts[0] if len(parts) == 1 else {"$or": parts}


def _bracket(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        return 6
    if isinstance(value, (int, float, Int64, Decimal128)):
        return 1
    if isinstance(value, str):
        return 2
    if isinstance(value, (Mapping, RawBSONDocument)):
        return 3
    if isinstance(value, (bytes, Binary)):
        return 4
    if isinstance(value, ObjectId):
        return 5
    if isinstance(value, (dt.datetime, DatetimeMS)):
        return 7
    if isinstance(value, Timestamp):
        return 8
    if isinstance(value, (Regex, re.Pattern)):
        return 9
    if isinstance(value, MaxKey):
        return 10
    raise TypeError(f"an _id of type {type(value).__name__} has no place in MongoDB's sort order")


def copied_database(name: str) -> bool:
    """Whether a cluster stream's snapshot copies database ``name``."""
    return name not in SYSTEM_DATABASES


def own_collections_stage() -> dict[str, Any]:
    """The ``$match`` stage a database or cluster stream runs to leave out the events of
    flowwarden's own collections (``_fw_checkpoints``, ``_fw_locks``, ``_fw_dlq``...): without it
    the stream would see its own checkpoint saves, each save an event to handle and save. Events
    without a collection (dropDatabase, invalidate) pass."""
    return {"$match": {"ns.coll": {"$not": {"$regex": f"^{INTERNAL_PREFIX}"}}}}


def copied_collection(name: str) -> bool:
    """Whether a snapshot copies collection ``name`` (not ``system.*``, not flowwarden's own)."""
    return not name.startswith("system.") and not name.startswith(INTERNAL_PREFIX)


def snapshot_row(document: Any, database: str, collection: str, cluster_time: Any, *, raw: bool) -> Any:
    """A snapshot row: the change event a copied document reaches the methods as."""
    key = document["_id"]
    event = {
        "operationType": "snapshot",
        "clusterTime": cluster_time,
        "ns": {"db": database, "coll": collection},
        "documentKey": {"_id": key},
        "fullDocument": document,
    }
    if raw:
        # DataFrame streams read events as raw BSON; the document's bytes are embedded as they came.
        return RawEvent(bson.encode(event))
    return event


def document_key(value: Any) -> Any:
    """A hashable key of an ``_id`` value: equal for the ``_id`` values MongoDB holds equal.

    Numbers compare by value in MongoDB (``1``, ``1.0`` and ``NumberLong(1)`` are one ``_id``),
    so a number is keyed by its value; any other value by its BSON bytes."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, Int64)):
        return ("n", int(value))
    if isinstance(value, float):
        return ("n", int(value)) if value.is_integer() else ("n", value)
    if isinstance(value, Decimal128):
        number = value.to_decimal()
        if number.is_finite() and number == number.to_integral_value():
            return ("n", int(number))
        return ("d", str(number.normalize()))
    if isinstance(value, str):
        return ("s", value)
    return ("v", bson.encode({"v": value}))


def plain_id(value: Any) -> Any:
    """An ``_id`` read as raw BSON, as a plain value a store can keep."""
    if isinstance(value, RawBSONDocument):
        return bson.decode(value.raw)
    return value


def copy_filter(pipeline: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The find filter of a copy: the stream's ``$match`` stages that read only the document
    (``fullDocument.*``, ``documentKey._id``), rewritten to read it directly; a partitioned
    stream's bucket is one of them. Stages after the first one that is not a ``$match`` may see
    reshaped events, so the filter stops there."""
    applied: list[dict[str, Any]] = []
    for stage in pipeline:
        if set(stage) != {"$match"}:
            break
        query = document_query(stage["$match"])
        if query is not None:
            applied.append(query)
    return all_of(*applied)


def all_of(*queries: Mapping[str, Any]) -> dict[str, Any]:
    """One find filter matching what every one of ``queries`` matches (empty ones match all)."""
    parts = [dict(query) for query in queries if query]
    if not parts:
        return {}
    return parts[0] if len(parts) == 1 else {"$and": parts}


_INVALIDATE = {"operationType": "invalidate"}


def document_query(query: Mapping[str, Any]) -> dict[str, Any] | None:
    """A change-stream ``$match`` query as a query on the documents themselves, or None when it
    reads anything else (the operation type, the namespace, the update description...)."""
    out: dict[str, Any] = {}
    for key, value in query.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(value, list) or not value:
                return None
            if key == "$or":
                # A copied document is never an invalidate: the branch a bucket keeps it by
                # (flowwarden.mongo.buckets.bucket_stage) matches no row.
                value = [part for part in value if part != _INVALIDATE]
                if not value:
                    return None
            parts = [document_query(part) if isinstance(part, Mapping) else None for part in value]
            if any(part is None for part in parts):
                return None
            out[key] = parts
        elif key == "$expr":
            expression = _document_expression(value)
            if expression is None:
                return None
            out[key] = expression
        elif key.startswith("$"):
            return None
        else:
            field = _document_field(key)
            if field is None:
                return None
            out[field] = value
    return out


def _document_field(path: str) -> str | None:
    """``fullDocument.a.b`` -> ``a.b``; ``documentKey._id[.x]`` -> ``_id[.x]``; else None."""
    if path.startswith("fullDocument."):
        return path[len("fullDocument.") :]
    if path == "documentKey._id" or path.startswith("documentKey._id."):
        return path[len("documentKey.") :]
    return None


def _document_expression(expression: Any) -> Any:
    """An aggregation expression with its field paths read from the document; None when it
    reads a field of the event outside the document."""
    if isinstance(expression, str) and expression.startswith("$") and not expression.startswith("$$"):
        field = _document_field(expression[1:])
        return None if field is None else f"${field}"
    if isinstance(expression, Mapping):
        out = {}
        for key, value in expression.items():
            rewritten = _document_expression(value)
            if rewritten is None and value is not None:
                return None
            out[key] = rewritten
        return out
    if isinstance(expression, list):
        items = [_document_expression(item) for item in expression]
        if any(new is None and old is not None for new, old in zip(items, expression, strict=True)):
            return None
        return items
    return expression


__all__ = [
    "all_of",
    "copied_collection",
    "copied_database",
    "copy_filter",
    "document_key",
    "document_query",
    "id_range",
    "plain_id",
    "snapshot_row",
]
