"""Handing one open stream's events to the handler methods, and their positions to the committer.

A class handles events one at a time (a sync handler runs inline on the event loop, the common
case and the hot path), concurrently per document key (``max_concurrency > 1``), or in batches
(``@on_batch``, ``@on_dataframe``). Whatever the mode, an event's token reaches the committer only
once its handling finished, was skipped or was dead-lettered; a post-batch token reaches it (as
lastSeen) only while nothing read is unfinished. The read loop checks one flag per event,
:attr:`EventDispatch.halt`; whoever sets it leaves the reason elsewhere (a stop, a lost lease, a
failed committer, a failed handler task), and the runner's ``halted()`` sorts it out. Reading
ends with an outcome (:mod:`flowwarden.runtime.outcomes`): stopped, invalidated, re-open, or
lost ownership; a failure is raised. While an incremental snapshot copies, :attr:`EventDispatch.copying`
is set and the read loop asks it, item by item, whether a chunk is due before the item
(:mod:`flowwarden.runtime.incremental`); otherwise that costs one attribute check per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, MutableMapping
from datetime import datetime
from typing import Any, Protocol

import bson
from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from flowwarden.checkpoints import CheckpointCommitter
from flowwarden.config import OnInvalidate
from flowwarden.config.spec import StreamSpec
from flowwarden.errors import StreamInvalidatedError
from flowwarden.events import ChangeEvent, token_datetime
from flowwarden.mongo.sensitive_fields import salted_hasher
from flowwarden.runtime.batching import BatchDelivery
from flowwarden.runtime.context import StreamContext, stream_logger
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.invoke import Exhausted, Interrupted, Invoker
from flowwarden.runtime.metrics import StreamMetrics
from flowwarden.runtime.opening import StreamOpener
from flowwarden.runtime.outcomes import Invalidated, LostOwnership, ReadOutcome, Reopen, Stopped
from flowwarden.runtime.read_ahead import EmptyRead, FailedRead, ReadAhead
from flowwarden.runtime.scheduling import KeyedScheduler


class Interleaved(Protocol):
    """Work the read loop interleaves with the stream's events, in stream order (an incremental
    snapshot's chunks)."""

    def due(self, change: Any, empty: bool) -> bool:
        """Whether :meth:`step` must run before ``change`` (an event, or an empty read when
        ``empty``) is handed over."""
        ...

    async def step(
        self, change: Any, empty: bool, position: Mapping[str, Any] | None, committer: CheckpointCommitter
    ) -> None:
        """The work due before ``change``; ``position`` is the stream's position before it."""
        ...


class EventDispatch:
    """One stream's handler methods and how its events reach them."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        opener: StreamOpener,
        giving_up: GivingUp,
        stopping: asyncio.Event,
        spark_provider: Callable[[], Any] | None,
        metrics: StreamMetrics | None = None,
    ) -> None:
        self.spec = spec
        self.metrics = metrics
        self.name = spec.name
        self.log = stream_logger(__name__, spec.name)
        self._opener = opener
        self._giving_up = giving_up
        self._stopping = stopping
        self._concurrency = spec.stream.max_concurrency
        self._handler = spec.handler_class()
        self._invokers: dict[str, Invoker] = {}
        self._fallback: Invoker | None = None
        self.batch: BatchDelivery | None = None
        if spec.batch is not None or spec.dataframe is not None:
            self.batch = BatchDelivery(
                spec,
                invoker=self._invoker(spec.batch or spec.dataframe),
                spark_provider=spark_provider,
                giving_up=giving_up,
                delivered=self._count_delivered,
                failed=self._set_halt,
                metrics=metrics,
                collection=opener.watch_target,
            )
        else:
            for operation, method in spec.event_handlers.items():
                if operation != "*":  # the on_change method: kept as the fallback below
                    self._invokers[operation] = self._invoker(method)
            if spec.fallback is not None:
                self._fallback = self._invoker(spec.fallback)
            if "snapshot" not in self._invokers and "insert" in self._invokers:
                self._invokers["snapshot"] = self._invokers["insert"]  # see StreamSpec.handler_for
        self._keep: Callable[[ChangeEvent], Any] | None = None
        self._filter: Invoker | None = None
        if spec.event_filter is not None:
            self._keep = getattr(self._handler, spec.event_filter)
            self._filter = Invoker(
                self._keep,
                is_async=False,
                wants_ctx=False,
                stream=self.name,
                policy=spec.retry,
                stopping=stopping,
                threaded=False,
            )
        self._hasher = salted_hasher(
            spec.stream.hash_fields, spec.stream.hash_salt_env, owner=spec.handler_class.__qualname__
        )
        self._scheduler: KeyedScheduler | None = None
        self._sequence = 0
        self.halt = False
        self.events_processed = 0
        self.events_filtered = 0
        """Events (and snapshot rows) the ``@event_filter`` left out since the stream started."""
        self.last_seen_time: datetime | None = None
        self.copying: Interleaved | None = None
        """Set while an incremental snapshot has work for the read loop."""

    def _invoker(self, method: Any) -> Invoker:
        return Invoker(
            getattr(self._handler, method.name),
            is_async=method.is_async,
            wants_ctx=method.wants_ctx,
            stream=self.name,
            policy=self.spec.retry,
            stopping=self._stopping,
            # Batch methods may run for seconds (Spark jobs): keep the loop free for heartbeats.
            threaded=self._concurrency > 1 or method.kind != "event",
            observe=self.metrics.handler_seconds.observe if self.metrics is not None else None,
        )

    def _set_halt(self) -> None:
        self.halt = True

    def waiting(self) -> int:
        """Events gathered in the batch being formed (0 outside batch streams)."""
        return self.batch.pending if self.batch is not None else 0

    def _count_delivered(self, events: int) -> None:
        self.events_processed += events

    @property
    def handler_error(self) -> BaseException | None:
        """The error a concurrently run handler task, or the batch in flight, failed with."""
        if self._scheduler is not None and self._scheduler.error is not None:
            return self._scheduler.error
        return self.batch.failure if self.batch is not None else None

    # -- one open stream -----------------------------------------------------------------------

    async def read(
        self,
        reader: ReadAhead,
        committer: CheckpointCommitter,
        position: Mapping[str, Any],
        *,
        first_read: Callable[[], None],
        halted: Callable[[], Stopped | LostOwnership],
    ) -> ReadOutcome:
        """Read ``reader`` until the stream ends or halts, and say how it ended; raise what it
        failed with. ``first_read()`` is called once the stream has read something; ``halted()``
        is the outcome of a halt (and raises the error of a failed handler or committer)."""
        self._sequence = 0
        self._scheduler = KeyedScheduler(self._concurrency, self._set_halt) if self._concurrency > 1 else None
        batch = self.batch
        if batch is not None:
            batch.reset()
            batch.replay_until(self._opener.replay_end)
        committer.failed.add_done_callback(lambda _: self._set_halt())
        invokers = self._invokers
        fallback = self._fallback
        ok = self.metrics.ok if self.metrics is not None else None
        inline = batch is None and self._scheduler is None
        hasher, keep = self._hasher, self._keep
        screening = hasher is not None or keep is not None
        items = reader.items
        read_once = False
        while True:
            if self.halt:
                # One flag for the hot path; the reason is sorted out here.
                return halted()
            change = items.popleft() if items else await reader.wait()
            kind = change.__class__
            if kind is FailedRead:
                error = change.error
                if isinstance(error, InvalidBSON):
                    ended = await self._poison(committer, position, error, halted)
                    # From the checkpoint, now past the poison event (unless an invalidate ended it).
                    return Reopen() if ended is None else ended
                raise error
            if not read_once:
                read_once = True
                first_read()
            copying = self.copying
            if copying is not None and copying.due(change, kind is EmptyRead):
                await copying.step(change, kind is EmptyRead, position, committer)
                if self.halt:
                    continue  # the item is read again from the checkpoint
            if kind is EmptyRead:
                token = change.token
                if batch is not None and not self.halt and batch.due(token):
                    await batch.deliver(committer)
                if not change.alive:
                    # The server closed the stream after an invalidate event.
                    return Stopped()
                if token is not None and self._idle():
                    position = token
                    committer.observe_seen(token)
                    self.last_seen_time = token_datetime(token)
                continue
            position = token = change["_id"]
            operation = change.get("operationType")
            if screening:
                # Hashed fields first: the filter is a method too, and sees what the others see.
                if hasher is not None:
                    change = hasher(change)
                if keep is not None:
                    try:
                        kept = keep(ChangeEvent(change))
                    except Exception as error:  # a failing filter is a failing handler: retry policy
                        kept = await self._filter_failed(change, error, committer)
                    else:
                        if not kept:
                            await self._pass(change, committer)
                    if not kept:
                        if operation == "invalidate" and not self.halt:
                            return await self._on_invalidate(change, committer, halted)
                        if batch is not None and not self.halt and batch.due():
                            # A run of left-out events must not hold the batch past its wait.
                            await batch.deliver(committer)
                        continue
            if inline:
                # The common case inline: one event at a time, a sync handler on the loop.
                self._sequence += 1
                invoker = invokers.get(operation, fallback)
                first_error = None
                ctx = None if invoker is None else invoker.context()
                if invoker is None or (
                    invoker.inline and (first_error := invoker.call_inline(ChangeEvent(change), ctx)) is None
                ):
                    save = committer.commit_nowait(self._sequence, token)
                    if save is not None:
                        await save
                    self.events_processed += 1
                    if ok is not None:
                        ok[operation] = ok.get(operation, 0) + 1
                    if ctx is not None and ctx.save_requested:
                        await committer.flush()
                else:
                    await self._handle_event(self._sequence, change, committer, first_error, ctx)
            else:
                await self._dispatch(change, committer)
            if operation == "invalidate":
                return await self._on_invalidate(change, committer, halted)

    # -- the filter ------------------------------------------------------------------------------

    async def _pass(self, change: Mapping[str, Any], committer: CheckpointCommitter) -> None:
        """Complete an event the filter left out, as if it were handled: it takes its place in
        the stream's order and the committer's frontier moves past it once everything before it
        completed (a batch before it included)."""
        self._sequence += 1
        save = committer.commit_nowait(self._sequence, change["_id"])
        if save is not None:
            await save
        self.events_processed += 1
        self._count_filtered(change)

    def _count_filtered(self, change: Mapping[str, Any]) -> None:
        self.events_filtered += 1
        if self.metrics is not None:
            self.metrics.handled(str(change.get("operationType", "")), "filtered")

    async def _filter_failed(
        self, change: MutableMapping[str, Any], error: Exception, committer: CheckpointCommitter | None
    ) -> bool:
        """The filter raised ``error`` on its first call: call it again under the retry policy.

        True when it then kept the event (the caller delivers it). False when the event is done
        with: left out by the filter, or given up on under ``on_exhausted`` (SKIP, DEAD_LETTER),
        and then completed through ``committer`` (snapshot rows have no position: None), or left
        unfinished because the stream is stopping (:attr:`halt` is then set). STOP raises
        HandlerError: the stream fails with its checkpoint before the event.
        """
        assert self._filter is not None
        try:
            _, kept = await self._filter.retry_for_result(ChangeEvent(change), error)
        except Exhausted as exhausted:
            await self._giving_up.give_up([change], exhausted.error, exhausted.attempts)
            if committer is not None:
                self._sequence += 1
                await committer.commit(self._sequence, change["_id"])
                self.events_processed += 1
            return False
        except Interrupted:
            self.halt = True
            return False
        if kept:
            return True
        if committer is not None:
            await self._pass(change, committer)
        else:
            self._count_filtered(change)
        return False

    async def _screen(
        self, change: MutableMapping[str, Any], committer: CheckpointCommitter | None
    ) -> MutableMapping[str, Any] | None:
        """An event (or a snapshot row: no committer) as the methods get it, its hashed fields
        hashed; None when the filter left it out or it is otherwise done with (see
        :meth:`_filter_failed`). The read loop does the same inline."""
        if self._hasher is not None:
            change = self._hasher(change)
        if self._keep is None:
            return change
        try:
            kept = self._keep(ChangeEvent(change))
        except Exception as error:  # a failing filter is a failing handler: retry policy
            kept = await self._filter_failed(change, error, committer)
        else:
            if not kept:
                if committer is not None:
                    await self._pass(change, committer)
                else:
                    self._count_filtered(change)
        return change if kept else None

    async def wait_in_flight(self) -> None:
        """Let handlers running concurrently, and the batch in flight, finish."""
        if self._scheduler is not None:
            await self._scheduler.wait_all()
        if self.batch is not None:
            await self.batch.wait_in_flight()

    async def _dispatch(self, change: MutableMapping[str, Any], committer: CheckpointCommitter) -> None:
        """Give the next event its sequence number and hand it to the stream's delivery mode."""
        self._sequence += 1
        if self.batch is not None:
            await self.batch.offer(self._sequence, change, committer)
        elif self._scheduler is not None:

            async def handle(sequence: int, event: MutableMapping[str, Any]) -> None:
                await self._handle_event(sequence, event, committer)

            await self._scheduler.spawn(self._sequence, change, handle)
        else:
            await self._handle_event(self._sequence, change, committer)

    def _idle(self) -> bool:
        """Nothing read so far is unfinished, so a post-batch token is a safe resume point.

        Once the loop is halting (a failed or interrupted event, a stop, a lost lease) some event
        may be unfinished without being in flight or in the batch: never idle then.
        """
        if self.halt or (self._scheduler is not None and self._scheduler.busy()):
            return False
        return self.batch is None or self.batch.idle()

    async def _on_invalidate(
        self,
        change: Mapping[str, Any],
        committer: CheckpointCommitter,
        halted: Callable[[], Stopped | LostOwnership],
    ) -> Invalidated | Reopen | LostOwnership:
        """What the stream does at an invalidate event, once every event read before it (the
        events waiting in a batch included) was handled: open again after it, or end."""
        if self.batch is not None and not self.halt:
            # The stream goes on after the invalidate, or ends: the batch being formed holds
            # events before it, the invalidate included, that nothing would hand over later.
            await self.batch.deliver_all(committer)
        await self.wait_in_flight()
        if self.halt and isinstance(lost := halted(), LostOwnership):
            # A lost lease (or a handler of an event before the invalidate, failed meanwhile:
            # halted() raises its error) wins over the invalidate; a stop does not.
            return lost
        if self.spec.stream.on_invalidate == OnInvalidate.RESTART:
            self.log.warning("stream %s: invalidated; restarting after the invalidate event", self.name)
            self._opener.forced_start = {"start_after": change["_id"]}
            return Reopen()
        error = StreamInvalidatedError(self.name, operation="drop or rename", token=change.get("_id"))
        self.log.warning("%s", error)
        return Invalidated(error)

    async def _handle_event(
        self,
        sequence: int,
        change: MutableMapping[str, Any],
        committer: CheckpointCommitter,
        first_error: BaseException | None = None,
        ctx: StreamContext | None = None,
    ) -> None:
        """Handle one event under the retry policy, then commit it (unless the stream stops).

        ``first_error``: the first attempt already ran inline with ``ctx`` and failed with it.
        """
        operation = change.get("operationType", "")
        invoker = self._invokers.get(operation, self._fallback)
        if ctx is None and invoker is not None:
            ctx = invoker.context()
        if not await self._run_handler(change, invoker, ctx, first_error):
            return  # stopping: this event stays unfinished, the checkpoint stays before it
        await committer.commit(sequence, change["_id"])
        self.events_processed += 1
        if ctx is not None and ctx.save_requested:
            await committer.flush()

    async def _run_handler(
        self,
        change: MutableMapping[str, Any],
        invoker: Invoker | None,
        ctx: StreamContext | None,
        first_error: BaseException | None = None,
    ) -> bool:
        """The event's method under the retry policy, or ``on_exhausted`` once it gave up;
        False when the stream stopped while a failed call waited for its next attempt."""
        operation = change.get("operationType", "")
        outcome = "ok"
        if invoker is not None:
            try:
                if first_error is None:
                    calls = await invoker(ChangeEvent(change), ctx)
                else:
                    calls = await invoker.retry(ChangeEvent(change), first_error, ctx)
                outcome = "ok" if calls == 1 else "retried"
            except Exhausted as exhausted:
                await self._giving_up.give_up([change], exhausted.error, exhausted.attempts)
                outcome = ""  # counted by giving_up
            except Interrupted:
                return False
        if self.metrics is not None and outcome:
            self.metrics.handled(operation, outcome)
        return True

    async def deliver_snapshot(self, rows: list[Any], batch_id: str) -> None:
        """Hand one chunk of initial-snapshot rows to the methods; return once every row was
        handled, left out by the filter or given up on (see :mod:`flowwarden.runtime.snapshot`).
        A stop that interrupts a row returns early; the stop set :attr:`halt`, so the chunk is not
        finished."""
        if self._hasher is not None or self._keep is not None:
            screened = []
            for row in rows:
                kept = await self._screen(row, None)
                if self.halt:
                    return
                if kept is not None:
                    screened.append(kept)
            rows = screened
            if not rows:
                return
        if self.batch is not None:
            await self.batch.deliver_rows(rows, batch_id)
            return
        width = max(1, self._concurrency)
        if width == 1:
            for row in rows:  # one at a time: no task per row
                if not await self._snapshot_row(row):
                    return
            return
        for start in range(0, len(rows), width):
            # Each document appears once in a snapshot: its rows need no order among themselves.
            done = await asyncio.gather(*(self._snapshot_row(row) for row in rows[start : start + width]))
            if not all(done):
                return

    async def _snapshot_row(self, row: Any) -> bool:
        invoker = self._invokers.get("snapshot", self._fallback)
        return await self._run_handler(row, invoker, None if invoker is None else invoker.context())

    # -- events that cannot be decoded -------------------------------------------------------------

    async def _poison(
        self,
        committer: CheckpointCommitter,
        position: Mapping[str, Any],
        error: InvalidBSON,
        halted: Callable[[], Stopped | LostOwnership],
    ) -> Invalidated | Reopen | LostOwnership | None:
        """The driver could not decode a batch: find the event that cannot be decoded, give up on it.

        PyMongo decodes a whole batch at once, so the batch is read again as raw BSON and each
        event decoded on its own with the stream's codec options. Events that decode are handled
        as usual; the first that does not gets the retry policy's on_exhausted at once (decoding
        again cannot help): STOP leaves the checkpoint before it, SKIP and DEAD_LETTER move past
        it. The outer loop then re-opens from the saved checkpoint. Returns how an invalidate
        event met on the way ended the reading, if one did.
        """
        target = self._opener.watch_target()
        if self._opener.watches_cluster:
            raise error  # a cluster stream's codec cannot be changed per stream: fail visibly
        strict: CodecOptions[Any] = getattr(target, "codec_options", None) or CodecOptions()
        raw_options: CodecOptions[Any] = CodecOptions(
            document_class=RawBSONDocument,
            tz_aware=strict.tz_aware,
            tzinfo=strict.tzinfo,
            unicode_decode_error_handler="surrogateescape",
        )
        stream = await self._opener.open({"resume_after": position}, codec_options=raw_options)
        try:
            while not self.halt:
                raw = await stream.try_next()
                if raw is None:
                    continue
                try:
                    change = bson.decode(raw.raw, codec_options=strict)
                except Exception as decode_error:  # whatever the codec raised: this event is poison
                    await self._give_up_undecodable(committer, raw.raw, decode_error)
                    return None
                screened = await self._screen(change, committer)
                if self.halt:
                    break
                if screened is not None:
                    await self._dispatch(screened, committer)
                if change.get("operationType") == "invalidate":
                    return await self._on_invalidate(change, committer, halted)
        finally:
            await self._opener.close(stream)
        return None

    async def _give_up_undecodable(
        self, committer: CheckpointCommitter, data: bytes, error: BaseException
    ) -> None:
        await self.wait_in_flight()
        if self.batch is not None:
            await self.batch.deliver_all(committer)
        event = await self._giving_up.undecodable(data, error, in_batch=False)
        self._sequence += 1
        await committer.commit(self._sequence, event["_id"])
        await committer.flush()


__all__ = ["EventDispatch", "Interleaved"]
