"""Requests to running streams, kept as documents of ``_fw_signals`` beside ``_fw_checkpoints``.

A snapshot request (``flowwarden snapshot request``, :meth:`flowwarden.Connector.request_snapshot`)
is one document::

    {_id: ObjectId, kind: "snapshot", stream: "orders", collections: ["orders"] | null,
     filter: {...} | null, chunkSize: 500 | null, state: "requested", requestedAt: <date>,
     finished: ["orders[0/4]", ...]}

``stream`` names a stream, or a partitioned class whose every bucket then takes the request;
``collections`` null copies every collection the stream covers; ``filter`` is a find filter on
the documents that narrows the copy; ``state`` is ``requested`` until the request is cancelled
(``cancelled``) or a stream found it cannot serve it (``refused``, with ``reason``); each stream
that copied everything adds its name to ``finished``. Whoever reads a stream's progress reads it
from the stream's checkpoint record (``incrementalSnapshot``), not from here.

A Spark query read with ``.option("name", ...)`` keeps ``{_id: "source:<name>", kind: "source",
stream: <name>}`` here, so that the command line knows the name without a checkpoint of it.
The streams also write one watermark document each here, ``{_id: "watermark:<stream>", kind:
"watermark"}``: the write after each chunk's read whose cluster time is the chunk's high
watermark (:mod:`flowwarden.runtime.incremental`). It always changes the document, so it is
always an oplog entry that moves every change stream's position on, watched collection or not.

Every operation is written once, as a procedure of driver calls (:mod:`flowwarden.mongo.calls`):
the command line runs it blocking, the runtime awaits it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bson import ObjectId
from bson.errors import InvalidId

from flowwarden.mongo.calls import Procedure, call, find_all
from flowwarden.mongo.initial_copy import INTERNAL_PREFIX, copied_collection
from flowwarden.mongo.namespaces import NamespaceSelection

DEFAULT_CHECKPOINT_DATABASE = "flowwarden"
"""Where a connector keeps its cluster streams' checkpoints, and so their signals, by default."""
SIGNALS_COLLECTION = "_fw_signals"
SNAPSHOT_KIND = "snapshot"
WATERMARK_KIND = "watermark"
SOURCE_KIND = "source"


class RequestState(str, enum.Enum):
    """Where a snapshot request is, as its document says."""

    REQUESTED = "requested"
    """Waiting for its streams, or being copied by them."""
    CANCELLED = "cancelled"
    """Cancelled (``flowwarden snapshot cancel``): a stream copying it stops at its next chunk."""
    REFUSED = "refused"
    """A stream found it cannot serve it (``reason`` says why)."""


class RequestProblem(ValueError):
    """What is wrong with a snapshot request, on one line."""


@dataclass(frozen=True)
class SnapshotRequest:
    """One snapshot request, as read from ``_fw_signals``."""

    id: str
    stream: str
    collections: tuple[str, ...] | None
    filter: dict[str, Any] | None
    chunk_size: int | None
    state: RequestState
    requested_at: datetime | None
    finished: tuple[str, ...] = ()
    reason: str | None = None

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> SnapshotRequest:
        """The request a document holds; :class:`RequestProblem` when it is not one."""
        identity = document.get("_id")
        stream = document.get("stream")
        if not isinstance(identity, ObjectId) or not isinstance(stream, str):
            raise RequestProblem(f"the signal {identity!r} is not a snapshot request (no ObjectId or stream)")
        collections = document.get("collections")
        filter_ = document.get("filter")
        chunk_size = document.get("chunkSize")
        state = document.get("state")
        finished = document.get("finished") or []
        if (
            (collections is not None and not _names(collections))
            or (filter_ is not None and not isinstance(filter_, Mapping))
            or (chunk_size is not None and (type(chunk_size) is not int or chunk_size < 1))
            or state not in {member.value for member in RequestState}
            or not _names(finished, empty=True)
        ):
            raise RequestProblem(f"the snapshot request {identity} has a field of the wrong type")
        at = document.get("requestedAt")
        reason = document.get("reason")
        return cls(
            id=str(identity),
            stream=stream,
            collections=None if collections is None else tuple(collections),
            filter=None if filter_ is None else dict(filter_),
            chunk_size=chunk_size,
            state=RequestState(state),
            requested_at=_utc(at) if isinstance(at, datetime) else None,
            finished=tuple(finished),
            reason=reason if isinstance(reason, str) else None,
        )

    def for_stream(self, name: str) -> bool:
        """Whether stream ``name`` (a bucket's ``orders[1/4]`` too) is one the request names."""
        return name == self.stream or (name.startswith(f"{self.stream}[") and name.endswith("]"))


def _names(value: Any, *, empty: bool = False) -> bool:
    return isinstance(value, list) and (empty or bool(value)) and all(isinstance(n, str) and n for n in value)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def request_document(
    stream: str,
    collections: Iterable[str] | None = None,
    filter: Mapping[str, Any] | None = None,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """A new snapshot request's document; :class:`RequestProblem` names what is wrong."""
    if not isinstance(stream, str) or not stream or stream != stream.strip():
        raise RequestProblem(f"the stream name {stream!r} is not a stream's name (a non-empty string)")
    names = None
    if collections is not None:
        if isinstance(collections, str):
            raise RequestProblem("collections is a list of collection names, not one string")
        names = list(collections)
        if not names:
            raise RequestProblem(
                "collections is empty; leave it out to copy every collection the stream covers"
            )
        for name in names:
            check_collection(name)
    if filter is not None and not isinstance(filter, Mapping):
        raise RequestProblem(f"the filter must be a document (a find filter), not {type(filter).__name__}")
    if chunk_size is not None and (type(chunk_size) is not int or chunk_size < 1):
        raise RequestProblem(f"the chunk size must be a whole number of at least 1, not {chunk_size!r}")
    return {
        "_id": ObjectId(),
        "kind": SNAPSHOT_KIND,
        "stream": stream,
        "collections": names,
        "filter": None if filter is None else dict(filter),
        "chunkSize": chunk_size,
        "state": RequestState.REQUESTED.value,
        "requestedAt": datetime.now(timezone.utc),
        "finished": [],
    }


def check_collection(name: Any) -> None:
    """Refuse a name no copy can read: empty, with ``$`` or NUL, a system or flowwarden one."""
    if not isinstance(name, str) or not name:
        raise RequestProblem(f"{name!r} is not a collection name")
    if "$" in name or "\x00" in name:
        raise RequestProblem(f"the collection name {name!r} contains '$' or NUL")
    if not copied_collection(name) or not copied_collection(name.partition(".")[2] or name):
        raise RequestProblem(
            f"{name!r} is a system collection or one of flowwarden's own ({INTERNAL_PREFIX}*); a snapshot "
            "copies the user's collections only"
        )


def request_namespaces(
    collections: tuple[str, ...] | None,
    *,
    database: str | None,
    collection: str | None,
    selection: NamespaceSelection | None = None,
) -> list[str] | None:
    """The namespaces a request copies from a stream watching ``database``/``collection`` (both
    None: the cluster), in order; None for every collection the stream covers.
    :class:`RequestProblem` when a name is one the stream does not watch, or one its
    ``collections``/``exclude_collections`` (``selection``) leave out: its changes never reach
    the stream, so no copy of it could be kept up to date.

    A collection stream copies its collection (named as it is, or ``database.collection``); a
    database stream takes collection names of its database as they are (a name may hold dots);
    a cluster stream takes ``database.collection``."""
    if collections is None:
        return None
    namespaces: list[str] = []
    for name in collections:
        if collection is not None:
            own = f"{database}.{collection}"
            if name not in (collection, own):
                raise RequestProblem(
                    f"the stream watches {own} only, not {name!r}; request it without collections "
                    f"or with {collection!r}"
                )
            namespaces.append(own)
        elif database is not None:
            namespaces.append(f"{database}.{name}")
        else:
            db, dot, coll = name.partition(".")
            if not dot or not db or not coll:
                raise RequestProblem(
                    f"a cluster stream copies collections named database.collection, not {name!r}"
                )
            namespaces.append(name)
    if selection is not None and collection is None:
        for namespace in namespaces:
            db, _, coll = namespace.partition(".")
            if not selection.selects(db, coll):
                raise RequestProblem(
                    f"the stream's collections/exclude_collections leave out {namespace}: its "
                    "changes never reach the stream; request a collection it selects"
                )
    return list(dict.fromkeys(namespaces))  # each once, in the order given


def object_id(text: str) -> ObjectId:
    """A request's id as written (24 hex digits); :class:`RequestProblem` otherwise."""
    try:
        return ObjectId(text)
    except (InvalidId, TypeError):
        raise RequestProblem(
            f"{text!r} is not a request id; copy one from `flowwarden snapshot list` (24 hex digits)"
        ) from None


# -- procedures ---------------------------------------------------------------------------------------


def insert_request(signals: Any, document: Mapping[str, Any]) -> Procedure[str]:
    """Write a new request; its id."""
    yield call(signals, "insert_one", dict(document))
    return str(document["_id"])


def requests(signals: Any, query: Mapping[str, Any] | None = None) -> Procedure[list[SnapshotRequest]]:
    """The snapshot requests that ``query`` selects too, oldest first; documents that are not
    requests are left out."""
    documents = yield find_all(
        signals, {"kind": SNAPSHOT_KIND, **(query or {})}, sort=[("requestedAt", 1), ("_id", 1)]
    )
    found = []
    for document in documents:
        try:
            found.append(SnapshotRequest.from_document(document))
        except RequestProblem:
            continue
    return found


def cancel_request(signals: Any, identity: ObjectId) -> Procedure[SnapshotRequest | None]:
    """Mark a request cancelled while it is requested; the request as it was (None: no request
    with that id)."""
    before = yield call(
        signals,
        "find_one_and_update",
        {"_id": identity, "kind": SNAPSHOT_KIND, "state": RequestState.REQUESTED.value},
        {"$set": {"state": RequestState.CANCELLED.value, "cancelledAt": datetime.now(timezone.utc)}},
    )
    if before is None:
        before = yield call(signals, "find_one", {"_id": identity, "kind": SNAPSHOT_KIND})
    return None if before is None else SnapshotRequest.from_document(before)


def mark_finished(signals: Any, identity: str, stream: str) -> Procedure[None]:
    """Record that ``stream`` copied everything the request asked for."""
    yield call(signals, "update_one", {"_id": ObjectId(identity)}, {"$addToSet": {"finished": stream}})


def refuse_request(signals: Any, identity: str, stream: str, reason: str) -> Procedure[None]:
    """Mark a request refused by ``stream``, which cannot serve it (``reason``)."""
    yield call(
        signals,
        "update_one",
        {"_id": ObjectId(identity), "state": RequestState.REQUESTED.value},
        {"$set": {"state": RequestState.REFUSED.value, "reason": f"{stream}: {reason}"}},
    )


__all__ = [
    "SIGNALS_COLLECTION",
    "SNAPSHOT_KIND",
    "SOURCE_KIND",
    "WATERMARK_KIND",
    "RequestProblem",
    "RequestState",
    "SnapshotRequest",
    "cancel_request",
    "check_collection",
    "insert_request",
    "mark_finished",
    "object_id",
    "refuse_request",
    "request_document",
    "request_namespaces",
    "requests",
]
