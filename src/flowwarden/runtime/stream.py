"""One stream's life: open it, read it, hand its events to the handlers, checkpoint, restart.

The position rules this module keeps:

- an event's token reaches the committer only after its handling finished (or it was skipped or
  dead-lettered on purpose); the committer saves the highest contiguous one, so the stored
  lastProcessedToken never passes an unfinished event;
- a post-batch resume token reaches the committer as lastSeen only while nothing is in flight
  (every event read so far has completed), so resuming after it skips nothing unhandled;
- a batch method's batch is planned before the method runs: where it ends is stored first, and
  after a crash the same events form the same batch again;
- a restart re-opens from the store's checkpoint, never from memory, so what is replayed is exactly
  the unsaved window; errors that a re-open cannot fix (flowwarden.mongo.failures) fail the stream
  instead, and the checkpoint is left as it was.

Each open/read cycle returns how it ended (:mod:`flowwarden.runtime.outcomes`), and
:meth:`StreamRunner.run` matches on that one value to decide what comes next; errors are raised
only for failures. Where a stream opens is :mod:`flowwarden.runtime.opening`'s job, who may run it
:mod:`~flowwarden.runtime.ownership`'s, concurrent handling :mod:`~flowwarden.runtime.scheduling`'s
and what happens to events given up on :mod:`~flowwarden.runtime.exhausted`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

from pymongo.errors import OperationFailure

from flowwarden._abandoning import cancel_within
from flowwarden.checkpoints import CheckpointCommitter
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config import Snapshot
from flowwarden.config.spec import StreamSpec
from flowwarden.errors import (
    ConfigurationError,
    FencedError,
    FlowWardenError,
    ResumePositionError,
)
from flowwarden.events import token_datetime
from flowwarden.mongo import codes
from flowwarden.mongo.buckets import layout_conflict
from flowwarden.mongo.failures import Failure, classify
from flowwarden.mongo.positions import reachable, refused_position
from flowwarden.runtime.connections import client_pool_size
from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.dead_letter import DeadLetterWriter
from flowwarden.runtime.dispatch import EventDispatch
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.fleet import Fleet
from flowwarden.runtime.incremental import IncrementalSnapshot
from flowwarden.runtime.metrics import StreamMetrics
from flowwarden.runtime.opening import StreamOpener, describe_token
from flowwarden.runtime.outcomes import (
    HistoryLost,
    Invalidated,
    LostOwnership,
    Outcome,
    ReadOutcome,
    Reopen,
    Restart,
    SnapshotOnly,
    Stopped,
)
from flowwarden.runtime.ownership import Ownership
from flowwarden.runtime.read_ahead import ReadAhead
from flowwarden.runtime.restarts import Restarts
from flowwarden.runtime.save_health import SaveHealth
from flowwarden.runtime.snapshot import SnapshotCopy
from flowwarden.runtime.status import StreamState, StreamStatus
from flowwarden.runtime.stopping import StopRequested, unless_stopping

_DEFAULT_READ_AHEAD_BATCH = 1000  # without a batch_size: the read-ahead bound counts this per batch
# With the deployment out of reach, a stop does not wait for server selection (30 s by default)
# in the final save or the lease release: the stored checkpoint is behind, never ahead.
_STOP_IO_TIMEOUT_SECONDS = 2.0
# An opening that takes longer is waiting for something (the deployment, or a pooled connection):
# the log and the status say so rather than leave the stream STARTING without a word.
SLOW_OPEN_SECONDS = 30.0

T = TypeVar("T")


class StreamRunner:
    """Runs one handler class's change stream until stopped, restarting it through failures."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        client: Any,
        store: AwaitableStore,
        instance_id: str,
        instance_token: str,
        locks_collection: Any,
        dead_letters: DeadLetterWriter | None,
        spark_provider: Callable[[], Any] | None = None,
        metrics: StreamMetrics | None = None,
        signals_collection: Any = None,
        fleet: Fleet | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._client = client
        self._store = store
        self._instance_id = instance_id
        self._instance_token = instance_token
        self._spark_provider = spark_provider
        # Log records carry the stream's name (the JSON log format shows it as a field of its own).
        self.log = stream_logger(__name__, spec.name)
        self.metrics = metrics
        self._stopping = asyncio.Event()
        self._ownership = Ownership(
            spec,
            locks_collection=locks_collection,
            store=store,
            instance_id=instance_id,
            instance_token=instance_token,
            stopping=self._stopping,
            fleet=fleet,
        )
        self._giving_up = GivingUp(self.name, spec.retry.on_exhausted, dead_letters, metrics)
        batch_method = spec.batch or spec.dataframe
        self._opener = StreamOpener(
            spec,
            client=client,
            store=store,
            batch_wait_seconds=batch_method.max_wait_seconds if batch_method is not None else None,
        )
        self._dispatch = EventDispatch(
            spec,
            opener=self._opener,
            giving_up=self._giving_up,
            stopping=self._stopping,
            spark_provider=spark_provider,
            metrics=metrics,
        )
        self._restarts = Restarts(self.name, spec.stream, self._stopping)
        self._reader: ReadAhead | None = None
        self._snapshot = SnapshotCopy(
            spec,
            client=client,
            store=store,
            opener=self._opener,
            dispatch=self._dispatch,
            giving_up=self._giving_up,
            stopping=self._stopping,
        )
        self._incremental = IncrementalSnapshot(
            spec,
            client=client,
            store=store,
            opener=self._opener,
            dispatch=self._dispatch,
            giving_up=self._giving_up,
            signals=signals_collection,
            stopping=self._stopping,
        )

        # Status, read from other threads through status(): plain attributes, replaced whole.
        self.state = StreamState.STARTING
        self.reason: str | None = None
        self.last_error: str | None = None
        self.error: BaseException | None = None
        self._committer: CheckpointCommitter | None = None
        self._save_health = SaveHealth(metrics)
        self._last_processed_time: datetime | None = None
        self.opened: tuple[float, int] | None = None
        self._slow_open_reason: str | None = None
        """When (``time.monotonic()``) the stream last opened, and its events count then."""

    # ------------------------------------------------------------------------------------------
    # status and control

    def request_stop(self) -> None:
        """Ask the stream to stop: no new reads; in-flight handlers finish; checkpoints flush.

        Call it on the stream's event loop; :meth:`mark_stopping` is the part any thread may do.
        """
        self._stopping.set()
        self._dispatch.halt = True
        self.mark_stopping()
        if self._reader is not None:
            self._reader.interrupt()
        if self._committer is not None:
            self._committer.interrupt()

    def mark_stopping(self) -> None:
        """Show STOPPING at once, from any thread: a handler holding the event loop must not
        leave the status saying RUNNING while a stop waits for it."""
        if self.state not in (StreamState.STOPPED, StreamState.FAILED):
            self.state = StreamState.STOPPING

    @property
    def holds_lease(self) -> bool:
        """Whether this instance holds the stream's single-leader lease right now."""
        return self._ownership.epoch is not None and not self._ownership.lost

    @property
    def events_processed(self) -> int:
        return self._dispatch.events_processed

    @property
    def events_failed(self) -> int:
        return self._giving_up.failed

    @property
    def restarts(self) -> int:
        return self._restarts.count

    def status(self) -> StreamStatus:
        # The committer's frontier is the live processed position; before one exists, the loaded one.
        committer = self._committer
        frontier = committer.frontier_token if committer is not None else None
        processed = token_datetime(frontier) if frontier is not None else self._last_processed_time
        seen = self._dispatch.last_seen_time
        newest = max((t for t in (processed, seen) if t is not None), default=None)
        lag = None
        if newest is not None and self.state == StreamState.RUNNING:
            lag = max(0.0, (datetime.now(timezone.utc) - newest).total_seconds())
        saving = self._save_health
        ownership = self._ownership
        holder = ownership.holder()
        fleet = ownership.fleet
        return StreamStatus(
            name=self.name,
            state=self.state,
            last_processed_time=processed,
            last_seen_time=seen,
            lag_seconds=lag,
            events_processed=self.events_processed,
            events_failed=self.events_failed,
            events_filtered=self._dispatch.events_filtered,
            restarts=self.restarts,
            last_error=self.last_error,
            reason=self.reason,
            events_waiting=self._dispatch.waiting() + (len(reader.items) if (reader := self._reader) else 0),
            snapshot=self._snapshot.progress,
            incremental_snapshot=self._incremental.progress,
            inferred_schema=batch.inferred_schema if (batch := self._dispatch.batch) is not None else None,
            save_failures_in_row=saving.failures,
            last_save_error=saving.error,
            cannot_save_since=saving.cannot_save_since(
                committer.unconfirmed_since if committer is not None else None
            ),
            lease_holder=holder.owner if holder is not None else None,
            lease_holder_token=holder.token if holder is not None else None,
            runs_elsewhere=(
                self.state == StreamState.STANDBY and fleet is not None and fleet.elsewhere(self.name)
            ),
        )

    # ------------------------------------------------------------------------------------------
    # the outer loop: ownership, restarts, final state

    async def run(self) -> None:
        """Run until stopped. Never raises for stream failures: they end in state FAILED.

        Transient errors (flowwarden.mongo.failures) re-open the stream with backoff for as long as
        they last; unknown ones at most ``max_restarts`` times in a row (the count starts again
        once a re-opened stream reads); fatal ones fail it at once.
        """
        ownership = self._ownership
        try:
            while not self._stopping.is_set():
                acquired = await self._until_stopped(ownership.acquire(self._standing_by), False)
                self.reason = None  # why it stood by, if it did: no longer the case either way
                if not acquired:
                    break
                keeper = asyncio.create_task(ownership.keep(lambda: self._committer, self._set_halt))
                try:
                    # The lease is kept while the outcome is acted on (a restart's backoff included).
                    go_on = await self._go_on_after(await self._cycle())
                finally:
                    await cancel_within(keeper, self._stop_io_timeout())
                if ownership.handing_over:
                    # Its checkpoint saved: the member the fleet gives the bucket to may take it.
                    await ownership.hand_over(self._stop_io_timeout())
                if not go_on:
                    break
        except Exception as error:
            self._fail(error)
        finally:
            await ownership.release(self._stop_io_timeout())
        if self.state != StreamState.FAILED:
            self.state = StreamState.STOPPED
            if self.error is None:
                self.reason = self.reason or "stopped"
                self.log.info(
                    "stream %s stopped gracefully; checkpoint saved at %s", self.name, self.saved_position()
                )

    async def _cycle(self) -> Outcome:
        """One open/read cycle (:meth:`_run_once`), every error it ends with as :class:`Restart`."""
        try:
            return await self._run_once()
        except (asyncio.CancelledError, SystemExit, KeyboardInterrupt):
            raise  # cancelled, or the process stops at once: no restart, no save
        except BaseException as error:
            if self._stopping.is_set() and classify(error) is not Failure.FATAL:
                # A stop was asked for: what a re-open would have handled does not matter.
                self.log.info("stream %s: %s: %s while stopping", self.name, type(error).__name__, error)
                return Stopped()
            return Restart(error)

    async def _go_on_after(self, outcome: Outcome) -> bool:
        """Act on how a cycle ended; whether the stream opens again. Raises what fails the stream
        (a fatal error, restarts exhausted, history lost under ``on_history_lost=FAIL``)."""
        match outcome:
            case Stopped():
                return False
            case SnapshotOnly():
                self.reason = "initial snapshot copied; snapshot=INITIAL_ONLY streams no changes"
                return False
            case Invalidated(error):
                self.reason = str(error)
                self.error = error  # not a graceful stop: Connector.stream_errors() says
                self.last_error = f"{type(error).__name__}: {error}"
                self.state = StreamState.STOPPED
                return False
            case Reopen():
                return True
            case LostOwnership():
                if self._ownership.handing_over:
                    self.log.info(
                        "stream %s: handed over at %s; standing by", self.name, self.saved_position()
                    )
                else:
                    self.log.warning("stream %s: lost ownership to another instance; standing by", self.name)
                self.state = StreamState.STANDBY
                return True
            case HistoryLost(error):
                if self.spec.stream.snapshot is Snapshot.WHEN_NEEDED:
                    # The snapshot is this stream's strategy: copy everything again from now.
                    self.log.warning(
                        "stream %s: its position fell out of the oplog (%s); snapshot=WHEN_NEEDED: "
                        "copying the existing documents again",
                        self.name,
                        error,
                    )
                    self._snapshot.anew = True
                else:
                    await self._opener.history_lost(error)
                return True
            case Restart(error):
                await self._restarts.after(error, self._restarting)
                return True

    def _save_failed(self, error: BaseException, failures: int) -> None:
        committer = self._committer  # the one saving: a run's committer is closed before the next
        self._save_health.failed(error, committer.unconfirmed_since if committer is not None else None)

    def _standing_by(self, error: str | None, reason: str | None) -> None:
        self.state = StreamState.STANDBY
        self.reason = reason
        if error is not None:
            self.last_error = error

    def _restarting(self, error: str) -> None:
        self.state = StreamState.RESTARTING
        self.last_error = error

    def _fail(self, error: BaseException) -> None:
        self.state = StreamState.FAILED
        self.error = error
        self.last_error = f"{type(error).__name__}: {error}"
        self.reason = self.last_error
        self.log.error("stream %s failed: %s", self.name, self.last_error)

    async def _until_stopped(self, work: Awaitable[T], stopped: T) -> T:
        """``work``'s result, or ``stopped`` as soon as a stop is asked for (``work`` is abandoned,
        :func:`~flowwarden.runtime.stopping.unless_stopping`).

        For waits with nothing in flight (loading the checkpoint, opening, taking a lease): with
        the deployment out of reach they would hold a stop for the driver's server selection
        timeout.
        """
        try:
            return await unless_stopping(work, self._stopping)
        except StopRequested:
            return stopped

    def _stop_io_timeout(self) -> float:
        """How long a stopping stream waits for the deployment: briefly, and hardly at all when
        the client already knows no server it could write to."""
        return _STOP_IO_TIMEOUT_SECONDS if reachable(self._client) else 0.2

    def saved_position(self) -> str:
        """The position this run saved last, for a log line."""
        committer = self._committer
        if committer is None:
            return "no position (never opened)"
        token = committer.last_saved_token
        if token is None:
            return "its opening position"
        return f"{describe_token(token)}, {committer.saved_sequence} event(s) this run"

    # ------------------------------------------------------------------------------------------
    # one open stream

    async def _run_once(self) -> Outcome:
        """Copy what an initial snapshot needs, open the stream, read it, save; how that ended.
        Raises what it failed with."""
        self._dispatch.halt = self._stopping.is_set() or self._ownership.leaving
        try:
            if self._snapshot.enabled and (copied := await self._copy_existing()) is not None:
                return copied
            opened = await self._until_stopped(self._opening(), None)
        except OperationFailure as error:
            if error.code == codes.CHANGE_STREAM_HISTORY_LOST:
                return HistoryLost(error)
            raise
        except FencedError:
            if self._ownership.fenced():
                return LostOwnership()
            raise
        if opened is None:
            return Stopped()  # a stop came while opening; nothing was read
        stream, committer, position = opened
        self.state = StreamState.STOPPING if self._stopping.is_set() else StreamState.RUNNING
        self._opener.first_run = False
        try:
            try:
                outcome = await self._consume(stream, committer, position)
            finally:
                await self._opener.close(stream, self._stop_io_timeout())
        except OperationFailure as error:
            await self._drain_and_close(committer)
            if error.code == codes.CHANGE_STREAM_HISTORY_LOST:
                return HistoryLost(error)
            if refused_position(error):
                raise ResumePositionError(
                    self.name, token=position, reason=f"the server did not find it: {error}"
                ) from error
            raise
        except FencedError:
            await self._drain_and_close(committer)
            if self._ownership.fenced():
                return LostOwnership()
            raise
        except (SystemExit, KeyboardInterrupt):
            raise  # the process stops at once (a second signal): nothing more is saved
        except BaseException:
            await self._drain_and_close(committer)
            raise
        await self._drain_and_close(committer)
        return outcome

    async def _copy_existing(self) -> Stopped | LostOwnership | SnapshotOnly | None:
        """The initial snapshot, when this run needs one (see :mod:`flowwarden.runtime.snapshot`);
        None when the stream goes on to open. Stopped when a stop interrupted the copy,
        LostOwnership when a lost lease or a handover did; SnapshotOnly once a
        ``snapshot=INITIAL_ONLY`` stream has nothing left to copy."""
        snapshot = self._snapshot
        checkpoint = await self._store.load(self.name)
        if checkpoint is not None and snapshot.progress is None:
            snapshot.progress = checkpoint.snapshot
        if snapshot.needed(checkpoint):
            if checkpoint is None:
                await self._check_layout()
            epoch = self._ownership.epoch
            if epoch is None:
                epoch = checkpoint.epoch if checkpoint is not None else 0
            self.state = StreamState.RUNNING
            if await snapshot.run(checkpoint, epoch) is None:
                # The chunk in hand stays unsaved.
                if self._ownership.leaving and not self._stopping.is_set():
                    return LostOwnership()
                return Stopped()
        if self.spec.stream.snapshot is Snapshot.INITIAL_ONLY:
            return SnapshotOnly()
        return None

    async def _check_layout(self) -> None:
        """Refuse to start a stream with no checkpoint of its own while checkpoints of it are
        stored under another number of partitions: it would start elsewhere and skip events.
        (A stream with a checkpoint of its own was checked when that checkpoint was first made.)"""
        stream = self.spec.stream
        assert stream.name is not None  # filled in by stream_spec
        stored = [checkpoint.stream_id for checkpoint in await self._store.list()]
        conflict = layout_conflict(stream.name, stream.partitions, stored)
        if conflict is not None:
            raise ConfigurationError(
                conflict,
                owner=f"stream {self.name!r}",
                option="partitions",
                value=stream.partitions,
                stream=self.name,
            )

    async def _opening(self) -> tuple[Any, CheckpointCommitter, dict[str, Any]]:
        """:meth:`_open_from_checkpoint`; once it has taken :data:`SLOW_OPEN_SECONDS`, a warning and
        the status's reason say what the stream is waiting for, until it opens."""
        notice = asyncio.get_running_loop().call_later(SLOW_OPEN_SECONDS, self._slow_open)
        try:
            return await self._open_from_checkpoint()
        finally:
            notice.cancel()
            if self.reason is not None and self.reason == self._slow_open_reason:
                self.reason = None

    def _slow_open(self) -> None:
        pool = client_pool_size(self._client)
        limit = f" (maxPoolSize {pool})" if pool else ""
        self._slow_open_reason = (
            f"not open after {SLOW_OPEN_SECONDS:g}s: waiting for the deployment to answer or for a "
            f"free connection in the client's pool{limit}"
        )
        self.reason = self._slow_open_reason
        self.log.warning("stream %s: %s", self.name, self.reason)

    async def _open_from_checkpoint(self) -> tuple[Any, CheckpointCommitter, dict[str, Any]]:
        """Load the checkpoint, open the change stream, store a new opening position.

        Returns the stream, the committer for this run and the token it opened after.
        """
        checkpoint = await self._store.load(self.name)
        if checkpoint is None:
            await self._check_layout()
        epoch = self._ownership.epoch
        committer = CheckpointCommitter(
            self._store.store,
            self.name,
            save_every_n=self.spec.checkpoint.save_every_n,
            save_interval_seconds=self.spec.checkpoint.save_interval_seconds,
            epoch=epoch if epoch is not None else (checkpoint.epoch if checkpoint else 0),
            instance_id=self._instance_id,
            instance_token=self._instance_token,
            initial=checkpoint,
            on_saved=self._save_health.saved,
            on_save_error=self._save_failed,
        )
        self._committer = committer
        opener = self._opener
        try:
            if opener.history_audit is not None:
                committer.set_metadata("historyLost", opener.history_audit)
            self._dispatch.events_processed = checkpoint.events_processed if checkpoint else 0
            self.opened = (time.monotonic(), self._dispatch.events_processed)
            if checkpoint is not None:
                self._last_processed_time = checkpoint.last_processed_at
                self._dispatch.last_seen_time = checkpoint.last_seen_at
            start, new = await opener.position(checkpoint)
            stream = await opener.open(start, codec_options=opener.read_options())
            if new:
                # Stored once the server holds the cursor (so the start point cannot leave the
                # oplog meanwhile), and before anything is handled.
                token = start["resume_after"]
                metadata = dict(checkpoint.metadata) if checkpoint else {}
                await opener.store_position(
                    committer, token, events_processed=self.events_processed, metadata=metadata
                )
                self._dispatch.last_seen_time = token_datetime(token)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            await self._drain_and_close(committer)
            raise
        return stream, committer, next(iter(start.values()))

    async def _drain_and_close(self, committer: CheckpointCommitter) -> None:
        """Let in-flight handlers finish, then save the contiguous frontier and close the committer.

        After a stop was asked for, the final save gets a short deadline: with the deployment out
        of reach it would otherwise wait for server selection, and the stored position is behind,
        never ahead, when it is abandoned.
        """
        await self._dispatch.wait_in_flight()
        timeout = self._stop_io_timeout() if self._stopping.is_set() else 10.0
        try:
            await committer.close(timeout=timeout)
        except FencedError:
            raise
        except FlowWardenError as error:
            self.log.warning("stream %s: final checkpoint save failed: %s", self.name, error)

    # ------------------------------------------------------------------------------------------
    # reading

    async def _consume(
        self, stream: Any, committer: CheckpointCommitter, position: Mapping[str, Any]
    ) -> ReadOutcome:
        self._dispatch.halt = self._stopping.is_set() or self._ownership.leaving
        # Two batches may wait for the handlers, so the reader has the next getMore in flight
        # while the handlers work through the batch before it.
        reader = ReadAhead(
            stream,
            2 * (self.spec.stream.batch_size or _DEFAULT_READ_AHEAD_BATCH),
            raw=self.spec.dataframe is not None,
            read_error=self._opener.read_error,
        )
        self._reader = reader
        incremental = self._incremental
        incremental.reset()
        watching = None
        read_ended = asyncio.Event()
        if incremental.enabled:
            # Requests are looked for while the stream reads: only the read loop can take them.
            watching = asyncio.create_task(
                incremental.watch_requests(read_ended), name=f"flowwarden-signals[{self.name}]"
            )
        try:
            return await self._dispatch.read(
                reader,
                committer,
                position,
                first_read=self._restarts.reset,
                halted=lambda: self._why_halted(committer),
            )
        finally:
            self._reader = None
            if watching is not None:
                read_ended.set()
                await cancel_within(watching, self._stop_io_timeout())
            await reader.close(self._stop_io_timeout())

    def _set_halt(self) -> None:
        """The lease is lost, or the bucket handed over: stop reading at once."""
        self._dispatch.halt = True
        if self._ownership.handing_over:
            self.reason = (
                f"handing over to {self._ownership.given_to}: handlers in flight finish and the "
                "checkpoint is saved, then the lease is released"
            )
        if self._reader is not None:
            self._reader.interrupt()

    def _why_halted(self, committer: CheckpointCommitter) -> Stopped | LostOwnership:
        """Why the read loop must end: a failed handler task or a failed committer (raised: they
        are failures), a lost lease, a stop request, or a bucket handed over to another member."""
        if self._dispatch.handler_error is not None:
            raise self._dispatch.handler_error
        if self._ownership.lost:
            return LostOwnership()
        if committer.failure is not None:
            raise committer.failure
        if self._ownership.handing_over and not self._stopping.is_set():
            return LostOwnership()
        return Stopped()
