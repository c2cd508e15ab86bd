"""Incremental snapshots: existing documents copied while the stream runs, between its changes.

A request (``flowwarden snapshot request``, :meth:`flowwarden.Connector.request_snapshot`) is a
document in ``_fw_signals`` (:mod:`flowwarden.mongo.signals`); the stream looks for one on its
heartbeat (every ``save_interval_seconds``, at most once a second) while it reads. The copy then
goes through the requested collections in ``_id`` chunks, each handed over between two changes
of the stream, in stream order, as rows with ``operation_type == "snapshot"``.

The rule this module keeps, MongoDB's form of the watermarks of Netflix's DBLog: **a copied row
never overwrites a newer change.** For each chunk, in the read loop, between two events:

1. the low watermark ``L`` is the cluster time of the stream's position: the last event (or
   post-batch resume token) the read loop has taken. Every event the loop takes from here on
   has a cluster time of at least ``L``;
2. the chunk is read with read concern majority in a causally consistent session whose
   operation time is ``L`` (``afterClusterTime``): it sees every write up to ``L``, whichever
   node answers, and its rows are the documents as they were at some moment between ``L`` and
   the end of the read;
3. the high watermark ``H``: a write to the stream's watermark document in ``_fw_signals``, in
   the same session, after the read; ``H`` is its operation time. Every write the rows show has
   a cluster time below ``H``. The write is an oplog entry, so every change stream's position
   passes ``H``, even a collection stream's that never returns it (a write to the watched
   collection would be seen, and pollute the user's data; ``$changeStream`` sees no other
   collection): post-batch resume tokens carry it, and a stream with no event of its own still
   reaches it;
4. the loop reads on, handing events over as usual. An event whose cluster time lies in
   ``(L, H]`` and whose document is in the chunk drops that document's row: the change wins.
5. at the first event past ``H`` (or a post-batch token at or past ``H``: every event before
   it was taken), before that event, the rows left are handed over: after the events gathered
   in the batch being formed, after every event in flight, as one batch of their own for
   ``@on_batch``/``@on_dataframe`` methods (``ctx.batch_id`` ``snapshot:<request>:<chunk>``). A
   row carries ``H`` as its cluster time.

Why that suffices: a document whose row is handed over had no change in ``(L, H]``, so the row
is the document as it is at ``H`` (every write up to ``L`` is in it, none after ``L`` was made);
every change of it before ``H`` was handed over before the row, every change after ``H`` comes
after it. A document that changed in ``(L, H]`` has that change, which the stream hands over
before ``H``, and no row. A document inserted after the copy of its collection began, past the
collection's bound, arrives as its insert. The rule sees what the stream's pipeline lets
through: a change its ``$match`` filters out drops no row (the stream never delivers it
either); changes carry the document's state only where the stream asks for it
(``full_document="updateLookup"``, or inserts and replaces).

Progress is saved per chunk in the checkpoint record (``incrementalSnapshot``): a chunk is
planned (its last ``_id`` stored) before its watermark is written, and finished once its rows
were handled. After a crash, a re-open, a stop or a lost lease, a window that was open is
dropped and its chunk, still planned, is read again (the same ``_id`` range, the documents as
they are then) with new watermarks: no chunk is lost, and at most the one in hand is handed
over twice (when the process ended after its rows were handled and before it was stored as
finished). Each time the stream reads again, the progress is loaded again from the record, so a
stream that stood by while another process copied on (a lease lost, a bucket handed over) goes on
from where that one stopped. A chunk's rows are never handed over after an event past its
``H`` in one run. A request cancelled, or no longer there, ends the copy at its next step: the
window open then is dropped, and the progress is stored as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from bson import MinKey, Timestamp
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from flowwarden.checkpoints import CheckpointCommitter
from flowwarden.checkpoints.model import IncrementalProgress, IncrementalState, utc_now
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config.spec import StreamSpec
from flowwarden.errors import CheckpointError
from flowwarden.events import token_cluster_time
from flowwarden.mongo.calls import maybe_await, run_async
from flowwarden.mongo.initial_copy import document_key, id_range, plain_id
from flowwarden.mongo.positions import server_cluster_time
from flowwarden.mongo.signals import (
    WATERMARK_KIND,
    RequestProblem,
    RequestState,
    SnapshotRequest,
    mark_finished,
    refuse_request,
    request_namespaces,
    requests,
)
from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.copying import CopyReader
from flowwarden.runtime.dispatch import EventDispatch
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.opening import StreamOpener
from flowwarden.runtime.stopping import unless_stopping

DEFAULT_POLL_SECONDS = 5.0
"""How often a stream that saves every event (``save_interval_seconds=0``) looks for requests."""
MIN_POLL_SECONDS = 1.0
"""A stream looks for requests at most this often, however short its heartbeat."""
_MAJORITY = ReadConcern("majority")


T = TypeVar("T")

class ChunkWindow:
    """One chunk between its watermarks: its rows, and which of them a change has dropped."""

    __slots__ = ("dropped", "high", "keys", "low", "namespace", "rows")

    def __init__(
        self, low: Timestamp, high: Timestamp, namespace: str, rows: list[Any], ids: list[Any]
    ) -> None:
        self.low = low
        self.high = high
        database, _, collection = namespace.partition(".")
        self.namespace = {"db": database, "coll": collection}
        self.rows = rows
        self.keys = {document_key(identity): index for index, identity in enumerate(ids)}
        self.dropped: set[int] = set()

    def observe(self, change: Mapping[str, Any]) -> bool:
        """Whether ``change`` lies past the high watermark; one between the watermarks drops its
        document's row."""
        at = token_cluster_time(change["_id"])
        if at > self.high:
            return True
        if at > self.low and change.get("ns") == self.namespace:
            key = change.get("documentKey")
            if key is not None and "_id" in key:
                self.drop(key["_id"])
        return False

    def reached(self, position: Mapping[str, Any]) -> bool:
        """Whether a post-batch resume token at ``position`` says every event up to the high
        watermark was read (the watermark is flowwarden's own write: no event shares its time)."""
        return token_cluster_time(position) >= self.high

    def drop(self, identity: Any) -> None:
        """The watermark rule: the row of the document ``identity`` is not handed over."""
        index = self.keys.get(document_key(identity))
        if index is not None:
            self.dropped.add(index)

    def kept(self) -> list[Any]:
        """The rows to hand over, in ``_id`` order."""
        dropped = self.dropped
        return [row for index, row in enumerate(self.rows) if index not in dropped]


class IncrementalSnapshot:
    """One stream's incremental snapshots: the requests it takes, and the chunks it interleaves
    with its changes (see the module docstring). The read loop calls :meth:`due` for each item
    it takes while :attr:`EventDispatch.copying` is set, and :meth:`step` when it says so;
    :meth:`watch_requests` runs beside the read loop and only notes what to do."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        client: Any,
        store: AwaitableStore,
        opener: StreamOpener,
        dispatch: EventDispatch,
        giving_up: GivingUp,
        signals: Any,
        stopping: asyncio.Event,
    ) -> None:
        self.spec = spec
        self._stopping = stopping
        self.name = spec.name
        self._client = client
        self._store = store
        self._dispatch = dispatch
        self._signals = signals
        self._base = CopyReader(spec, client=client, opener=opener, giving_up=giving_up)
        self.log = stream_logger(__name__, spec.name)
        interval = spec.checkpoint.save_interval_seconds
        self.poll_seconds = max(float(interval), MIN_POLL_SECONDS) if interval > 0 else DEFAULT_POLL_SECONDS
        self.progress: IncrementalProgress | None = None
        """The newest progress, saved or loaded (status and metrics read it)."""
        self._loaded = False
        self._request: SnapshotRequest | None = None
        self._reader: CopyReader | None = None
        self._window: ChunkWindow | None = None
        # What the watcher noted for the read loop: a request to take, or why to stop the copy.
        self._queued: SnapshotRequest | None = None
        self._stop_reason: str | None = None
        self._last_poll_error: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether the stream takes requests at all (it knows where its signals are)."""
        return self._signals is not None

    # -- the read loop's side --------------------------------------------------------------------

    def reset(self) -> None:
        """Forget what a reading stream had in hand: it reads again from its checkpoint, and so
        does the copy. The window open is dropped (its chunk, still planned, is read again with
        new watermarks), and the progress is loaded again from the checkpoint record at the next
        look for requests: while this stream did not read (a lease lost, a bucket handed over to
        another member of its fleet), another process may have copied on and stored further."""
        self._window = None
        self._loaded = False
        self._request = self._reader = self._queued = None
        self._stop_reason = None
        self._settle()

    def due(self, change: Any, empty: bool) -> bool:
        """Whether :meth:`step` must run before the read loop hands ``change`` over; between the
        watermarks, a change of a document of the chunk drops its row here."""
        window = self._window
        if window is None:
            batch = self._dispatch.batch
            return batch is None or not batch.replaying  # a batch formed again is not cut
        if self._stop_reason is not None:
            return True
        if empty:
            token = change.token
            return token is not None and window.reached(token)
        return window.observe(change)

    async def step(
        self,
        change: Any,
        empty: bool,
        position: Mapping[str, Any] | None,
        committer: CheckpointCommitter,
    ) -> None:
        """Before ``change``: hand the open chunk over once the stream passed its high
        watermark, stop or begin a copy, and open the next chunk at ``position``."""
        try:
            await self._step(change, empty, position, committer.epoch, committer)
        finally:
            self._settle()  # the watcher may have looked while this step waited

    async def _step(
        self,
        change: Any,
        empty: bool,
        position: Mapping[str, Any] | None,
        epoch: int,
        committer: CheckpointCommitter,
    ) -> None:
        window, self._window = self._window, None
        if window is not None and self._stop_reason is None:
            await self._release(window, committer, epoch)
            if self._dispatch.halt:
                return
        if self._stop_reason is not None:
            await self._io(self._end(IncrementalState.CANCELLED, epoch))
            return
        if self._request is None:
            queued, self._queued = self._queued, None
            if queued is None:
                return
            await self._io(self._begin(queued, epoch))
        if self._request is None or position is None or self._dispatch.halt:
            return
        await self._io(self._open(position, epoch))
        if self._window is not None and not empty:
            self._window.observe(change)  # taken after the position the new window starts at

    async def _open(self, position: Mapping[str, Any], epoch: int) -> None:
        """Read the next chunk after the low watermark and write its high watermark; the copy
        ends when no chunk is left."""
        reader, progress = self._reader, self.progress
        assert reader is not None and progress is not None
        low = token_cluster_time(position)
        session = await maybe_await(self._client.start_session(causal_consistency=True))
        try:
            session.advance_operation_time(low)  # the read sees every write up to the position
            while True:
                if progress.pending:
                    ids = id_range(progress.last_id, progress.chunk_end)
                    documents = await reader.find(
                        progress.namespace, ids, session=session, read_concern=_MAJORITY
                    )
                    if not documents:  # every document of the planned range is gone
                        progress = replace(progress, last_id=progress.chunk_end, chunk_end=MinKey())
                        await self._save(progress, epoch)
                        continue
                    break
                if progress.namespace and not isinstance(progress.end_id, MinKey):
                    documents = await reader.find(
                        progress.namespace,
                        id_range(progress.last_id, progress.end_id),
                        self._chunk_size,
                        session=session,
                        read_concern=_MAJORITY,
                    )
                    if documents:
                        progress = replace(
                            progress, chunk=progress.chunk + 1, chunk_end=plain_id(documents[-1]["_id"])
                        )
                        await self._save(progress, epoch)  # planned before its watermark
                        break
                index = progress.namespaces.index(progress.namespace) + 1
                if index >= len(progress.namespaces):
                    await self._end(IncrementalState.DONE, epoch)
                    return
                namespace = progress.namespaces[index]
                progress = replace(
                    progress, namespace=namespace, last_id=MinKey(), end_id=await reader.bound(namespace)
                )
                await self._save(progress, epoch)
            high = await self._watermark(session, progress)
        finally:
            await maybe_await(session.end_session())
        rows = await reader.rows(documents, progress.namespace, high)
        keys = [plain_id(row["documentKey"]["_id"]) for row in rows]
        self._window = ChunkWindow(low, high, progress.namespace, rows, keys)
        self.log.debug(
            "stream %s: chunk %d of %s read (%d document(s)) between the watermarks %s and %s",
            self.name,
            progress.chunk,
            progress.namespace,
            len(rows),
            low,
            high,
        )

    async def _watermark(self, session: Any, progress: IncrementalProgress) -> Timestamp:
        """Write the high watermark after the chunk's read; its cluster time."""
        await maybe_await(
            self._signals.update_one(
                {"_id": f"{WATERMARK_KIND}:{self.name}"},
                {
                    "$inc": {"chunks": 1},
                    "$set": {
                        "kind": WATERMARK_KIND,
                        "stream": self.name,
                        "request": progress.request,
                        "chunk": progress.chunk,
                        "at": datetime.now(timezone.utc),
                    },
                },
                upsert=True,
                session=session,
            )
        )
        high = session.operation_time
        if not isinstance(high, Timestamp):  # a reply without operationTime: ask the server
            high = await server_cluster_time(self._client)
        assert isinstance(high, Timestamp), "the deployment reports no cluster time"
        return high

    async def _release(self, window: ChunkWindow, committer: CheckpointCommitter, epoch: int) -> None:
        """Hand the chunk's rows over after every event before the high watermark, then store
        the chunk as finished; a halt meanwhile leaves it planned."""
        dispatch = self._dispatch
        if dispatch.batch is not None:
            await dispatch.batch.deliver(committer)  # the events gathered so far go first
        else:
            await dispatch.wait_in_flight()
        progress = self.progress
        assert progress is not None
        rows = window.kept()
        if rows:
            await dispatch.deliver_snapshot(rows, f"snapshot:{progress.request}:{progress.chunk}")
            if dispatch.halt:
                return
        finished = replace(
            progress,
            last_id=progress.chunk_end,
            chunk_end=MinKey(),
            copied=progress.copied + len(rows),
            dropped=progress.dropped + len(window.dropped),
        )
        await self._save(finished, epoch)

    @property
    def _chunk_size(self) -> int:
        size = self._request.chunk_size if self._request is not None else None
        size = size or self.spec.stream.snapshot_chunk_size
        method = self.spec.batch or self.spec.dataframe
        return size if method is None else min(size, method.max_events)

    async def _begin(self, request: SnapshotRequest, epoch: int) -> None:
        """Take ``request``: go on with its stored progress, or plan its copy and store that."""
        stored = self.progress
        if stored is not None and stored.request == request.id:
            if not stored.running:
                self._settle()
                return
            self._request, self._reader = request, self._base.narrowed(request.filter)
            self.log.info(
                "stream %s: continuing incremental snapshot %s after %d document(s), in %s",
                self.name,
                request.id,
                stored.copied,
                stored.namespace,
            )
            return
        if not self._store.keeps_incremental:
            await self._refuse(
                request,
                f"its checkpoint store {self._store.store!r} cannot keep an incremental snapshot's "
                "progress (it has no save_incremental method)",
            )
            return
        stream = self.spec.stream
        try:
            namespaces = request_namespaces(
                request.collections,
                database=stream.database,
                collection=stream.collection,
                selection=stream.selection,
            )
        except RequestProblem as problem:
            await self._refuse(request, str(problem))
            return
        reader = self._base.narrowed(request.filter)
        if namespaces is None:
            namespaces = await reader.namespaces()
        first = namespaces[0] if namespaces else ""
        progress = IncrementalProgress(
            request=request.id,
            namespaces=tuple(namespaces) or ("",),
            namespace=first,
            end_id=await reader.bound(first),
            total=await reader.estimate(namespaces),
            started_at=utc_now(),
        )
        await self._save(progress, epoch)
        self._request, self._reader = request, reader
        self.log.info(
            "stream %s: incremental snapshot %s of %s (about %d document(s)) begins; its chunks "
            "are handed over between the changes",
            self.name,
            request.id,
            ", ".join(namespaces) or "no collection",
            progress.total or 0,
        )

    async def _refuse(self, request: SnapshotRequest, reason: str) -> None:
        self.log.warning("stream %s: snapshot request %s refused: %s", self.name, request.id, reason)
        await run_async(refuse_request(self._signals, request.id, self.name, reason))
        self._settle()

    async def _end(self, state: IncrementalState, epoch: int) -> None:
        """Store the copy as done or cancelled and let the stream go on without it."""
        progress, request = self.progress, self._request
        why, self._stop_reason = self._stop_reason, None
        self._request = self._reader = self._window = None
        if progress is not None and progress.running:
            progress = replace(progress, state=state, ended_at=utc_now())
            await self._save(progress, epoch)
            if state is IncrementalState.DONE:
                await run_async(mark_finished(self._signals, progress.request, self.name))
                self.log.info(
                    "stream %s: incremental snapshot %s done: %d row(s) handed over, %d left out "
                    "for the changes that came while their chunk was read",
                    self.name,
                    progress.request,
                    progress.copied,
                    progress.dropped,
                )
            else:
                self.log.warning(
                    "stream %s: incremental snapshot %s stopped after %d row(s): %s",
                    self.name,
                    progress.request if request is None else request.id,
                    progress.copied,
                    why or "cancelled",
                )
        self._settle()

    async def _save(self, progress: IncrementalProgress, epoch: int) -> None:
        await self._io(self._store.save_incremental(self.name, progress, epoch))
        self.progress = progress

    async def _io(self, work: Awaitable[T]) -> T:
        """What the copy waits for from the deployment (not the handlers), given up on at a stop
        (:mod:`flowwarden.runtime.stopping`): the chunk in hand is copied again after a restart."""
        return await unless_stopping(work, self._stopping)

    def _settle(self) -> None:
        """Keep the read loop calling while there is anything to do, and only then."""
        busy = (
            self._request is not None
            or self._queued is not None
            or self._stop_reason is not None
            or self._window is not None
        )
        self._dispatch.copying = self if busy else None

    # -- looking for requests ------------------------------------------------------------------

    async def watch_requests(self, done: asyncio.Event) -> None:
        """Look for requests every :attr:`poll_seconds` until ``done`` is set (the stream's read
        ended). A failed look is logged and tried again at the next one."""
        while not done.is_set():
            try:
                await self.poll()
                self._last_poll_error = None
            except (PyMongoError, CheckpointError) as error:
                message = f"{type(error).__name__}: {error}"
                if message != self._last_poll_error and not done.is_set():
                    self.log.warning(
                        "stream %s: cannot read the snapshot requests (%s); trying again in %gs",
                        self.name,
                        message,
                        self.poll_seconds,
                    )
                self._last_poll_error = message
            # Woken by ``done`` rather than by cancelling alone: a driver call that a cancel
            # interrupts may end with an error of its own instead of the cancellation.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), self.poll_seconds)

    async def poll(self) -> None:
        """Read this stream's requests once and note what the read loop is to do."""
        if not self._loaded:
            checkpoint = await self._store.load(self.name)
            if checkpoint is not None:
                self.progress = checkpoint.incremental_snapshot
            self._loaded = True
        names = [self.name]
        base, bracket, _ = self.name.rpartition("[")
        if bracket and base and self.name.endswith("]"):
            names.append(base)  # a bucket takes the requests of its partitioned class
        listed = await run_async(requests(self._signals, {"stream": {"$in": names}}))
        found = [request for request in listed if request.for_stream(self.name)]
        stored = self.progress
        current = self._request.id if self._request is not None else None
        if current is None and stored is not None and stored.running:
            current = stored.request
        if current is not None:
            request = next((r for r in found if r.id == current), None)
            if request is None:
                self._stop_reason = "its request is no longer in _fw_signals"
            elif request.state is not RequestState.REQUESTED:
                self._stop_reason = f"its request was {request.state.value}"
            elif self._request is None:
                self._queued = request  # taken again after a restart
        else:
            for request in found:
                if request.state is not RequestState.REQUESTED or self.name in request.finished:
                    continue
                if stored is not None and stored.request == request.id:
                    if stored.state is IncrementalState.DONE:
                        # Done before a crash kept it from saying so.
                        await run_async(mark_finished(self._signals, request.id, self.name))
                    continue
                self._queued = request
                break
        self._settle()


__all__ = ["DEFAULT_POLL_SECONDS", "MIN_POLL_SECONDS", "ChunkWindow", "IncrementalSnapshot"]
