"""One stream's life: open at the right position, read, dispatch, checkpoint, restart.

The position rules this module keeps:

- a stream with no stored position stores the one it opens at before it handles any event, so
  a first run that stops early (a failing handler, a crash) loses nothing written after the open;
- an event's token reaches the committer only after its handling finished (or it was skipped or
  dead-lettered on purpose); the committer saves the highest contiguous one, so the stored
  lastProcessedToken never passes an unfinished event;
- a post-batch resume token reaches the committer as lastSeen only while nothing is in flight
  (every event read so far has completed), so resuming after it skips nothing unhandled;
- a batch method's batch is planned before the method runs: where it ends is stored first, and
  after a crash the same events form the same batch again;
- a restart re-opens from the store's checkpoint, never from memory, so what is replayed is exactly
  the unsaved window; errors that a re-open cannot fix (flowwarden.failures) fail the stream
  instead, and the checkpoint is left as it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import datetime, timezone
from typing import Any, TypeVar

import bson
from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure, PyMongoError

from flowwarden.checkpoints import Checkpoint, CheckpointCommitter
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config import (
    Deployment,
    OnError,
    OnInvalidate,
    StartPosition,
)
from flowwarden.decorators import StreamSpec
from flowwarden.errors import (
    ConfigurationError,
    FencedError,
    FlowWardenError,
    HandlerError,
    RestartsExhaustedError,
    ResumePositionError,
    SchemaMismatchError,
    StreamError,
    StreamInvalidatedError,
)
from flowwarden.events import ChangeEvent, token_data, token_datetime
from flowwarden.failures import Failure, classify
from flowwarden.positions import (
    HISTORY_LOST,
    ahead_of_server,
    maybe_await,
    open_change_stream,
    opening_token,
    oplog_edge_async,
    reachable,
    recover_from_history_loss,
    refused_position,
    server_cluster_time,
)
from flowwarden.runtime.batching import BatchDelivery
from flowwarden.runtime.context import StreamContext
from flowwarden.runtime.dead_letter import DeadLetterWriter
from flowwarden.runtime.invoke import Exhausted, Interrupted, Invoker
from flowwarden.runtime.lease import LeaseManager
from flowwarden.runtime.read_ahead import EmptyRead, FailedRead, ReadAhead
from flowwarden.runtime.status import StreamState, StreamStatus

# Server error codes with a meaning of their own to the runner.
INVALID_RESUME_TOKEN = 260  # e.g. resumeAfter an invalidate token: use startAfter instead

_HISTORY_AUDIT_KEEP = 20
_DEFAULT_READ_AHEAD_BATCH = 1000  # without a batch_size: the read-ahead bound counts this per batch
# With the deployment out of reach, a stop does not wait for server selection (30 s by default)
# in the final save or the lease release: the stored checkpoint is behind, never ahead.
_STOP_IO_TIMEOUT_SECONDS = 2.0

T = TypeVar("T")


class _HistoryLost(Exception):
    def __init__(self, error: OperationFailure) -> None:
        super().__init__(str(error))
        self.error = error


class _Stop(Exception):
    """The stream ends on purpose (stop requested, invalidated with on_invalidate=stop)."""


class _Reopen(Exception):
    """Re-open the stream at once from its saved checkpoint (no backoff, not a failure)."""


class _LostOwnership(Exception):
    """The single-leader lease (or the checkpoint's epoch) says another instance owns the stream."""


class StreamRunner:
    """Runs one handler class's change stream until stopped, restarting it through failures."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        client: Any,
        store: AwaitableStore,
        instance_id: str,
        locks_collection: Any,
        dead_letters: DeadLetterWriter | None,
        spark_provider: Callable[[], Any] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._client = client
        self._store = store
        self._instance_id = instance_id
        self._dead_letters = dead_letters
        self._spark_provider = spark_provider
        self.log = logger or logging.getLogger(f"flowwarden.stream.{spec.name}")
        self._stopping = asyncio.Event()
        # The read loop checks this one flag per event; whoever sets it leaves the reason in
        # _stopping, _lost_lease, _task_error or the committer's failure.
        self._halt = False
        self._lost_lease = False
        self._task_error: BaseException | None = None
        self._handler = spec.handler_class()
        self._ctx = StreamContext(stream=self.name, logger=self.log)
        self._lease = (
            LeaseManager(locks_collection, self.name, instance_id, spec.stream.lease_ttl_seconds)
            if spec.stream.deployment == Deployment.SINGLE_LEADER
            else None
        )
        opts = spec.stream
        self._concurrency = opts.max_concurrency
        self._event_invokers: dict[str, Invoker] = {}
        self._fallback_invoker: Invoker | None = None
        self._batch: BatchDelivery | None = None
        self._build_dispatch()

        # Status, read from other threads through status(): plain attributes, replaced whole.
        self.state = StreamState.STARTING
        self.reason: str | None = None
        self.last_error: str | None = None
        self.error: BaseException | None = None
        self.events_processed = 0
        self.events_failed = 0
        self.restarts = 0
        self._committer: CheckpointCommitter | None = None
        self._last_processed_time: datetime | None = None
        self._last_seen_time: datetime | None = None
        self._first_run = True
        self._forced_start: dict[str, Any] | None = None
        self._opened_with: dict[str, Any] = {}
        self._history_audit: dict[str, Any] | None = None
        self._reader: ReadAhead | None = None
        self._replay_end: dict[str, Any] | None = None
        if self._batch is not None and not hasattr(store.store, "save_batch_end"):
            raise ConfigurationError(
                f"{type(store.store).__name__} has no save_batch_end(stream_id, token, epoch), which "
                "streams with @on_batch or @on_dataframe need to form the same batches after a crash; "
                "implement it (docs/checkpoints.md: the rules every store keeps)",
                owner=f"stream {spec.name!r}",
                option="store",
            )

    # ------------------------------------------------------------------------------------------
    # wiring

    def _invoker(self, method: Any) -> Invoker:
        return Invoker(
            getattr(self._handler, method.name),
            is_async=method.is_async,
            wants_ctx=method.wants_ctx,
            ctx=self._ctx,
            policy=self.spec.retry,
            stopping=self._stopping,
            # Batch methods may run for seconds (Spark jobs): keep the loop free for heartbeats.
            threaded=self._concurrency > 1 or method.kind != "event",
        )

    def _build_dispatch(self) -> None:
        spec = self.spec
        if spec.batch is not None or spec.dataframe is not None:
            self._batch = BatchDelivery(
                spec,
                invoker=self._invoker(spec.batch or spec.dataframe),
                ctx=self._ctx,
                spark_provider=self._spark_provider,
            )
            return
        for operation, method in spec.event_handlers.items():
            if operation != "*":  # the on_change method: kept as the fallback below
                self._event_invokers[operation] = self._invoker(method)
        if spec.fallback is not None:
            self._fallback_invoker = self._invoker(spec.fallback)

    # ------------------------------------------------------------------------------------------
    # status and control

    def request_stop(self) -> None:
        """Ask the stream to stop: no new reads; in-flight handlers finish; checkpoints flush.

        Call it on the stream's event loop; :meth:`mark_stopping` is the part any thread may do.
        """
        self._stopping.set()
        self._halt = True
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

    def status(self) -> StreamStatus:
        # The committer's frontier is the live processed position; before one exists, the loaded one.
        committer = self._committer
        frontier = committer.frontier_token if committer is not None else None
        processed = token_datetime(frontier) if frontier is not None else self._last_processed_time
        seen = self._last_seen_time
        newest = max((t for t in (processed, seen) if t is not None), default=None)
        lag = None
        if newest is not None and self.state == StreamState.RUNNING:
            lag = max(0.0, (datetime.now(timezone.utc) - newest).total_seconds())
        return StreamStatus(
            name=self.name,
            state=self.state,
            last_processed_time=processed,
            last_seen_time=seen,
            lag_seconds=lag,
            events_processed=self.events_processed,
            events_failed=self.events_failed,
            restarts=self.restarts,
            last_error=self.last_error,
            reason=self.reason,
        )

    # ------------------------------------------------------------------------------------------
    # the outer loop: leases, restarts, final state

    async def run(self) -> None:
        """Run until stopped. Never raises for stream failures: they end in state FAILED.

        Transient errors (flowwarden.failures) re-open the stream with backoff for as long as
        they last; unknown ones at most ``max_restarts`` times in a row (the count starts again
        once a re-opened stream reads); fatal ones fail it at once.
        """
        self._consecutive_failures = 0
        self._unknown_in_a_row = 0
        try:
            while not self._stopping.is_set():
                if self._lease is not None and not await self._until_stopped(self._wait_for_lease(), False):
                    break
                renewer = asyncio.create_task(self._renew_lease()) if self._lease else None
                watcher = (
                    asyncio.create_task(self._watch_for_other_writers()) if self._lease is None else None
                )
                try:
                    await self._run_once()
                    if self._forced_start is not None:
                        continue  # history-lost strategy chosen: re-open at once
                    break
                except _Stop:
                    break
                except _Reopen:
                    continue
                except _LostOwnership:
                    self.log.warning("stream %s: lost ownership to another instance; standing by", self.name)
                    self.state = StreamState.STANDBY
                    continue
                except _HistoryLost as lost:
                    await self._on_history_lost(lost.error)
                    continue
                except BaseException as error:
                    if isinstance(error, (asyncio.CancelledError, SystemExit, KeyboardInterrupt)):
                        raise  # cancelled, or the process stops at once: no restart, no save
                    if self._stopping.is_set() and classify(error) is not Failure.FATAL:
                        # A stop was asked for: what a re-open would have handled does not matter.
                        self.log.info(
                            "stream %s: %s: %s while stopping", self.name, type(error).__name__, error
                        )
                        break
                    await self._after_failure(error)
                finally:
                    for task in (renewer, watcher):
                        if task is not None:
                            task.cancel()
                            await asyncio.gather(task, return_exceptions=True)
        except Exception as error:
            self._fail(error)
        finally:
            await self._release_lease()
        if self.state != StreamState.FAILED:
            self.state = StreamState.STOPPED
            if self.error is None:
                self.reason = self.reason or "stopped"
                self.log.info(
                    "stream %s stopped gracefully; checkpoint saved at %s",
                    self.name,
                    self._describe_saved(),
                )

    async def _after_failure(self, error: BaseException) -> None:
        """Raise ``error`` when the stream must fail; otherwise back off before the re-open."""
        kind = classify(error)
        if kind is Failure.FATAL:
            raise error
        if kind is Failure.UNKNOWN:
            self._unknown_in_a_row += 1
            limit = self.spec.stream.max_restarts
            if limit is not None and self._unknown_in_a_row > limit:
                raise RestartsExhaustedError(
                    self.name, restarts=self._unknown_in_a_row - 1, last_error=error
                ) from error
        self._consecutive_failures += 1
        await self._backoff(error, self._consecutive_failures, kind)

    def _fail(self, error: BaseException) -> None:
        self.state = StreamState.FAILED
        self.error = error
        self.last_error = f"{type(error).__name__}: {error}"
        self.reason = self.last_error
        self.log.error("stream %s failed: %s", self.name, self.last_error)

    async def _backoff(self, error: BaseException, failures: int, kind: Failure) -> None:
        """Wait before re-opening after an error a re-open may fix."""
        opts = self.spec.stream
        self.restarts += 1
        self.state = StreamState.RESTARTING
        self.last_error = f"{type(error).__name__}: {error}"
        delay = opts.restart_delay_for(failures)
        self.log.warning(
            "stream %s: %s (%s error); re-opening from the last saved checkpoint in %.1fs (restart %d)",
            self.name,
            self.last_error,
            kind.value,
            delay,
            self.restarts,
        )
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
        except asyncio.TimeoutError:
            pass

    async def _until_stopped(self, work: Awaitable[T], stopped: T) -> T:
        """``work``'s result, or ``stopped`` as soon as a stop is asked for (``work`` is cancelled).

        For waits with nothing in flight (loading the checkpoint, opening, taking a lease): with
        the deployment out of reach they would hold a stop for the driver's server selection
        timeout.
        """
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return stopped

    async def _release_lease(self) -> None:
        if self._lease is None or self._lease.lease is None:
            return
        try:
            await asyncio.wait_for(self._lease.release(), self._stop_io_timeout())
        except (PyMongoError, asyncio.TimeoutError) as error:
            self.log.warning(
                "stream %s: could not release its lease (%s); it expires after lease_ttl_seconds",
                self.name,
                error or "timed out",
            )

    def _stop_io_timeout(self) -> float:
        """How long a stopping stream waits for the deployment: briefly, and hardly at all when
        the client already knows no server it could write to."""
        return _STOP_IO_TIMEOUT_SECONDS if reachable(self._client) else 0.2

    def _describe_saved(self) -> str:
        committer = self._committer
        if committer is None:
            return "no position (never opened)"
        token = committer.last_saved_token
        if token is None:
            return "its opening position"
        return f"{_describe(token)}, {committer.saved_sequence} event(s) this run"

    async def _wait_for_lease(self) -> bool:
        """Stand by until this instance holds the stream's lease; False if stopped meanwhile."""
        assert self._lease is not None
        while not self._stopping.is_set():
            try:
                if await self._lease.try_acquire() is not None:
                    self._lost_lease = False
                    self.log.info(
                        "stream %s: lease acquired (epoch %d)",
                        self.name,
                        self._lease.lease.epoch,  # type: ignore[union-attr]
                    )
                    return True
            except PyMongoError as error:
                self.last_error = f"lease: {type(error).__name__}: {error}"
            self.state = StreamState.STANDBY
            try:
                await asyncio.wait_for(self._stopping.wait(), self._lease.renew_interval)
            except asyncio.TimeoutError:
                pass
        return False

    async def _renew_lease(self) -> None:
        """Keep the lease; when it cannot be kept, make the reader stop."""
        assert self._lease is not None
        while True:
            await asyncio.sleep(self._lease.renew_interval)
            try:
                renewed = await self._lease.renew()
            except PyMongoError as error:
                self.log.warning("stream %s: lease renewal failed: %s", self.name, error)
                renewed = self._lease.held()
            if not renewed or not self._lease.held():
                self._lost_lease = True
                self._halt = True
                return

    async def _watch_for_other_writers(self) -> None:
        """Warn when another instance writes this stream's checkpoint (deployments without a lease).

        Every processed save writes this instance's id into the record; once this run has saved,
        any other id found there was written since by someone else, who handles the same events
        and overwrites this instance's positions.
        """
        interval = max(self.spec.checkpoint.save_interval_seconds or 5.0, 1.0)
        warned: set[str] = set()
        while True:
            await asyncio.sleep(interval)
            committer = self._committer
            if committer is None or committer.saved_sequence == 0:
                continue
            try:
                stored = await self._store.load(self.name)
            except Exception:  # the committer reports a store in trouble
                continue
            other = stored.instance_id if stored is not None else None
            if other is None or other == self._instance_id or other in warned:
                continue
            warned.add(other)
            self.log.warning(
                "stream %s: instance %r also writes this stream's checkpoint (this instance is %r): both "
                "handle every event and overwrite each other's positions. Run one instance per stream, "
                "or set @change_stream(deployment='single_leader') so that one instance at a time holds it",
                self.name,
                other,
                self._instance_id,
            )

    # ------------------------------------------------------------------------------------------
    # one open stream

    async def _run_once(self) -> None:
        self._halt = self._stopping.is_set() or self._lost_lease
        try:
            opened = await self._until_stopped(self._open_from_checkpoint(), None)
        except OperationFailure as error:
            if error.code == HISTORY_LOST:
                raise _HistoryLost(error) from error
            raise
        except FencedError as error:
            if self._lease is not None:
                self._lease.lease = None
                raise _LostOwnership() from error
            raise
        if opened is None:
            return  # a stop came while opening; nothing was read
        stream, committer, position = opened
        self.state = StreamState.STOPPING if self._stopping.is_set() else StreamState.RUNNING
        self._first_run = False
        try:
            try:
                await self._consume(stream, committer, position)
            finally:
                await _close_stream(stream, self._stop_io_timeout())
        except OperationFailure as error:
            await self._drain_and_close(committer)
            if error.code == HISTORY_LOST:
                raise _HistoryLost(error) from error
            if refused_position(error):
                raise ResumePositionError(
                    self.name, token=position, reason=f"the server did not find it: {error}"
                ) from error
            raise
        except FencedError as error:
            await self._drain_and_close(committer)
            if self._lease is not None:
                self._lease.lease = None
                raise _LostOwnership() from error
            raise
        except (SystemExit, KeyboardInterrupt):
            raise  # the process stops at once (a second signal): nothing more is saved
        except BaseException:
            await self._drain_and_close(committer)
            raise
        else:
            await self._drain_and_close(committer)

    async def _open_from_checkpoint(self) -> tuple[Any, CheckpointCommitter, dict[str, Any]]:
        """Load the checkpoint, make sure the opening position is stored, open the change stream.

        Returns the stream, the committer for this run and the token it opened after.
        """
        checkpoint = await self._store.load(self.name)
        epoch = (
            self._lease.lease.epoch
            if self._lease and self._lease.lease
            else (checkpoint.epoch if checkpoint else 0)
        )
        committer = CheckpointCommitter(
            self._store.store,
            self.name,
            save_every_n=self.spec.checkpoint.save_every_n,
            save_interval_seconds=self.spec.checkpoint.save_interval_seconds,
            epoch=epoch,
            instance_id=self._instance_id,
            initial=checkpoint,
        )
        self._committer = committer
        try:
            self._loaded_metadata = dict(checkpoint.metadata) if checkpoint else {}
            if self._history_audit is not None:
                committer.set_metadata("historyLost", self._history_audit)
            self.events_processed = checkpoint.events_processed if checkpoint else 0
            if checkpoint is not None:
                self._last_processed_time = checkpoint.last_processed_at
                self._last_seen_time = checkpoint.last_seen_at
            start, new = await self._opening_position(checkpoint)
            self._opened_with = start
            stream = await self._open(start, codec_options=self._read_options())
            if new:
                # Stored once the server holds the cursor (so the start point cannot leave the
                # oplog meanwhile), and before anything is handled.
                await self._store_opening_position(committer, start["resume_after"])
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
        await self._wait_in_flight()
        timeout = self._stop_io_timeout() if self._stopping.is_set() else 10.0
        try:
            await committer.close(timeout=timeout)
        except FencedError:
            raise
        except FlowWardenError as error:
            self.log.warning("stream %s: final checkpoint save failed: %s", self.name, error)

    # ------------------------------------------------------------------------------------------
    # start position

    async def _opening_position(self, checkpoint: Checkpoint | None) -> tuple[dict[str, Any], bool]:
        """The watch option that opens this run (``resume_after`` or ``start_after`` a token), and
        whether that position is new and must be stored before the first event is handled.

        A stored position is checked against the server first. Without one (or after lost
        history), the position the start options name is asked of the server.
        """
        self._replay_end = None
        forced, self._forced_start = self._forced_start, None
        if forced is not None:
            if "start_after" in forced:
                return forced, False  # just after an invalidate event, which the committer holds
            return {"resume_after": await self._opening_token(forced)}, True
        options = self.spec.checkpoint
        position = options.start_position
        ignore_checkpoint = position == StartPosition.LATEST and self._first_run
        stored = None if checkpoint is None or ignore_checkpoint else checkpoint.resume_token
        if stored is not None:
            await self._check_stored_position(stored)
            assert checkpoint is not None
            self._replay_end = checkpoint.pending_batch_end
            return {"resume_after": stored}, False
        start: dict[str, Any] = {}
        if position == StartPosition.EARLIEST:
            oldest = await oplog_edge_async(self._client, 1)
            if oldest is None:
                raise StreamError(
                    f"stream {self.name!r}: start_position=EARLIEST needs to read local.oplog.rs, "
                    "which this user cannot; grant read on 'local' or choose another start_position",
                    stream=self.name,
                )
            start = {"start_at_operation_time": oldest}
        elif position == StartPosition.AT_TIME:
            start = {"start_at_operation_time": options.start_at_operation_time}
        return {"resume_after": await self._opening_token(start)}, True

    async def _store_opening_position(self, committer: CheckpointCommitter, token: dict[str, Any]) -> None:
        """Make a new opening position durable: as lastSeen, or after lost history as
        lastProcessed together with the audit entry."""
        if self._history_audit is not None:
            await self._persist_history_audit(committer, token)
            return
        committer.observe_seen(token)
        await committer.flush()
        self._last_seen_time = token_datetime(token)
        self.log.info(
            "stream %s: no stored position; opened at %s (start_position %s), stored before the first event",
            self.name,
            _describe(token),
            self.spec.checkpoint.start_position.value,
        )

    async def _opening_token(self, start: Mapping[str, Any]) -> dict[str, Any]:
        return await opening_token(self._watch_target(), start, **self._watch_options())

    async def _check_stored_position(self, token: Mapping[str, Any]) -> None:
        """Refuse a stored position the server cannot resume from as it stands (see positions)."""
        server_time = await server_cluster_time(self._client)
        try:
            reason = ahead_of_server(token, server_time)
        except FlowWardenError as error:  # a custom store returned a token of the wrong form
            reason = str(error)
        if reason is not None:
            raise ResumePositionError(self.name, token=dict(token), reason=reason)

    def _watch_target(self, codec_options: CodecOptions[Any] | None = None) -> Any:
        opts = self.spec.stream
        if opts.database is None:
            target = self._client
        elif opts.collection is None:
            target = self._client[opts.database]
        else:
            target = self._client[opts.database][opts.collection]
        if codec_options is not None:
            target = (
                target.with_options(codec_options=codec_options) if target is not self._client else target
            )
        return target

    def _read_options(self) -> CodecOptions[Any] | None:
        """How the stream's events are decoded: as the client says (None), except for DataFrame
        streams, which keep each event's BSON as the server sent it (``RawBSONDocument``).

        The Arrow conversion reads those bytes directly (flowwarden.spark's compiled converter)
        and maps BSON types to columns by its own documented rules, so decoding them into dicts
        first would only cost time, and type-registry decoders would only hand it Python types
        it has no column for. Not when the client tolerates invalid UTF-8 (a lenient
        ``unicode_decode_error_handler``): that choice is the user's, and the decoded path honours
        it. Nor for cluster-level streams, whose codec cannot be set per stream.
        """
        if self.spec.dataframe is None:
            return None
        target = self._watch_target()
        options: CodecOptions[Any] | None = getattr(target, "codec_options", None)
        if target is self._client or options is None or options.unicode_decode_error_handler != "strict":
            return None
        return CodecOptions(document_class=RawBSONDocument)

    def _watch_options(self) -> dict[str, Any]:
        options: dict[str, Any] = self.spec.stream.watch_options()
        options["pipeline"] = list(self.spec.pipeline)
        options["max_await_time_ms"] = self._await_ms()
        options["comment"] = f"flowwarden:{self.name}"
        return options

    async def _open(self, start: Mapping[str, Any], codec_options: CodecOptions[Any] | None = None) -> Any:
        kwargs: dict[str, Any] = {**self._watch_options(), **start}
        target = self._watch_target(codec_options)
        try:
            try:
                return await open_change_stream(target, **kwargs)
            except OperationFailure as error:
                if error.code == INVALID_RESUME_TOKEN and "resume_after" in kwargs:
                    # The token is an invalidate notification's: only startAfter may start after it.
                    kwargs["start_after"] = kwargs.pop("resume_after")
                    return await open_change_stream(target, **kwargs)
                raise
        except OperationFailure as error:
            token = kwargs.get("resume_after", kwargs.get("start_after"))
            if token is not None and refused_position(error):
                raise ResumePositionError(
                    self.name, token=dict(token), reason=f"the server refused it: {error}"
                ) from error
            raise

    def _await_ms(self) -> int:
        """getMore's maxAwaitTimeMS: short enough for batch deadlines and a prompt stop."""
        wait = self.spec.stream.max_await_time_ms
        if self._batch is not None:
            wait = min(wait, max(10, int(self._batch.max_wait_seconds * 1000)))
        return wait

    # ------------------------------------------------------------------------------------------
    # history lost

    async def _on_history_lost(self, error: OperationFailure) -> None:
        """Apply on_history_lost (flowwarden.positions.recover_from_history_loss): fail, or plan
        the new opening position and the audit entry stored with it."""
        strategy = self.spec.checkpoint.on_history_lost
        checkpoint = await self._store.load(self.name)
        lost_from = None
        if checkpoint is not None:
            lost_from = checkpoint.last_processed_at or checkpoint.last_seen_at
        recovery = recover_from_history_loss(
            strategy,
            stream=self.name,
            lost_from=lost_from,
            oldest=await oplog_edge_async(self._client, 1),
            newest=await oplog_edge_async(self._client, -1),
            error=error,
        )
        if recovery.fell_back:
            self.log.warning(
                "stream %s: the oplog cannot be read; RESUME_FROM_OPLOG_START falls back to now", self.name
            )
        self._forced_start = recovery.start
        self._history_audit = {
            "at": datetime.now(timezone.utc),
            "strategy": str(strategy),
            "lostFrom": lost_from,
            "lostTo": recovery.lost_to,
            "serverMessage": str(error),
        }
        self.log.warning(
            "stream %s: history lost; events between %s and %s were not delivered (strategy %s)",
            self.name,
            lost_from.isoformat() if lost_from else "the beginning",
            recovery.lost_to.isoformat(),
            strategy,
        )

    async def _persist_history_audit(self, committer: CheckpointCommitter, token: Mapping[str, Any]) -> None:
        """Write the history-lost audit entry at the new opening position.

        Metadata travels only with a stored processed position, so the opening token (nothing
        before it is unfinished: the gap was given up on purpose) is saved as the processed
        position together with the audit, before anything is read.
        """
        if self._history_audit is None:
            return
        saved = await self._store.save(
            Checkpoint(
                stream_id=self.name,
                instance_id=self._instance_id,
                last_processed_token=dict(token),
                last_processed_at=token_datetime(token),
                events_processed=self.events_processed,
                epoch=committer.epoch,
                metadata={**self._loaded_metadata, "historyLost": self._history_audit},
            )
        )
        self.log.info("stream %s: history-lost audit entry saved (%s)", self.name, saved)
        self._history_audit = None

    # ------------------------------------------------------------------------------------------
    # reading and dispatching

    async def _consume(
        self, stream: Any, committer: CheckpointCommitter, position: Mapping[str, Any]
    ) -> None:
        self._sequence = 0
        self._in_flight: set[asyncio.Task[None]] = set()
        self._key_tails: dict[bytes, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(self._concurrency) if self._concurrency > 1 else None
        self._task_error = None
        self._halt = self._stopping.is_set() or self._lost_lease
        if self._batch is not None:
            self._batch.take()  # left by an earlier run: those events come again from the checkpoint
            self._batch.replay_until(self._replay_end)
        committer.failed.add_done_callback(lambda _: self._set_halt())
        reader = ReadAhead(stream, self._read_ahead_limit())
        self._reader = reader
        try:
            await self._read_loop(reader, committer, position)
        finally:
            self._reader = None
            await reader.close()

    def _read_ahead_limit(self) -> int:
        """How many read events may wait for the handlers: two batches, so the reader has the
        next getMore in flight while the handlers work through the batch before it."""
        return 2 * (self.spec.stream.batch_size or _DEFAULT_READ_AHEAD_BATCH)

    async def _read_loop(
        self,
        reader: ReadAhead,
        committer: CheckpointCommitter,
        position: Mapping[str, Any],
    ) -> None:
        batch = self._batch
        invokers = self._event_invokers
        fallback = self._fallback_invoker
        ctx = self._ctx
        items = reader.items
        read_once = False
        while True:
            if self._halt:
                # One flag for the hot path; the reason is sorted out here.
                self._raise_for_halt(committer)
                return
            change = items.popleft() if items else await reader.wait()
            kind = change.__class__
            if kind is FailedRead:
                error = change.error
                if isinstance(error, InvalidBSON):
                    await self._poison(committer, position, error)
                    raise _Reopen() from error  # from the checkpoint, now past the poison event
                raise error
            if not read_once:
                # The re-opened stream reads: errors that ended earlier opens were not for good.
                read_once = True
                self._unknown_in_a_row = 0
                self._consecutive_failures = 0
            if kind is EmptyRead:
                token = change.token
                if batch is not None and not self._halt and batch.due(token):
                    await self._deliver_batch(committer)
                if not change.alive:
                    # The server closed the stream after an invalidate event.
                    return
                if token is not None and self._idle():
                    position = token
                    committer.observe_seen(token)
                    self._last_seen_time = token_datetime(token)
                continue
            position = token = change["_id"]
            operation = change.get("operationType")
            if batch is None and self._slots is None:
                # The common case inline: one event at a time, a sync handler on the loop.
                self._sequence += 1
                invoker = invokers.get(operation, fallback)
                first_error = None
                if invoker is None or (
                    invoker.inline and (first_error := invoker.call_inline(ChangeEvent(change))) is None
                ):
                    save = committer.commit_nowait(self._sequence, token)
                    if save is not None:
                        await save
                    self.events_processed += 1
                    if ctx._save_requested:
                        ctx._save_requested = False
                        await committer.flush()
                else:
                    await self._handle_event(self._sequence, change, committer, first_error)
            else:
                await self._dispatch(change, committer)
            if operation == "invalidate":
                await self._on_invalidate(change, committer)
                return

    async def _dispatch(self, change: MutableMapping[str, Any], committer: CheckpointCommitter) -> None:
        """Give the next event its sequence number and hand it to the stream's delivery mode."""
        self._sequence += 1
        batch = self._batch
        if batch is not None:
            if batch.replaying and batch.past_replay_end(change):
                # The stored batch's last event did not come back (the pipeline changed since):
                # the batch formed again ends before this event.
                self.log.warning(
                    "stream %s: the batch stored as ending at %s was formed again without its last "
                    "event, which the stream no longer returns",
                    self.name,
                    _describe(self._replay_end),
                )
                if not batch.empty():
                    await self._deliver_batch(committer)
                batch.stop_replay()
            batch.add(self._sequence, change)
            if batch.due():
                await self._deliver_batch(committer)
        elif self._slots is not None:
            await self._spawn(self._sequence, change, committer)
        else:
            await self._handle_event(self._sequence, change, committer)

    def _set_halt(self) -> None:
        self._halt = True

    def _raise_for_halt(self, committer: CheckpointCommitter) -> None:
        """Why the read loop must end: a failed handler task, a lost lease, a failed committer, or
        a stop request (the only one that ends it without an error)."""
        if self._task_error is not None:
            raise self._task_error
        if self._lost_lease:
            raise _LostOwnership()
        if committer.failure is not None:
            raise committer.failure

    def _idle(self) -> bool:
        """Nothing read so far is unfinished, so a post-batch token is a safe resume point.

        Once the loop is halting (a failed or interrupted event, a stop, a lost lease) some event
        may be unfinished without being in flight or in the batch: never idle then.
        """
        if self._halt or self._in_flight:
            return False
        return self._batch is None or self._batch.empty()

    async def _on_invalidate(self, change: Mapping[str, Any], committer: CheckpointCommitter) -> None:
        await self._wait_in_flight()
        # A handler of an event before the invalidate may have failed meanwhile: that wins.
        self._raise_for_halt(committer)
        if self.spec.stream.on_invalidate == OnInvalidate.RESTART:
            self.log.warning("stream %s: invalidated; restarting after the invalidate event", self.name)
            self._forced_start = {"start_after": change["_id"]}
            return
        error = StreamInvalidatedError(self.name, operation="drop or rename", token=change.get("_id"))
        self.reason = str(error)
        self.error = error  # not a graceful stop: Connector.stream_errors() reports it
        self.last_error = f"{type(error).__name__}: {error}"
        self.state = StreamState.STOPPED
        self.log.warning("%s", error)
        raise _Stop()

    async def _wait_in_flight(self) -> None:
        in_flight = getattr(self, "_in_flight", None)
        if in_flight:
            await asyncio.gather(*list(in_flight), return_exceptions=True)

    # per-event dispatch ------------------------------------------------------------------------

    async def _handle_event(
        self,
        sequence: int,
        change: MutableMapping[str, Any],
        committer: CheckpointCommitter,
        first_error: BaseException | None = None,
    ) -> None:
        """Handle one event under the retry policy, then commit it (unless the stream stops).

        ``first_error``: the first attempt already ran inline and failed with it.
        """
        invoker = self._event_invokers.get(change.get("operationType", ""), self._fallback_invoker)
        token = change["_id"]
        if invoker is not None:
            try:
                if first_error is None:
                    await invoker(ChangeEvent(change))
                else:
                    await invoker.retry(ChangeEvent(change), first_error)
            except Exhausted as exhausted:
                await self._give_up([change], exhausted.error, exhausted.attempts)
            except Interrupted:
                return  # stopping: this event stays unfinished, the checkpoint stays before it
        await committer.commit(sequence, token)
        self.events_processed += 1
        if self._ctx._take_save_request():
            await committer.flush()

    async def _spawn(
        self, sequence: int, change: MutableMapping[str, Any], committer: CheckpointCommitter
    ) -> None:
        """Start handling an event concurrently, keeping per-documentKey order."""
        assert self._slots is not None
        await self._slots.acquire()
        key_doc = change.get("documentKey")
        key = bson.encode(key_doc) if isinstance(key_doc, Mapping) else None
        before: asyncio.Task[None] | None
        if key is None:
            # Not a document event (drop, rename...): a barrier after everything before it.
            before = None
            await self._wait_in_flight()
        else:
            before = self._key_tails.get(key)
        task = asyncio.create_task(self._run_after(before, sequence, change, committer))
        self._in_flight.add(task)
        if key is not None:
            self._key_tails[key] = task
        task.add_done_callback(lambda t: self._task_done(t, key))

    async def _run_after(
        self,
        before: asyncio.Task[None] | None,
        sequence: int,
        change: MutableMapping[str, Any],
        committer: CheckpointCommitter,
    ) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
            if before.cancelled() or before.exception() is not None:
                return  # the same document's earlier event failed: stay behind it, in order
        await self._handle_event(sequence, change, committer)

    def _task_done(self, task: asyncio.Task[None], key: bytes | None) -> None:
        self._in_flight.discard(task)
        if key is not None and self._key_tails.get(key) is task:
            del self._key_tails[key]
        assert self._slots is not None
        self._slots.release()
        if not task.cancelled() and task.exception() is not None and self._task_error is None:
            # The read loop raises it at its next turn.
            self._task_error = task.exception()
            self._halt = True

    # batch dispatch ----------------------------------------------------------------------------

    async def _deliver_batch(self, committer: CheckpointCommitter) -> None:
        """Plan the pending batch durably, hand it to the method, then commit it as one.

        Before the method runs, the position before the batch (the previous batch's end) is
        saved and the batch's last token stored as its end: after a crash the batch is formed
        again from exactly the same events, so ``ctx.batch_id`` names the same events and
        writes keyed by it replace what the interrupted run wrote.
        """
        assert self._batch is not None
        items = self._batch.take()
        if not items:
            return
        last_sequence, last = items[-1][0], items[-1][1]["_id"]
        await committer.flush()
        await committer.save_batch_end(last)
        try:
            dropped = await self._batch.deliver(items, self._give_up_undecodable_in_batch)
            if dropped:
                await self._park_malformed(dropped)
        except Exhausted as exhausted:
            await self._give_up([change for _, change in items], exhausted.error, exhausted.attempts)
        except Interrupted:
            return
        await committer.commit_through(last_sequence, last)
        self.events_processed += len(items)
        if self._ctx._take_save_request():
            await committer.flush()

    async def _park_malformed(self, dropped: list[tuple[MutableMapping[str, Any], Any]]) -> None:
        """Dead-letter the events DROPMALFORMED left out of a DataFrame; they count as failed."""
        assert self._dead_letters is not None
        self.events_failed += len(dropped)
        for change, row in dropped:
            error = SchemaMismatchError(field=row.field, token=row.token, index=row.index, reason=row.error)
            try:
                await self._dead_letters.write(
                    stream=self.name, event=change, token=change.get("_id"), error=error, attempts=1
                )
            except PyMongoError as dlq_error:
                raise HandlerError(
                    self.name, token=_plain_token(change.get("_id")), attempts=1, cause=error
                ) from dlq_error
        self.log.warning(
            "stream %s: %d event(s) did not fit the DataFrame schema and were dead-lettered",
            self.name,
            len(dropped),
        )

    # giving up ---------------------------------------------------------------------------------

    async def _give_up(self, changes: list[Mapping[str, Any]], error: BaseException, attempts: int) -> None:
        """Apply on_exhausted to events whose handling failed for good.

        Returns when the events may count as finished (skipped or dead-lettered); raises when the
        stream must stop with the checkpoint still before them.
        """
        policy = self.spec.retry.on_exhausted
        token = _plain_token(changes[0].get("_id")) if changes else None
        if policy == OnError.STOP:
            self.events_failed += len(changes)
            raise HandlerError(self.name, token=token, attempts=attempts, cause=error) from error
        self.events_failed += len(changes)
        if policy == OnError.SKIP:
            self.log.warning(
                "stream %s: skipping %d event(s) from %r after %d attempt(s): %s: %s",
                self.name,
                len(changes),
                token,
                attempts,
                type(error).__name__,
                error,
            )
            return
        assert self._dead_letters is not None
        try:
            for change in changes:
                await self._dead_letters.write(
                    stream=self.name, event=change, token=change.get("_id"), error=error, attempts=attempts
                )
        except PyMongoError as dlq_error:
            raise HandlerError(self.name, token=token, attempts=attempts, cause=error) from dlq_error
        self.log.warning(
            "stream %s: %d event(s) from %r dead-lettered after %d attempt(s): %s",
            self.name,
            len(changes),
            token,
            attempts,
            error,
        )

    async def _poison(
        self, committer: CheckpointCommitter, position: Mapping[str, Any] | None, error: InvalidBSON
    ) -> None:
        """The driver could not decode a batch: find the event that cannot be decoded, give up on it.

        PyMongo decodes a whole batch at once, so the batch is read again as raw BSON and each
        event decoded on its own with the stream's codec options. Events that decode are handled
        as usual; the first that does not gets the retry policy's on_exhausted at once (decoding
        again cannot help): STOP leaves the checkpoint before it, SKIP and DEAD_LETTER move past
        it. The outer loop then re-opens from the saved checkpoint.
        """
        target = self._watch_target()
        strict: CodecOptions[Any] = getattr(target, "codec_options", None) or CodecOptions()
        if target is self._client:
            raise error  # a cluster stream's codec cannot be changed per stream: fail visibly
        raw_options: CodecOptions[Any] = CodecOptions(
            document_class=RawBSONDocument,
            tz_aware=strict.tz_aware,
            tzinfo=strict.tzinfo,
            unicode_decode_error_handler="surrogateescape",
        )
        start = {"resume_after": position} if position is not None else dict(self._opened_with)
        stream = await self._open(start, codec_options=raw_options)
        try:
            while not self._halt:
                raw = await stream.try_next()
                if raw is None:
                    continue
                try:
                    change = bson.decode(raw.raw, codec_options=strict)
                except Exception as decode_error:  # whatever the codec raised: this event is poison
                    await self._give_up_undecodable(committer, raw.raw, decode_error)
                    return
                await self._dispatch(change, committer)
                if change.get("operationType") == "invalidate":
                    await self._on_invalidate(change, committer)
                    return
        finally:
            await _close_stream(stream)

    async def _give_up_undecodable(
        self, committer: CheckpointCommitter, data: bytes, error: BaseException
    ) -> None:
        await self._wait_in_flight()
        if self._batch is not None and not self._batch.empty():
            await self._deliver_batch(committer)
        readable = _readable(data)
        self._sequence += 1
        self.log.error("stream %s: an event cannot be decoded: %s", self.name, error)
        await self._give_up([readable], error, attempts=1)
        await committer.commit(self._sequence, readable["_id"])
        await committer.flush()

    async def _give_up_undecodable_in_batch(self, change: Mapping[str, Any], error: BaseException) -> None:
        """An event of a raw DataFrame batch cannot be decoded: on_exhausted at once, for it alone
        (decoding again cannot help), before the method sees the rest of the batch."""
        self.log.error("stream %s: an event of a DataFrame batch cannot be decoded: %s", self.name, error)
        data = bytes(change.raw) if isinstance(change, RawBSONDocument) else bson.encode(change)
        await self._give_up([_readable(data)], error, attempts=1)


def _plain_token(token: Any) -> Any:
    """A token for messages and errors: a raw event's ``_id`` as a plain dict."""
    return dict(token) if isinstance(token, RawBSONDocument) else token


def _readable(data: bytes) -> dict[str, Any]:
    """What can be read of an event that cannot be decoded, for the dead-letter queue: the
    document with undecodable text escaped, or else its ``_id`` and its bytes as they came."""
    try:
        readable: dict[str, Any] = bson.decode(
            data, codec_options=CodecOptions(tz_aware=True, unicode_decode_error_handler="backslashreplace")
        )
        return readable
    except Exception:  # damaged beyond text: keep the bytes, they are all there is
        token = RawBSONDocument(data)["_id"]
        return {"_id": dict(token), "undecodableBson": bson.Binary(data)}


def _describe(token: Mapping[str, Any] | None) -> str:
    """A token for a log line: its cluster time and the start of its ``_data``."""
    if token is None:
        return "none"
    try:
        at = token_datetime(token)
        data = token_data(token)
    except FlowWardenError:
        return repr(dict(token))
    return f"{at.isoformat() if at else '?'} ({data[:26]}...)"


async def _close_stream(stream: Any, timeout: float = _STOP_IO_TIMEOUT_SECONDS) -> None:
    """Close a change stream; with the deployment out of reach, give up after ``timeout`` (the
    server drops an abandoned cursor after its idle timeout)."""
    try:
        await asyncio.wait_for(maybe_await(stream.close()), timeout)
    except (PyMongoError, asyncio.TimeoutError):
        pass
