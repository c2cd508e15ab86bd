"""The checkpoint store SPI: one sync and one async protocol with the same seven methods.

Every implementation keeps these rules (the contract suite in
:mod:`flowwarden.checkpoints.contract` pins each one):

* never regresses: a processed position older than or equal to the stored one writes nothing and
  returns :attr:`SaveResult.IGNORED`; only :meth:`rewind` moves a checkpoint backwards;
* fencing: a ``save`` or ``save_seen`` whose epoch is lower than the stored epoch raises
  :class:`~flowwarden.errors.FencedError` and writes nothing;
* ``save_seen`` moves only the lastSeen pair, ``save_batch_end`` only the batch end, ``save``
  only the lastProcessed pair and the bookkeeping (instance, count, epoch, metadata, updatedAt);
* atomic: each write is one conditional write, so racing writers (threads, tasks, processes)
  never leave two records or a regressed position behind;
* reads never invent a position: a load that fails raises
  :class:`~flowwarden.errors.CheckpointError` (:class:`~flowwarden.errors.UnreadableCheckpointError`
  when the stored record itself cannot be read); ``None`` means "no checkpoint stored".

Report a failed read or write as :class:`~flowwarden.errors.CheckpointError` raised ``from`` the
underlying error: :func:`flowwarden.mongo.failures.classify` judges it by that cause (a network error is
retried, refused credentials fail the stream at once).

Which methods a store must have is one rule, :func:`store_problem`, asked wherever a store comes
in (``@checkpoint(store=...)``, ``Connector(checkpoint_store=...)``, :class:`CheckpointCommitter`):
a store that lacks one is refused there, by name, never halfway through a run.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from typing import Any, Protocol, runtime_checkable

from flowwarden.checkpoints.model import Checkpoint, IncrementalProgress, SaveResult, SnapshotProgress
from flowwarden.errors import ConfigurationError
from flowwarden.events import ResumeToken

STORE_METHODS: tuple[str, ...] = ("load", "save", "save_seen", "save_batch_end", "delete", "list", "rewind")
"""The methods every checkpoint store has (sync or async): :class:`CheckpointStore`'s."""


@runtime_checkable
class CheckpointStore(Protocol):
    """A blocking checkpoint store (the committer calls it from a worker thread).

    A store whose calls never block (such as :class:`InMemoryCheckpointStore`) may set the class
    attribute ``nonblocking = True``; the committer then calls it inline on the event loop.
    """

    def load(self, stream_id: str) -> Checkpoint | None:
        """The stored checkpoint, or None when the stream has none. Raises CheckpointError on failure."""
        ...

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        """Write ``checkpoint`` if its processed token is newer than the stored one.

        Writes the lastProcessed pair, instance id, events count, epoch, metadata and updatedAt in
        one conditional write; the lastSeen pair on the checkpoint is not written (``save_seen``
        owns it). ``checkpoint.last_processed_token`` must be set (ValueError otherwise).
        Returns IGNORED when the stored token is the same or newer; raises FencedError when the
        stored epoch is higher than ``checkpoint.epoch``.
        """
        ...

    def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        """Move the lastSeen pair forward to ``token``, creating the record if missing.

        Never touches lastProcessed. IGNORED when the stored seen token is the same or newer;
        FencedError when the stored epoch is higher than ``epoch``.
        """
        ...

    def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        """Move the batch end forward to ``token``, creating the record if missing.

        The runtime calls it before a batch method runs, with the token of the batch's last
        event. Never touches either position. IGNORED when the stored batch end is the same or
        newer; FencedError when the stored epoch is higher than ``epoch``.
        """
        ...

    def delete(self, stream_id: str) -> bool:
        """Remove the stream's checkpoint; True when there was one."""
        ...

    def list(self) -> builtins.list[Checkpoint]:
        """Every stored checkpoint, ordered by stream id."""
        ...

    def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        """Set the processed position to ``token``, clear the seen pair and the batch end: the only
        move backwards.

        ``None`` clears both tokens, so the stream's ``start_position`` applies at its next start.
        The epoch, count and metadata are kept. A missing record is created when ``token`` is given.
        Stop the stream first: a running owner keeps saving its own, newer positions.
        """
        ...


@runtime_checkable
class AsyncCheckpointStore(Protocol):
    """The asyncio form of :class:`CheckpointStore`: same methods and rules, awaited."""

    async def load(self, stream_id: str) -> Checkpoint | None: ...

    async def save(self, checkpoint: Checkpoint) -> SaveResult: ...

    async def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult: ...

    async def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult: ...

    async def delete(self, stream_id: str) -> bool: ...

    async def list(self) -> builtins.list[Checkpoint]: ...

    async def rewind(self, stream_id: str, token: ResumeToken | None) -> None: ...


@runtime_checkable
class SnapshotStore(Protocol):
    """The two more methods a store needs for snapshots: ``save_snapshot`` for streams with an
    initial snapshot (``@change_stream(snapshot=...)``), ``save_incremental`` for incremental
    snapshots (``flowwarden snapshot request``); stores without them run every other stream. An
    asyncio store's methods are coroutines with the same signatures.

    ``save_snapshot`` writes ``progress`` as the record's snapshot progress (creating the record if
    missing), fenced by ``epoch`` like :meth:`CheckpointStore.save_seen`, and touches no token.
    Progress of the snapshot already stored (same ``progress.token``) never goes back: IGNORED
    when the stored :attr:`~flowwarden.checkpoints.model.SnapshotProgress.order` is the same or
    higher. Progress of another snapshot replaces it. :meth:`CheckpointStore.rewind` clears it.

    ``save_incremental`` does the same for the record's incremental snapshot progress, keyed by
    ``progress.request`` instead of a token (IGNORED when the stored
    :attr:`~flowwarden.checkpoints.model.IncrementalProgress.order` of the same request is the
    same or higher; another request's progress replaces it); :meth:`CheckpointStore.rewind`
    keeps it.
    """

    def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult: ...

    def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult: ...


def store_problem(store: object) -> str | None:
    """Why ``store`` cannot be a checkpoint store, naming each method it lacks; None when it can.

    Checked by duck typing: every one of :data:`STORE_METHODS` must be a callable attribute
    (``save_snapshot`` is asked for only by streams with an initial snapshot).
    """
    if isinstance(store, type):
        return f"the class {store.__name__} was given; pass an instance, e.g. {store.__name__}(...)"
    missing = [name for name in STORE_METHODS if not callable(getattr(store, name, None))]
    if not missing:
        return None
    return (
        f"{type(store).__name__} is not a checkpoint store: it lacks {', '.join(missing)}; a store "
        f"has {', '.join(STORE_METHODS)} (flowwarden.checkpoints.CheckpointStore, or "
        "AsyncCheckpointStore with the same methods as coroutines)"
    )


def check_store(store: object, *, owner: str, option: str) -> None:
    """Raise :class:`~flowwarden.errors.ConfigurationError` when :func:`store_problem` finds one."""
    problem = store_problem(store)
    if problem is not None:
        allowed = f"a store with {', '.join(STORE_METHODS)}"
        raise ConfigurationError(problem, owner=owner, option=option, value=store, allowed=allowed)


__all__ = [
    "STORE_METHODS",
    "AsyncCheckpointStore",
    "CheckpointStore",
    "SnapshotStore",
    "check_store",
    "store_problem",
]


class AwaitableStore:
    """Any checkpoint store, awaited the same way: the one place that knows how to call a store.

    An :class:`AsyncCheckpointStore`'s coroutines are awaited; a :class:`CheckpointStore`'s blocking
    calls run in a worker thread so they never block the event loop, unless the store declares
    ``nonblocking = True`` (the in-memory store): then they run inline.
    """

    def __init__(self, store: CheckpointStore | AsyncCheckpointStore) -> None:
        self.store = store
        self._awaited = inspect.iscoroutinefunction(getattr(store, "save", None))
        self._inline = not self._awaited and getattr(store, "nonblocking", False) is True
        self.in_mongodb = getattr(store, "in_mongodb", False) is True
        """The store keeps its records in MongoDB (it says so with ``in_mongodb = True``)."""

    async def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self.store, name)
        if self._awaited:
            return await method(*args)
        if self._inline:
            return method(*args)
        return await asyncio.to_thread(method, *args)

    async def load(self, stream_id: str) -> Checkpoint | None:
        result: Checkpoint | None = await self._call("load", stream_id)
        return result

    async def save(self, checkpoint: Checkpoint) -> SaveResult:
        result: SaveResult = await self._call("save", checkpoint)
        return result

    async def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        result: SaveResult = await self._call("save_seen", stream_id, token, epoch)
        return result

    async def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        result: SaveResult = await self._call("save_batch_end", stream_id, token, epoch)
        return result

    async def delete(self, stream_id: str) -> bool:
        return bool(await self._call("delete", stream_id))

    async def list(self) -> builtins.list[Checkpoint]:
        result: builtins.list[Checkpoint] = await self._call("list")
        return result

    async def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        await self._call("rewind", stream_id, token)

    @property
    def keeps_snapshots(self) -> bool:
        """Whether the store has ``save_snapshot`` (see :class:`SnapshotStore`)."""
        return callable(getattr(self.store, "save_snapshot", None))

    async def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        result: SaveResult = await self._call("save_snapshot", stream_id, progress, epoch)
        return result

    @property
    def keeps_incremental(self) -> bool:
        """Whether the store has ``save_incremental`` (see :class:`SnapshotStore`)."""
        return callable(getattr(self.store, "save_incremental", None))

    async def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult:
        result: SaveResult = await self._call("save_incremental", stream_id, progress, epoch)
        return result
