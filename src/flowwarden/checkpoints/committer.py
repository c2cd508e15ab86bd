"""The checkpoint committer: turns out-of-order handler completions into safe, batched saves.

Events get sequence numbers 1, 2, 3... in stream order; handlers finish them in any order and
call :meth:`CheckpointCommitter.commit`. The committer keeps the contiguous frontier (the highest
sequence with every lower one completed) and saves ONLY the frontier's token: a gap holds the
checkpoint back until it closes, so a restart never skips an unfinished event.

Saves run one at a time. Every ``save_every_n`` frontier advances, the commit that reaches the
count saves before it returns, so the stored position is never more than ``save_every_n`` events
behind the handlers. A single long-lived task ticks every ``save_interval_seconds`` (the
heartbeat, which also writes the last seen token). With both set to 0, each advancing commit is
saved before it returns. The hot path
(:meth:`commit`) takes no lock, logs nothing and allocates nothing but a dict slot for an
out-of-order completion.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any

from flowwarden._abandoning import abandon, unless_given_up
from flowwarden.checkpoints.model import Checkpoint, SaveResult
from flowwarden.checkpoints.store import AsyncCheckpointStore, AwaitableStore, CheckpointStore, check_store
from flowwarden.config import CheckpointOptions, validate_options
from flowwarden.errors import (
    CheckpointSaveFailedError,
    CommitterClosedError,
    ConfigurationError,
    FencedError,
)
from flowwarden.events import ResumeToken, token_data
from flowwarden.mongo.failures import is_retryable_save_error

SaveErrorCallback = Callable[[BaseException, int], None]
"""``on_save_error(error, consecutive_failures)``: called after every failed save."""

_NEVER = sys.maxsize


class CheckpointCommitter:
    """Saves the contiguous frontier of completed events for one stream; asyncio.

    Create it inside a running event loop (it starts its timer task there), then::

        committer = CheckpointCommitter(store, "orders", save_every_n=100, save_interval_seconds=5)
        await committer.commit(sequence, event.token)   # after the handler of `sequence` finished
        committer.observe_seen(post_batch_token)         # while nothing is in flight
        await committer.close(timeout=10)

    ``store`` is an :class:`AsyncCheckpointStore` (awaited) or a :class:`CheckpointStore` (its
    blocking calls run in a worker thread, unless the store declares ``nonblocking = True``).

    Rules:

    * never saves past a gap: only the highest contiguous completed sequence is written;
    * saves when ``save_every_n`` frontier advances happened since the last save (before the
      commit that reached the count returns), and every ``save_interval_seconds`` while there is
      unsaved progress or a newer seen token; 0 disables either; both 0 means each advancing
      commit is saved before it returns;
    * one save at a time; commits that reach the count during a save wait for it, and one save
      of the frontier they reached covers them all;
    * a failed save keeps the frontier and is retried at the next trigger (timer or count).
      ``on_save_error`` hears about every failure (and ``on_saved`` how long each successful
      write took). After ``max_consecutive_failures`` in a row,
      a FencedError, or an error :func:`is_retryable_save_error` rejects, the committer fails:
      :attr:`failed` resolves to the error and every later commit/flush raises it;
    * ``initial`` (the loaded checkpoint) continues its events count and metadata.
    """

    def __init__(
        self,
        store: CheckpointStore | AsyncCheckpointStore,
        stream_id: str,
        *,
        save_every_n: int,
        save_interval_seconds: float,
        epoch: int = 0,
        instance_id: str | None = None,
        instance_token: str | None = None,
        initial: Checkpoint | None = None,
        on_save_error: SaveErrorCallback | None = None,
        on_saved: Callable[[float], None] | None = None,
        max_consecutive_failures: int = 10,
    ) -> None:
        owner = f"CheckpointCommitter({stream_id!r})"
        # The two save options mean what they mean in @checkpoint, and are checked by its model.
        validate_options(
            CheckpointOptions,
            owner,
            {"save_every_n": save_every_n, "save_interval_seconds": save_interval_seconds},
            label="",
        )
        check_store(store, owner=owner, option="store")
        if max_consecutive_failures < 1:
            raise ConfigurationError(
                "must be >= 1", owner=owner, option="max_consecutive_failures", value=max_consecutive_failures
            )
        if initial is not None and initial.stream_id != stream_id:
            raise ConfigurationError(
                f"initial checkpoint belongs to stream {initial.stream_id!r}", owner=owner, option="initial"
            )
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "CheckpointCommitter must be created inside a running event loop "
                "(it starts its save timer there)"
            ) from None

        self.stream_id = stream_id
        # This module's logger; every record carries the stream's name (the JSON format's field).
        self.log = logging.LoggerAdapter(logging.getLogger(__name__), {"stream": stream_id})
        self.save_every_n = save_every_n
        self.save_interval_seconds = float(save_interval_seconds)
        self.epoch = epoch
        self.instance_id = instance_id
        self.instance_token = instance_token
        self.max_consecutive_failures = max_consecutive_failures
        self._on_save_error = on_save_error
        self._on_saved = on_saved
        self._calls = AwaitableStore(store)

        # Gap tracking: _frontier is the highest sequence with every lower one completed;
        # _completed holds completions above it until the gap below them closes.
        self._frontier = 0
        self._frontier_token: ResumeToken | None = None
        self._completed: dict[int, ResumeToken] = {}

        self._saved_sequence = 0
        self._saved_token: ResumeToken | None = None if initial is None else initial.last_processed_token
        self._seen_token: ResumeToken | None = None
        self._saved_seen: ResumeToken | None = None if initial is None else initial.last_seen_token
        self._events_base = 0 if initial is None else initial.events_processed
        self._metadata: dict[str, Any] = {} if initial is None else dict(initial.metadata)

        self._every_commit = save_every_n == 0 and save_interval_seconds == 0
        # The frontier value at which commit() triggers a save; _NEVER for timer-only saving.
        self._save_at = 1 if self._every_commit else (save_every_n or _NEVER)

        self.saves = 0
        self.save_failures = 0
        self.consecutive_failures = 0
        self._unconfirmed_since: float | None = None
        self._failure: BaseException | None = None
        # commit() checks this one attribute: set once the committer is closed or failed.
        self._refusal: BaseException | None = None
        self._closed = False
        self._close_result: asyncio.Future[bool] | None = None
        self._stopping = False

        self.failed: asyncio.Future[BaseException] = self._loop.create_future()
        """Resolves (with the error as its result) when the committer fails; await it to notice
        a failure without committing. Never resolves on a clean run."""

        self._save_lock = asyncio.Lock()
        self._interrupted = False
        # A save a caller waits for (a count save, flush, save_batch_end) runs as a task of its
        # own; interrupt() and a close that gave up set this, and the caller stops waiting
        # then, whether or not the store (a driver retrying a held write) lets go of the save.
        self._let_go = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        if not self._every_commit:
            self._task = self._loop.create_task(self._run(), name=f"flowwarden-checkpoint[{stream_id}]")

    # -- hot path ---------------------------------------------------------------------------

    async def commit(self, sequence: int, token: ResumeToken) -> None:
        """Record that handling of event ``sequence`` (1-based, stream order) finished.

        Any completion order is fine; a commit at or below the frontier (a duplicate) is a no-op.
        The frontier advances only over contiguous sequences, so the saved token never passes an
        unfinished event. Waits for a store write only when this commit reaches the save count
        (every ``save_every_n`` events; every advancing commit when both options are 0). Raises
        CommitterClosedError after close, or the failure (for instance FencedError or
        CheckpointSaveFailedError) once the committer failed.
        """
        save = self.commit_nowait(sequence, token)
        if save is not None:
            await save

    def commit_nowait(self, sequence: int, token: ResumeToken) -> Coroutine[Any, Any, None] | None:
        """:meth:`commit` for a hot loop: records the completion at once and returns None, or,
        when this commit reaches the save count, the save the caller must await before going on
        (that await is what bounds redelivery to ``save_every_n`` events). Same errors as
        :meth:`commit`."""
        if self._refusal is not None:
            raise self._refusal.with_traceback(None)
        frontier = self._frontier
        if sequence != frontier + 1:
            if sequence > frontier:
                self._completed[sequence] = token
            return None
        completed = self._completed
        if completed:
            # Walk over completions the new one made contiguous, dropping them as we go so
            # memory stays bounded by the number of events in flight.
            following = sequence + 1
            while following in completed:
                token = completed.pop(following)
                sequence = following
                following += 1
        self._frontier = sequence
        self._frontier_token = token
        if sequence >= self._save_at:
            # Count saves finish before the commit is over, so the stored position is never
            # more than save_every_n events behind the handlers, however slow the store is: a
            # crash redelivers at most save_every_n events.
            return self._save_now()
        return None

    async def commit_through(self, sequence: int, token: ResumeToken) -> None:
        """Record that every event up to ``sequence`` finished, ``token`` being the last one's.

        For a batch, committed as one: the frontier moves to the batch's end in one step, so no
        count save ever stores a position inside the batch (a batch is re-formed from where it
        starts). Only for streams with nothing else in flight: every sequence up to ``sequence``
        must be finished. Completions committed past it already (events a filter left out
        after the batch) then join the frontier too. Waits for a save when the move reaches the
        save count, as :meth:`commit` does.
        """
        if self._refusal is not None:
            raise self._refusal.with_traceback(None)
        if sequence <= self._frontier:
            return
        completed = self._completed
        if completed:
            for done in [s for s in completed if s <= sequence]:
                del completed[done]
            following = sequence + 1
            while following in completed:
                token = completed.pop(following)
                sequence = following
                following += 1
        self._frontier = sequence
        self._frontier_token = token
        if sequence >= self._save_at:
            await self._save_now()

    async def save_batch_end(self, token: ResumeToken) -> None:
        """Store where the batch about to be handed to its method ends, before the method runs.

        Waits for the store (with the stream's epoch, one write at a time with the saves); a
        failure is counted like a failed save and raised, so the batch is not handed over
        without its end stored.
        """
        if self._refusal is not None:
            raise self._refusal.with_traceback(None)

        async def save() -> None:
            async with self._save_lock:
                if self._failure is not None:
                    raise self._failure.with_traceback(None)
                try:
                    await self._timed(self._calls.save_batch_end(self.stream_id, token, self.epoch))
                except Exception as exc:
                    self._record_failure(exc)
                    if self._failure is not None and self._failure is not exc:
                        raise self._failure.with_traceback(None) from exc
                    raise
                self._record_success()

        await self._await_save(save(), interrupted_returns=False)

    def observe_seen(self, token: ResumeToken) -> None:
        """Offer a post-batch resume token taken while no event was in flight; never blocks.

        It is written with ``save_seen`` at the next save (the heartbeat, a count save, flush or
        close). The caller guarantees nothing is in flight; an observation made while the
        committer itself holds completions past a gap is dropped, since a token past an
        unfinished event is not a safe resume point.
        """
        if self._closed or self._completed:
            return
        current = self._seen_token
        if current is None or token_data(token) > token_data(current):
            self._seen_token = token

    def set_metadata(self, key: str, value: Any) -> None:
        """Set one metadata entry; it is written with the next STORED save (values must be BSON)."""
        self._metadata[key] = value

    # -- explicit saves and shutdown ----------------------------------------------------------

    async def flush(self) -> None:
        """Save the contiguous frontier (and a newer seen token) now.

        Raises the store's error when this save fails (it is counted like any failed save), the
        committer's failure once it failed, and CommitterClosedError after close.
        """
        if self._refusal is not None:
            raise self._refusal.with_traceback(None)

        async def save() -> None:
            async with self._save_lock:
                await self._save_pending_raising()

        await self._await_save(save(), interrupted_returns=False)

    def interrupt(self) -> None:
        """Stop waiting for the store (a stream is stopping): the save a caller waits for is
        abandoned, and so are later ones. A commit waiting for a count save returns (the position
        stays unsaved; :meth:`close` tries once more); :meth:`flush` and :meth:`save_batch_end`
        raise CommitterClosedError, since their callers must not go on as if they had saved."""
        self._interrupted = True
        self._give_up_waiting()

    async def close(self, timeout: float | None = 10.0) -> bool:
        """Stop the timer, save the frontier, refuse later commits; returns within ``timeout``.

        Returns True when everything up to the frontier is stored. Returns False (and logs a
        warning) when the final save failed, the committer had failed, or the store did not
        answer within ``timeout``: the hung save is cancelled and abandoned, and the stored
        checkpoint stays at its last saved position (safe: it is behind, never ahead). Events
        past a gap are not saved. Calling close again returns the first result.
        """
        if self._close_result is not None:
            # A second close waits for the first one's outcome rather than racing it.
            return await asyncio.shield(self._close_result)
        self._close_result = self._loop.create_future()
        self._closed = True
        if self._refusal is None:
            self._refusal = CommitterClosedError(
                f"stream {self.stream_id!r}: commit after the checkpoint committer was closed",
                stream=self.stream_id,
            )
        shutdown = self._loop.create_task(
            self._shutdown(), name=f"flowwarden-checkpoint-close[{self.stream_id}]"
        )
        clean = False
        try:
            done, _ = await asyncio.wait({shutdown}, timeout=timeout)
            if shutdown in done:
                clean = shutdown.result()
            else:
                self._abandon(shutdown)
                self.log.warning(
                    "stream %r: checkpoint store did not answer within %.3gs at close; the save in "
                    "progress was abandoned. Stored position: sequence %d of frontier %d.",
                    self.stream_id,
                    timeout,
                    self._saved_sequence,
                    self._frontier,
                )
        except asyncio.CancelledError:
            self._abandon(shutdown)
            raise
        finally:
            self._close_result.set_result(clean)
        return clean

    async def __aenter__(self) -> CheckpointCommitter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- status -------------------------------------------------------------------------------

    @property
    def frontier_sequence(self) -> int:
        """The highest sequence with every lower one completed (0 before the first)."""
        return self._frontier

    @property
    def frontier_token(self) -> ResumeToken | None:
        return self._frontier_token

    @property
    def saved_sequence(self) -> int:
        """The frontier sequence of the last save the store accepted (STORED or IGNORED)."""
        return self._saved_sequence

    @property
    def last_saved_token(self) -> ResumeToken | None:
        """The processed token of the last accepted save (the initial checkpoint's before it)."""
        return self._saved_token

    @property
    def pending(self) -> int:
        """Completions held above a gap, waiting for a lower sequence to finish."""
        return len(self._completed)

    @property
    def unsaved(self) -> int:
        """Frontier advances not yet saved."""
        return self._frontier - self._saved_sequence

    @property
    def failure(self) -> BaseException | None:
        """The error that made the committer fail, if it did."""
        return self._failure

    @property
    def unconfirmed_since(self) -> float | None:
        """When (``time.monotonic()``) the oldest store write not yet followed by a successful one
        began: the write in progress, or the first of those that failed in a row. None once a
        write succeeded (and before the first). How long the store has left positions unsaved,
        whether it fails or does not answer at all."""
        return self._unconfirmed_since

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"CheckpointCommitter({self.stream_id!r}, frontier={self._frontier}, "
            f"saved={self._saved_sequence}, pending={len(self._completed)}, "
            f"failures={self.consecutive_failures})"
        )

    # -- saving -------------------------------------------------------------------------------

    async def _run(self) -> None:
        """The one long-lived save task: the heartbeat (close wakes it to end it)."""
        interval = self.save_interval_seconds or None
        while True:
            # Only close() and a failure set _wake: it ends the task. Without an interval the task
            # has nothing else to do.
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except asyncio.TimeoutError:
                pass  # the heartbeat
            if self._stopping or self._failure is not None:
                return
            if self._frontier == self._saved_sequence:
                self.log.debug(
                    "stream %r: heartbeat; no event finished since the last save (%d events processed)",
                    self.stream_id,
                    self._events_base + self._frontier,
                )
            async with self._save_lock:
                try:
                    await self._save_pending()
                except Exception:
                    pass  # counted and reported by _save_pending; retried at the next trigger

    async def _save_now(self) -> None:
        """A count save, before commit returns; raise only once the committer failed."""
        await self._await_save(self._locked_save(), interrupted_returns=True)

    async def _await_save(self, work: Coroutine[Any, Any, None], *, interrupted_returns: bool) -> None:
        """Wait for ``work``, a save, run as a task of its own so that a hung store can be given
        up on: after close() the caller gets CommitterClosedError; after interrupt() it gets the
        same, or returns when ``interrupted_returns`` (a count save: the event is handled either
        way, only its position stays unsaved)."""
        if self._interrupted:
            work.close()
            if interrupted_returns:
                return
            raise self._interruption()
        save = await unless_given_up(work, self._let_go)
        if save is not None and not save.cancelled():
            save.result()
            return
        # Given up on (cancelled, and left to end whenever the store lets go of it), or cancelled.
        if self._closed and self._refusal is not None:
            raise self._refusal.with_traceback(None) from self._refusal.__cause__
        if self._interrupted:
            if interrupted_returns:
                return
            raise self._interruption() from None
        raise asyncio.CancelledError

    def _interruption(self) -> CommitterClosedError:
        return CommitterClosedError(
            f"stream {self.stream_id!r}: the checkpoint save was abandoned because the stream is stopping",
            stream=self.stream_id,
        )

    async def _locked_save(self) -> None:
        async with self._save_lock:
            try:
                await self._save_pending()
            except Exception:
                if self._failure is None:
                    return  # counted and reported; the next commit retries
                # Its own cause kept: the save error that made the committer fail.
                raise self._failure.with_traceback(None) from self._failure.__cause__

    async def _save_pending_raising(self) -> None:
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        try:
            await self._save_pending()
        except Exception as exc:
            if self._failure is not None and self._failure is not exc:
                raise self._failure.with_traceback(None) from exc
            raise

    async def _save_pending(self) -> None:
        """Write the unsaved frontier, then a newer seen token. Call with _save_lock held.

        A failure is recorded (counted, reported, maybe fatal) and re-raised.
        """
        if self._failure is not None:
            return
        frontier = self._frontier
        token = self._frontier_token
        if frontier > self._saved_sequence and token is not None:
            checkpoint = Checkpoint(
                stream_id=self.stream_id,
                instance_id=self.instance_id,
                instance_token=self.instance_token,
                last_processed_token=token,
                events_processed=self._events_base + frontier,
                epoch=self.epoch,
                metadata=self._metadata,
            )
            try:
                result = await self._store_save(checkpoint)
            except Exception as exc:
                self._record_failure(exc)
                raise
            self._saved_sequence = frontier
            self._saved_token = token
            if self.save_every_n:
                self._save_at = frontier + self.save_every_n
            self._record_success()
            if result is SaveResult.IGNORED:
                self.log.debug(
                    "stream %r: store already holds a newer position than sequence %d",
                    self.stream_id,
                    frontier,
                )
        seen = self._seen_token
        if seen is not None and seen is not self._saved_seen:
            try:
                await self._store_save_seen(seen)
            except Exception as exc:
                self._record_failure(exc)
                raise
            self._saved_seen = seen
            self._record_success()

    async def _store_save(self, checkpoint: Checkpoint) -> SaveResult:
        return await self._timed(self._calls.save(checkpoint))

    async def _store_save_seen(self, token: ResumeToken) -> SaveResult:
        return await self._timed(self._calls.save_seen(self.stream_id, token, self.epoch))

    async def _timed(self, write: Awaitable[SaveResult]) -> SaveResult:
        """A store write; ``on_saved`` hears how long it took when it succeeds."""
        began = time.perf_counter()
        if self._unconfirmed_since is None:
            self._unconfirmed_since = time.monotonic()
        result = await write
        self._unconfirmed_since = None
        if self._on_saved is not None:
            self._on_saved(time.perf_counter() - began)
        return result

    def _record_success(self) -> None:
        self.saves += 1
        self.consecutive_failures = 0

    def _record_failure(self, error: Exception) -> None:
        self.save_failures += 1
        self.consecutive_failures += 1
        if self.save_every_n:
            # Back off to the next N advances (or the timer) instead of retrying on every commit.
            self._save_at = self._frontier + self.save_every_n
        if self._on_save_error is not None:
            try:
                self._on_save_error(error, self.consecutive_failures)
            except Exception:
                self.log.exception("stream %r: on_save_error callback raised", self.stream_id)
        fatal: BaseException | None = None
        if isinstance(error, FencedError):
            fatal = error
        elif not is_retryable_save_error(error) or self.consecutive_failures >= self.max_consecutive_failures:
            fatal = CheckpointSaveFailedError(
                self.stream_id, failures=self.consecutive_failures, last_error=error
            )
            fatal.__cause__ = error
        if fatal is None:
            self.log.warning(
                "stream %r: checkpoint save failed (%d in a row, retried at the next trigger): %s: %s",
                self.stream_id,
                self.consecutive_failures,
                type(error).__name__,
                error,
            )
            return
        self._failure = fatal
        if self._refusal is None:
            self._refusal = fatal
        if not self.failed.done():
            self.failed.set_result(fatal)
        self._wake.set()  # let the timer task see the failure and end
        self.log.error("stream %r: checkpoint committer failed: %s", self.stream_id, fatal)

    async def _shutdown(self) -> bool:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            # wait(), not await: a timer task cancelled from outside must not cancel the close.
            await asyncio.wait({self._task})
        if self._failure is not None:
            return False
        async with self._save_lock:
            try:
                await self._save_pending()
            except Exception as exc:
                self.log.warning(
                    "stream %r: final checkpoint save at close failed: %s: %s",
                    self.stream_id,
                    type(exc).__name__,
                    exc,
                )
                return False
        return self._saved_sequence == self._frontier

    def _abandon(self, shutdown: asyncio.Task[bool]) -> None:
        abandon(shutdown)
        if self._task is not None:
            self._task.cancel()
        self._give_up_waiting()

    def _give_up_waiting(self) -> None:
        self._let_go.set()


__all__ = ["CheckpointCommitter", "SaveErrorCallback", "is_retryable_save_error"]
