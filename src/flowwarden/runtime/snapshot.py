"""The initial snapshot: a stream's existing documents, handed to its methods before its changes.

The rules this module keeps:

- the stream position ``T`` is taken from the server, and stored (as lastSeen and in the
  snapshot's progress) before the first document is read; once the copy is done the change
  stream opens right after ``T``. Every write after ``T`` therefore arrives as a change, and
  nothing is missed; a document written while the copy runs may arrive twice (copied, and as its
  change), never zero times. This holds with ``start_position=LATEST`` too: the run that finishes
  the copy streams from ``T`` (a later process start takes "now", as LATEST says);
- the copy is bounded: when a collection's copy begins (after ``T`` was taken), its highest
  ``_id`` under the copy filter is read and stored in the progress before any of its rows is
  handed over, and the copy reads no ``_id`` past it. Documents inserted later with a higher
  ``_id`` are changes after ``T``, so they arrive as changes, and the copy ends however fast
  documents are inserted. Each collection's bound is taken when its copy begins, not all at the
  start: the progress then holds one bound whatever the number of collections (a cluster stream
  may copy thousands, and the progress is written twice per chunk), and a collection copied later
  copies at most what was inserted while the ones before it were copied (rows that also arrive
  as their changes), which is bounded by then too;
- documents are read in ``_id`` order, collection after collection, in chunks of
  ``snapshot_chunk_size`` documents, and of at most ``max_events`` for ``@on_batch`` and
  ``@on_dataframe`` methods, so that a chunk is handed over as exactly one batch. A chunk is
  planned before it is handed over: its number and its last ``_id`` are stored in the progress
  (``chunk``, ``chunkEnd``); once every row of it was handled (or given up on under the retry
  policy's ``on_exhausted``) it is stored as finished. A restart hands a planned, unfinished
  chunk over again as the same ``_id`` range under the same number (``ctx.batch_id`` is
  ``snapshot:<T>:<chunk number>``): the documents of that range as they are then, so one deleted
  since is missing (its delete follows as a change) and one inserted since inside the range is
  there (and arrives as its insert too). It then copies on right after the chunk;
- the stream's ``$match`` stages that read only the document (``fullDocument.*``,
  ``documentKey._id``) filter the copy too, so a partitioned stream's
  bucket, or a filter on a document field, copies what its changes would deliver
  (:func:`flowwarden.mongo.initial_copy.copy_filter`); a database or cluster stream copies the
  collections its ``collections`` and ``exclude_collections`` select, and ``exclude_fields`` are
  left out of the documents by the server (a projection);
- rows are screened as events are: hashed fields hashed, and the ``@event_filter`` asked
  (:meth:`~flowwarden.runtime.dispatch.EventDispatch.deliver_snapshot`);
- rows are ChangeEvents with ``operation_type == "snapshot"``, the document as
  ``full_document``, its ``_id`` as ``document_key``, the namespace as ``ns`` and ``T``'s cluster
  time as ``cluster_time``; they carry no resume token (``_id``): they are not positions.

Nothing here opens a change stream; :class:`~flowwarden.runtime.stream.StreamRunner` opens it from
the stored position once the copy is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any, TypeVar

from bson import MinKey

from flowwarden.checkpoints import Checkpoint, SnapshotProgress
from flowwarden.checkpoints.model import utc_now
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config import Snapshot
from flowwarden.config.spec import StreamSpec
from flowwarden.errors import ConfigurationError
from flowwarden.events import token_cluster_time
from flowwarden.mongo.initial_copy import id_range, plain_id
from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.copying import CopyReader
from flowwarden.runtime.dispatch import EventDispatch
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.opening import StreamOpener, describe_token
from flowwarden.runtime.stopping import StopRequested, unless_stopping

T = TypeVar("T")

class SnapshotCopy:
    """Copies one stream's existing documents into its handler methods, resumably."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        client: Any,
        store: AwaitableStore,
        opener: StreamOpener,
        dispatch: EventDispatch,
        giving_up: GivingUp,
        stopping: asyncio.Event,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.mode = spec.stream.snapshot
        self._store = store
        self._opener = opener
        self._dispatch = dispatch
        self._stopping = stopping
        self.log = stream_logger(__name__, spec.name)
        self._reader = CopyReader(spec, client=client, opener=opener, giving_up=giving_up)
        self.progress: SnapshotProgress | None = None
        """The newest progress, saved or loaded (status and metrics read it)."""
        self.anew = False
        """Set when the stream's position fell out of the oplog and ``snapshot=WHEN_NEEDED``: the
        next run copies everything again from a new position instead of recovering."""

    @property
    def enabled(self) -> bool:
        return self.mode is not Snapshot.NEVER

    def needed(self, checkpoint: Checkpoint | None) -> bool:
        """Whether this run of an :attr:`enabled` copy copies before it streams: no checkpoint
        yet, a copy left unfinished, or (WHEN_NEEDED) lost history."""
        if self.anew or checkpoint is None:
            return True
        progress = checkpoint.snapshot
        return progress is not None and not progress.done

    async def run(self, checkpoint: Checkpoint | None, epoch: int) -> SnapshotProgress | None:
        """Copy (from the start, or on from the stored progress) until done; returns the final
        progress, saved with ``done``, or None when a halt (a stop, a lost lease) interrupted it:
        the chunk in hand then stays unfinished. What it waits for from the deployment (reads,
        progress writes; not the handlers) is given up on at a stop
        (:mod:`flowwarden.runtime.stopping`)."""
        try:
            return await self._run(checkpoint, epoch)
        except StopRequested:
            return None

    async def _run(self, checkpoint: Checkpoint | None, epoch: int) -> SnapshotProgress | None:
        if not self._store.keeps_snapshots:
            raise ConfigurationError(
                f"the checkpoint store {self._store.store!r} cannot keep an initial snapshot's "
                "progress (it has no save_snapshot method)",
                owner=f"stream {self.name!r}",
                stream=self.name,
                option="snapshot",
                value=self.mode,
                allowed="a store with save_snapshot (every store flowwarden ships has it), or NEVER",
            )
        progress = None if checkpoint is None or self.anew else checkpoint.snapshot
        if progress is None or progress.done:
            progress = await self._io(self._begin(epoch))
        else:
            self.log.info(
                "stream %s: continuing the initial snapshot after %s document(s), in %s%s",
                self.name,
                progress.copied,
                progress.namespace,
                f", handing chunk {progress.chunk} over again" if progress.pending else "",
            )
        self.progress = progress
        while True:
            if self._stopping.is_set():
                return None
            if progress.pending:
                # Planned before a restart: the same _id range again.
                planned_range = id_range(progress.last_id, progress.chunk_end)
                documents = await self._io(self._find(progress.namespace, planned_range))
            else:
                planned = await self._io(self._plan(progress, epoch))
                if planned is None:
                    break
                progress, documents = planned
            handed_over = await self._hand_over(progress, documents, epoch)
            if handed_over is None:
                return None
            progress = handed_over
        progress = replace(progress, done=True)
        await self._io(self._store.save_snapshot(self.name, progress, epoch))
        self.progress = progress
        self.anew = False
        # The changes this run streams follow T: start_position=LATEST ignores a stored position
        # at process start only, and T was this process's start (its "now" when the copy began).
        self._opener.first_run = False
        self.log.info(
            "stream %s: initial snapshot done: %d document(s); streaming changes after %s",
            self.name,
            progress.copied,
            describe_token(progress.token),
        )
        return progress

    async def _begin(self, epoch: int) -> SnapshotProgress:
        """Take the position the changes will follow, store it, and plan the copy."""
        token = await self._opener.current_position()
        namespaces = await self._namespaces()
        total = await self._estimate(namespaces)
        first = namespaces[0] if namespaces else ""
        progress = SnapshotProgress(
            token=token,
            namespaces=tuple(namespaces) or ("",),
            namespace=first,
            end_id=await self._bound(first),  # after the position: see the module docstring
            total=total,
            started_at=utc_now(),
        )
        # The position first: whatever happens to the copy, changes after it are not lost.
        await self._store.save_seen(self.name, token, epoch)
        await self._store.save_snapshot(self.name, progress, epoch)
        self.log.info(
            "stream %s: initial snapshot of %s (about %d document(s)); changes will follow from %s",
            self.name,
            ", ".join(namespaces) or "no collection",
            total,
            describe_token(token),
        )
        return progress

    async def _plan(
        self, progress: SnapshotProgress, epoch: int
    ) -> tuple[SnapshotProgress, list[Any]] | None:
        """Read the next chunk and store it as planned; None once every collection was copied.
        A collection the copy moves on to gets its bound first (stored with its first chunk)."""
        while True:
            if progress.namespace and not isinstance(progress.end_id, MinKey):
                documents = await self._find(
                    progress.namespace, id_range(progress.last_id, progress.end_id), self._chunk_size
                )
                if documents:
                    planned = replace(
                        progress, chunk=progress.chunk + 1, chunk_end=plain_id(documents[-1]["_id"])
                    )
                    await self._store.save_snapshot(self.name, planned, epoch)
                    self.progress = planned
                    return planned, documents
            index = progress.namespaces.index(progress.namespace) + 1
            if index >= len(progress.namespaces):
                return None
            namespace = progress.namespaces[index]
            end_id = await self._bound(namespace)
            progress = replace(progress, namespace=namespace, last_id=MinKey(), end_id=end_id)

    async def _hand_over(
        self, progress: SnapshotProgress, documents: list[Any], epoch: int
    ) -> SnapshotProgress | None:
        """Hand the planned chunk over, then store it as finished; None when a row was left
        unfinished."""
        rows = await self._rows(documents, progress.namespace, token_cluster_time(progress.token))
        if rows:
            batch_id = f"snapshot:{progress.token['_data']}:{progress.chunk}"
            await self._dispatch.deliver_snapshot(rows, batch_id)
            if self._dispatch.halt:  # a row was left unfinished (a stop, a lost lease)
                return None
        finished = replace(
            progress, last_id=progress.chunk_end, chunk_end=MinKey(), copied=progress.copied + len(documents)
        )
        await self._io(self._store.save_snapshot(self.name, finished, epoch))
        self.progress = finished
        return finished

    @property
    def _chunk_size(self) -> int:
        size = self.spec.stream.snapshot_chunk_size
        method = self.spec.batch or self.spec.dataframe
        return size if method is None else min(size, method.max_events)

    async def _io(self, work: Awaitable[T]) -> T:
        return await unless_stopping(work, self._stopping)

    async def _find(self, namespace: str, ids: dict[str, Any], limit: int = 0) -> list[Any]:
        return await self._reader.find(namespace, ids, limit)

    async def _bound(self, namespace: str) -> Any:
        return await self._reader.bound(namespace)

    async def _rows(self, documents: list[Any], namespace: str, cluster_time: Any) -> list[Any]:
        return await self._reader.rows(documents, namespace, cluster_time)

    async def _namespaces(self) -> list[str]:
        return await self._reader.namespaces()

    async def _estimate(self, namespaces: list[str]) -> int:
        return await self._reader.estimate(namespaces)


__all__ = ["SnapshotCopy"]
