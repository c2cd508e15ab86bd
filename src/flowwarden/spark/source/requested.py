"""The streaming source's incremental snapshots: ``flowwarden snapshot request NAME`` for a query
read with ``.option("name", NAME)``.

The query looks for requests in ``_fw_signals`` (of its ``signals_database``) when it plans a
micro-batch, at most every :data:`REQUEST_POLL_SECONDS`, as a connector's stream does on its
heartbeat (:mod:`flowwarden.mongo.signals`); it takes one only at a plain change-stream offset
from which the last plan read every event there was (caught up), so that a chunk's window holds
the few changes made while it was read. A copy's progress lives in the offsets
(:class:`~flowwarden.spark.source.offsets.RequestedOffset`), never in ``_fw_signals``, so a
restarted query goes on from its offsets log.

Each micro-batch of the copy keeps the rule of :mod:`flowwarden.runtime.incremental`, a copied
row never overwrites a newer change: planning from a start at position ``T``

1. takes the low watermark ``L`` = the cluster time of ``T`` (the query's position);
2. reads the next chunk in ``_id`` order with read concern majority in a causally consistent
   session at ``L``, and writes the query's watermark document in ``_fw_signals`` in the same
   session: its operation time is the high watermark ``H``;
3. reads the change stream after ``T`` up to the first event past ``H`` (or a post-batch
   resume token at ``H`` or later), and ends the micro-batch just before it: the micro-batch
   holds those events, whatever ``max_events_per_trigger`` says, then the chunk's rows whose
   document had no event in ``(L, H]`` among them.

Its end offset carries the chunk's last ``_id``, ``L`` and ``H``. A micro-batch Spark replays
without planning it again reads the same events, drops the rows by the same rule, and reads the
chunk's ``_id`` range again as the documents are then (their changes since follow as events).
The copy ends when no chunk is left (the request is marked finished by this query's name) or
when the request was cancelled or removed: the next micro-batch ends at a plain offset.
A partitioned query takes no requests (``name`` needs ``partitions`` 1).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from bson import MinKey, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo.read_concern import ReadConcern

from flowwarden.errors import StreamError
from flowwarden.events import token_cluster_time
from flowwarden.mongo.calls import run
from flowwarden.mongo.initial_copy import all_of, document_key, id_range, plain_id, snapshot_row
from flowwarden.mongo.signals import (
    SIGNALS_COLLECTION,
    SOURCE_KIND,
    WATERMARK_KIND,
    RequestProblem,
    RequestState,
    SnapshotRequest,
    mark_finished,
    refuse_request,
    request_namespaces,
    requests,
)
from flowwarden.spark.source import snapshot as source_snapshot
from flowwarden.spark.source.offsets import (
    RequestedOffset,
    StreamOffset,
    dump_filter,
    dump_id,
    load_filter,
    load_id,
)
from flowwarden.spark.source.options import SourceOptions

REQUEST_POLL_SECONDS = 1.0
"""How often the driver looks for requests, at most."""
# How long planning waits for the change stream to pass a chunk's high watermark: it was
# written just before, so only an unreachable server delays it.
WATERMARK_WAIT_SECONDS = 120.0
_MAJORITY = ReadConcern("majority")
_NO_TIME = Timestamp(0, 0)


class Requests:
    """A query's requests, as the driver last read them from ``_fw_signals``."""

    def __init__(self, client: Any, options: SourceOptions) -> None:
        assert options.name is not None
        self.name = options.name
        self.options = options
        self.signals = client[options.signals_database][SIGNALS_COLLECTION]
        self._read_at = float("-inf")
        self._known: dict[str, SnapshotRequest] = {}
        self.pending: SnapshotRequest | None = None
        """The oldest request this query has still to copy."""

    def poll(self, *, force: bool = False) -> None:
        """Read the requests again, unless that was done less than a second ago."""
        now = time.monotonic()
        if not force and now - self._read_at < REQUEST_POLL_SECONDS:
            return
        if self._read_at == float("-inf"):
            self.signals.update_one(
                {"_id": f"{SOURCE_KIND}:{self.name}"},
                {
                    "$set": {
                        "kind": SOURCE_KIND,
                        "stream": self.name,
                        "namespace": self.options.namespace,
                        "seenAt": datetime.now(timezone.utc),
                    }
                },
                upsert=True,
            )
        self._read_at = now
        found = run(requests(self.signals, {"stream": self.name}))
        self._known = {request.id: request for request in found}
        self.pending = next(
            (r for r in found if r.state is RequestState.REQUESTED and self.name not in r.finished), None
        )

    def known(self, identity: str) -> SnapshotRequest | None:
        """The request as last read; None when it is gone."""
        return self._known.get(identity)

    def state_of(self, identity: str) -> RequestState | None:
        """The request's state as last read; None when it is gone."""
        request = self._known.get(identity)
        return None if request is None else request.state

    def finished(self, identity: str) -> None:
        run(mark_finished(self.signals, identity, self.name))
        self.poll(force=True)

    def refuse(self, request: SnapshotRequest, reason: str) -> None:
        run(refuse_request(self.signals, request.id, self.name, reason))
        self.poll(force=True)


def begin(
    request: SnapshotRequest,
    options: SourceOptions,
    *,
    client: Any,
    raw_client: Any,
    token: str,
    query: Mapping[str, Any],
) -> RequestedOffset:
    """The copy's progress before its first chunk, at the stream position ``token``;
    :class:`~flowwarden.mongo.signals.RequestProblem` when the query cannot serve it."""
    namespaces = request_namespaces(
        request.collections,
        database=options.database,
        collection=options.collection,
        selection=options.selection,
    )
    if namespaces is None:
        namespaces = source_snapshot.namespaces(
            client, options.database, options.collection, options.selection
        )
    if not namespaces:
        raise RequestProblem("the query watches no collection to copy")
    own = all_of(query, request.filter or {})
    return RequestedOffset(
        token=token,
        request=request.id,
        filter=dump_filter(request.filter),
        namespaces=tuple(namespaces),
        at=0,
        end_id=dump_id(source_snapshot.bound(raw_client, namespaces[0], own)),
        last_id=dump_id(MinKey()),
        copied=0,
        low=_NO_TIME,
        high=_NO_TIME,
    )


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A planned micro-batch of the copy: its end offset and its events' and rows' BSON."""

    end: RequestedOffset
    data: bytes | None


def plan_chunk(
    progress: RequestedOffset,
    *,
    raw_client: Any,
    signals_database: str,
    name: str,
    query: Mapping[str, Any],
    chunk_size: int,
    watch: Callable[..., Any],
    max_bytes: int,
    projection: Mapping[str, Any] | None = None,
) -> Chunk | None:
    """The micro-batch from ``progress`` (the start's copy state, at its token) that hands over
    the next chunk (see the module docstring), its documents read with ``projection`` (the
    excluded fields left out by the server); None once no chunk is left."""
    own = all_of(query, load_filter(progress.filter))
    low = token_cluster_time({"_data": progress.token})
    with raw_client.start_session(causal_consistency=True) as session:
        session.advance_operation_time(low)  # the read sees every write up to the position
        at, last, end_id = progress.at, load_id(progress.last_id), load_id(progress.end_id)
        while True:
            documents: list[Any] = []
            if not isinstance(end_id, MinKey):
                documents = _find(
                    raw_client, progress.namespaces[at], own, last, end_id, chunk_size, session, projection
                )
            if documents:
                break
            at += 1
            if at >= len(progress.namespaces):
                return None
            last, end_id = MinKey(), source_snapshot.bound(raw_client, progress.namespaces[at], own)
        # Through the client that started the session: the watermark is written after the read.
        raw_client[signals_database][SIGNALS_COLLECTION].update_one(
            {"_id": f"{WATERMARK_KIND}:{name}"},
            {
                "$inc": {"chunks": 1},
                "$set": {"kind": WATERMARK_KIND, "stream": name, "request": progress.request},
            },
            upsert=True,
            session=session,
        )
        high = session.operation_time
    assert isinstance(high, Timestamp), "the deployment reports no operation time"
    ids = {document_key(plain_id(document["_id"])): index for index, document in enumerate(documents)}
    database, collection = progress.namespaces[at].split(".", 1)
    namespace = {"db": database, "coll": collection}
    events, end_token, dropped = _scan_to(watch, progress.token, low, high, namespace, ids, max_bytes)
    rows = [
        snapshot_row(document, database, collection, high, raw=True).raw
        for index, document in enumerate(documents)
        if index not in dropped
    ]
    end = dataclasses.replace(
        progress,
        token=end_token,
        at=at,
        end_id=dump_id(end_id),
        last_id=dump_id(plain_id(documents[-1]["_id"])),
        copied=progress.copied + len(rows),
        low=low,
        high=high,
    )
    return Chunk(end, None if events is None else b"".join([*events, *rows]))


def _find(
    raw_client: Any,
    namespace: str,
    query: Mapping[str, Any],
    after: Any,
    through: Any,
    limit: int,
    session: Any,
    projection: Mapping[str, Any] | None,
) -> list[Any]:
    database, collection = namespace.split(".", 1)
    target = raw_client[database][collection].with_options(read_concern=_MAJORITY)
    selected = all_of(query, id_range(after, through))
    cursor = target.find(
        selected, projection=projection, sort=[("_id", 1)], limit=limit, batch_size=limit, session=session
    )
    with cursor:
        return list(cursor)


def _scan_to(
    watch: Callable[..., Any],
    token: str,
    low: Timestamp,
    high: Timestamp,
    namespace: Mapping[str, str],
    ids: Mapping[Any, int],
    max_bytes: int,
) -> tuple[list[bytes] | None, str, set[int]]:
    """The events after ``token`` up to the high watermark (their BSON, None once they passed
    ``max_bytes``), the token the micro-batch ends at, and the rows the events between the
    watermarks dropped."""
    events: list[bytes] | None = []
    size = 0
    dropped: set[int] = set()
    end = token
    deadline = time.monotonic() + WATERMARK_WAIT_SECONDS
    with watch({"start_after": {"_data": token}}, raw=True) as stream:
        while True:
            event = stream.try_next()
            if event is None:
                position = stream.resume_token
                if position is not None and token_cluster_time(position) >= high:
                    end = position["_data"]
                    break
                if time.monotonic() > deadline:
                    raise StreamError(
                        f"the change stream did not reach the snapshot's watermark {high}, written "
                        f"{WATERMARK_WAIT_SECONDS:.0f} s before; the server or its oplog changed "
                        "under the query"
                    )
                continue
            at = token_cluster_time(event["_id"])
            if at > high:
                break  # the next micro-batch begins with it
            if at > low and event.get("ns") == namespace:
                _drop(event, ids, dropped)
            end = event["_id"]["_data"]
            if events is not None:
                raw = bytes(event.raw)
                size += len(raw)
                events.append(raw)
                if size > max_bytes:
                    events = None  # too much to carry: the executor reads the range again
    return events, end, dropped


def _drop(event: Any, ids: Mapping[Any, int], dropped: set[int]) -> None:
    """The watermark rule: an event between the watermarks drops its document's row."""
    key = event.get("documentKey")
    if key is not None and "_id" in key:
        index = ids.get(document_key(key["_id"]))
        if index is not None:
            dropped.add(index)


def replay_rows(
    raw_client: Any,
    start: StreamOffset,
    end: RequestedOffset,
    query: Mapping[str, Any],
    events: Iterable[RawBSONDocument],
    projection: Mapping[str, Any] | None = None,
) -> Iterator[RawBSONDocument]:
    """``events`` (the range's, replayed), then the chunk's rows read again, less those of the
    documents an event between the watermarks changed."""
    changed: set[Any] = set()
    namespace = end.namespaces[end.at]
    database, collection = namespace.split(".", 1)
    chunk_namespace = {"db": database, "coll": collection}
    for event in events:
        at = token_cluster_time(event["_id"])
        if end.low < at <= end.high and event.get("ns") == chunk_namespace:
            key = event.get("documentKey")
            if key is not None and "_id" in key:
                changed.add(document_key(key["_id"]))
        yield event
    lower: Any = MinKey()
    if isinstance(start, RequestedOffset) and start.request == end.request and start.at == end.at:
        lower = load_id(start.last_id)
    own = all_of(query, load_filter(end.filter))
    for document in _find(raw_client, namespace, own, lower, load_id(end.last_id), 0, None, projection):
        if document_key(plain_id(document["_id"])) not in changed:
            yield snapshot_row(document, database, collection, end.high, raw=True)


__all__ = [
    "REQUEST_POLL_SECONDS",
    "Chunk",
    "Requests",
    "begin",
    "plan_chunk",
    "replay_rows",
]
