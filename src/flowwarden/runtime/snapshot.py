"""The initial snapshot: a stream's existing documents, handed to its methods before its changes.

The rules this module keeps:

- the stream position ``T`` is taken from the server, and stored (as lastSeen and in the
  snapshot's progress) before the first document is read; once the copy is done the change
  stream opens right after ``T``. Every write after ``T`` therefore arrives as a change, and
  nothing is missed; a document written while the copy runs may arrive twice (copied, and as its
  change), never zero times;
- documents are read in ``_id`` order, ``snapshot_chunk_size`` at a time, collection after
  collection; a chunk's progress is saved only after every row of it was handled (or given up on
  under the retry policy's ``on_exhausted``), so a restart copies on right after the last saved
  chunk and hands at most one chunk over again;
- the stream's ``$match`` stages that read only the document (``fullDocument.*``,
  ``documentKey._id``) filter the copy too, so a partitioned stream's
  bucket, or a filter on a document field, copies what its changes would deliver
  (:func:`flowwarden.snapshots.copy_filter`);
- rows are ChangeEvents with ``operation_type == "snapshot"``, the document as
  ``full_document``, its ``_id`` as ``document_key``, the namespace as ``ns`` and ``T``'s cluster
  time as ``cluster_time``; they carry no resume token (``_id``): they are not positions.

Nothing here opens a change stream; :class:`~flowwarden.runtime.stream.StreamRunner` opens it from
the stored position once the copy is done.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import bson
from bson import MinKey
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from flowwarden.checkpoints import Checkpoint, SnapshotProgress
from flowwarden.checkpoints.model import utc_now
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config import Snapshot
from flowwarden.errors import ConfigurationError
from flowwarden.events import token_cluster_time
from flowwarden.runtime.context import StreamLog
from flowwarden.runtime.dispatch import EventDispatch
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.opening import StreamOpener, describe_token
from flowwarden.snapshots import (
    after_id,
    all_of,
    copied_collection,
    copied_database,
    copy_filter,
    plain_id,
    snapshot_row,
)
from flowwarden.spec import StreamSpec


class SnapshotStopped(Exception):
    """The stream began stopping while the copy ran: the chunk in hand stays unsaved."""


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
        log: StreamLog,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.mode = spec.stream.snapshot
        self._client = client
        self._store = store
        self._opener = opener
        self._dispatch = dispatch
        self._giving_up = giving_up
        self._stopping = stopping
        self.log = log
        self.progress: SnapshotProgress | None = None
        """The newest progress, saved or loaded (status and metrics read it)."""
        self.anew = False
        """Set when the stream's position fell out of the oplog and ``snapshot=WHEN_NEEDED``: the
        next run copies everything again from a new position instead of recovering."""

    @property
    def enabled(self) -> bool:
        return self.mode is not Snapshot.NEVER

    def needed(self, checkpoint: Checkpoint | None) -> bool:
        """Whether this run copies before it streams: no checkpoint yet, a copy left unfinished,
        or (WHEN_NEEDED) lost history."""
        if not self.enabled:
            return False
        if self.anew or checkpoint is None:
            return True
        progress = checkpoint.snapshot
        return progress is not None and not progress.done

    async def run(self, checkpoint: Checkpoint | None, epoch: int) -> SnapshotProgress:
        """Copy (from the start, or on from the stored progress) until done; returns the final
        progress, saved with ``done``. Raises :class:`SnapshotStopped` when a stop interrupts it."""
        if not self._store.keeps_snapshots:
            raise ConfigurationError(
                f"the checkpoint store {self._store.store!r} cannot keep an initial snapshot's "
                "progress (it has no save_snapshot method)",
                owner=f"stream {self.name!r}",
                option="snapshot",
                value=self.mode,
                allowed="a store with save_snapshot (every store flowwarden ships has it), or NEVER",
            )
        progress = None if checkpoint is None or self.anew else checkpoint.snapshot
        if progress is None or progress.done:
            progress = await self._begin(epoch)
        else:
            self.log.info(
                "stream %s: continuing the initial snapshot after %s document(s), in %s",
                self.name,
                progress.copied,
                progress.namespace,
            )
        self.progress = progress
        index = progress.namespaces.index(progress.namespace)
        for namespace in progress.namespaces[index:]:
            if namespace != progress.namespace:
                progress = replace(progress, namespace=namespace, last_id=MinKey())
            progress = await self._copy(namespace, progress, epoch)
        progress = replace(progress, done=True)
        await self._store.save_snapshot(self.name, progress, epoch)
        self.progress = progress
        self.anew = False
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
        progress = SnapshotProgress(
            token=token,
            namespaces=tuple(namespaces) or ("",),
            namespace=namespaces[0] if namespaces else "",
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

    async def _copy(self, namespace: str, progress: SnapshotProgress, epoch: int) -> SnapshotProgress:
        if not namespace:
            return progress
        database, _, collection = namespace.partition(".")
        target = self._client[database][collection]
        # Read as raw BSON always: DataFrame streams keep it, the others decode each document on
        # its own, so one that cannot be decoded is given up alone (see _rows).
        codec = self._opener.read_options()
        raw = codec is not None
        strict: CodecOptions[Any] = target.codec_options
        # surrogateescape: reading a raw document's _id inflates all of it, and text that is not
        # UTF-8 must not stop the copy there (the bytes themselves stay as the server sent them).
        reading = (codec or CodecOptions(document_class=RawBSONDocument)).with_options(
            unicode_decode_error_handler="surrogateescape"
        )
        target = target.with_options(codec_options=reading)
        chunk = self.spec.stream.snapshot_chunk_size
        cluster_time = token_cluster_time(progress.token)
        query = copy_filter(self.spec.pipeline)
        while True:
            if self._stopping.is_set():
                raise SnapshotStopped()
            bounded = all_of(query, after_id(progress.last_id))
            cursor = target.find(bounded, sort=[("_id", 1)], limit=chunk, batch_size=chunk)
            documents = await cursor.to_list(None)
            if not documents:
                return progress
            rows = await self._rows(documents, namespace, cluster_time, None if raw else strict)
            batch_id = f"snapshot:{progress.token['_data']}:{progress.copied}"
            await self._dispatch.deliver_snapshot(rows, batch_id)
            if self._dispatch.halt:  # a row was left unfinished (a stop, a lost lease)
                raise SnapshotStopped()
            last = documents[-1]["_id"]
            progress = replace(progress, last_id=plain_id(last), copied=progress.copied + len(documents))
            await self._store.save_snapshot(self.name, progress, epoch)
            self.progress = progress
            if len(documents) < chunk:
                return progress

    async def _rows(
        self, documents: list[Any], namespace: str, cluster_time: Any, decode: CodecOptions[Any] | None
    ) -> list[Any]:
        """The snapshot rows of raw ``documents``, decoded with ``decode`` (None: kept raw). A
        document that cannot be decoded gets ``on_exhausted`` at once, alone: decoding it again
        cannot help (STOP fails the stream before it; SKIP and DEAD_LETTER go on without it)."""
        database, _, collection = namespace.partition(".")
        rows = []
        for document in documents:
            if decode is None:
                rows.append(snapshot_row(document, database, collection, cluster_time, raw=True))
                continue
            try:
                decoded = bson.decode(document.raw, codec_options=decode)
            except Exception as error:  # whatever the codec raised: this document cannot be read
                row = snapshot_row(document, database, collection, cluster_time, raw=True)
                await self._giving_up.undecodable(row.raw, error, in_batch=False)
                continue
            rows.append(snapshot_row(decoded, database, collection, cluster_time, raw=False))
        return rows

    async def _namespaces(self) -> list[str]:
        """The collections the stream covers, in name order."""
        options = self.spec.stream
        if options.collection is not None:
            return [f"{options.database}.{options.collection}"]
        databases = [options.database] if options.database is not None else await self._databases()
        namespaces: list[str] = []
        for database in databases:
            names = await self._client[database].list_collection_names(filter={"type": "collection"})
            namespaces.extend(f"{database}.{name}" for name in sorted(names) if copied_collection(name))
        return namespaces

    async def _databases(self) -> list[str]:
        names = await self._client.list_database_names()
        return sorted(name for name in names if copied_database(name))

    async def _estimate(self, namespaces: list[str]) -> int:
        total = 0
        for namespace in namespaces:
            database, _, collection = namespace.partition(".")
            total += await self._client[database][collection].estimated_document_count()
        return total


__all__ = ["SnapshotCopy", "SnapshotStopped"]
