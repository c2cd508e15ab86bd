"""Gathering events into batches for ``@on_batch`` and ``@on_dataframe`` methods.

A batch is delivered when it holds ``max_events`` events or its oldest event has waited
``max_wait_seconds``, whichever comes first. Its events count as finished only after the method
returned, so whatever the method wrote (a parquet file, a table) is durable before the checkpoint
moves past the batch.

Where a batch ends is stored before its method runs (``batchEndToken``). After a restart, the
first batch is formed to end exactly there, whatever ``max_events`` and ``max_wait_seconds``
say, so a batch the method may have half-written comes back with the same events and the same
``ctx.batch_id``.

Batches are pipelined: while the method works on one batch, the stream goes on reading and the
next batch forms. The next batch is handed over only after the one before it returned and was
committed, so batches still run one at a time, in stream order, and the checkpoint moves past a
batch only once its method returned. While a batch is in flight, the batch forming behind it
reads ahead by at most ``max_events`` events and, for DataFrame streams (whose events arrive as
raw BSON), :data:`READ_AHEAD_BYTES` bytes; then reading waits for the method.

Raw events wait in a batch lean (:func:`flowwarden.mongo.raw_events.lean`): a batch of 10,000 events
is then 10,000 objects for the cyclic garbage collector to visit, not 90,000.

Sync batch methods, and the Arrow conversion of DataFrame batches, run in a worker thread: they
may take seconds, and the event loop must keep reading, renewing leases and saving heartbeats
meanwhile. A DataFrame batch that is complete while the batch before it is still in its method
starts becoming a DataFrame then (conversion and ``createDataFrame``, which have no effect
outside the process), so the method gets it as soon as its turn comes; it is still handed over
only after the batch before it was committed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from flowwarden.checkpoints import CheckpointCommitter
from flowwarden.config import SchemaMode
from flowwarden.config.delivery import INFER
from flowwarden.config.spec import StreamSpec
from flowwarden.errors import UndecodableEventError
from flowwarden.events import ChangeEvent, ResumeToken, token_data
from flowwarden.mongo.raw_events import lean
from flowwarden.runtime.context import StreamContext, stream_logger
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.invoke import Exhausted, Interrupted, Invoker
from flowwarden.runtime.metrics import StreamMetrics
from flowwarden.runtime.opening import describe_token

READ_AHEAD_BYTES = 64 * 1024 * 1024
"""While a DataFrame batch is in flight, the raw BSON the batch behind it may hold before reading
waits for the method."""


class Batch:
    """Events gathered for one call of the method, in stream order.

    Kept as one list of (lean) events plus what the delivery needs of the others: the last
    event's sequence number and how many events of each operation type there are.
    """

    def __init__(self) -> None:
        self.changes: list[Mapping[str, Any]] = []
        self.operations: Counter[str] = Counter()
        self.last_sequence = -1
        self.bytes = 0
        self.first_at = 0.0

    def add(self, sequence: int, change: MutableMapping[str, Any]) -> None:
        if not self.changes:
            self.first_at = time.monotonic()
        self.operations[str(change.get("operationType", ""))] += 1
        if isinstance(change, RawBSONDocument):
            self.bytes += len(change.raw)
        self.changes.append(lean(change))
        self.last_sequence = sequence

    def __len__(self) -> int:
        return len(self.changes)

    @property
    def first_token(self) -> Any:
        return self.changes[0]["_id"]

    @property
    def last_token(self) -> Any:
        return self.changes[-1]["_id"]


class BatchDelivery:
    """The pending batch of one stream and how to hand it to the method."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        invoker: Invoker,
        spark_provider: Callable[[], Any] | None,
        giving_up: GivingUp,
        delivered: Callable[[int], None],
        failed: Callable[[], None],
        metrics: StreamMetrics | None = None,
        collection: Callable[[CodecOptions[Any]], Any] | None = None,
    ) -> None:
        method = spec.dataframe or spec.batch
        assert method is not None
        self.max_events: int = method.max_events
        self.max_wait_seconds: float = method.max_wait_seconds
        self._dataframe = spec.dataframe is not None
        self._method = spec.dataframe
        self._schema = spec.dataframe.schema if spec.dataframe is not None else None
        self._mode = spec.dataframe.mode if spec.dataframe is not None else SchemaMode.PERMISSIVE
        self._invoker = invoker
        self._spark_provider = spark_provider
        self._batch = Batch()
        self._in_flight: asyncio.Task[bool] | None = None
        self._delivered = delivered
        self._failed = failed
        self.failure: BaseException | None = None
        """The error the batch in flight ended with, once it did (the read loop raises it)."""
        self._replay_end: str | None = None
        self._giving_up = giving_up
        self.log = stream_logger(__name__, spec.name)
        self._metrics = metrics
        self._name = spec.name
        # schema="infer": the watched collection is sampled when the stream starts (see reset).
        self._collection = collection
        self._inferring: asyncio.Task[Any] | None = None
        self.inferred_schema: str | None = None
        """The inferred full-document schema as a DDL field list, once known (for the status)."""

    async def offer(
        self, sequence: int, change: MutableMapping[str, Any], committer: CheckpointCommitter
    ) -> None:
        """Add an event (ending a batch being formed again first, when the event lies past its
        stored end) and hand the batch over once it is due."""
        if self.replaying and self.past_replay_end(change):
            # The stored batch's last event did not come back (the pipeline changed since): the
            # batch formed again ends before this event.
            self.log.warning(
                "stream %s: the batch stored as ending at %s was formed again without its last "
                "event, which the stream no longer returns",
                self._name,
                describe_token({"_data": self._replay_end}),
            )
            await self.deliver(committer)
            self.stop_replay()
        self.add(sequence, change)
        if self.due():
            await self.deliver(committer)
        elif self._batch.bytes >= READ_AHEAD_BYTES:
            await self.settle()  # read no further ahead until the method returns

    async def deliver(self, committer: CheckpointCommitter) -> None:
        """Hand the pending batch over as soon as the batch in flight (if any) is done.

        Returns once the batch is on its way, not when its method returned: the stream reads on
        meanwhile. Raises what the batch before it failed with. A DataFrame batch starts becoming
        a DataFrame at once, while the batch before it is still in its method.
        """
        prepared = None
        if self._dataframe and self._batch and self._in_flight is not None:
            prepared = self._prepare(list(self._batch.changes))
        try:
            await self.settle()
        except BaseException:
            if prepared is not None:
                prepared.cancel()
            raise
        batch = self.take()
        if batch:
            self._in_flight = asyncio.get_running_loop().create_task(
                self._deliver(batch, committer, prepared), name=f"flowwarden-batch[{self._name}]"
            )
            self._in_flight.add_done_callback(self._ended)
        elif prepared is not None:
            prepared.cancel()

    def _prepare(self, raws: list[Mapping[str, Any]]) -> asyncio.Task[Any]:
        """The DataFrame of ``raws``, made in a task of its own (see :meth:`_frame`); what it
        raises is raised where it is awaited, or dropped when it never is."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._frame(raws), name=f"flowwarden-convert[{self._name}]")
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    async def deliver_all(self, committer: CheckpointCommitter) -> None:
        """Hand the pending batch over and wait until its method returned and it is committed."""
        await self.deliver(committer)
        await self.settle()

    async def settle(self) -> None:
        """Wait for the batch in flight to be done; raise what it failed with."""
        task, self._in_flight = self._in_flight, None
        if task is not None:
            await task

    async def wait_in_flight(self) -> None:
        """Wait for the batch in flight to be done, without raising (:attr:`failure` says how it
        ended)."""
        task, self._in_flight = self._in_flight, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def reset(self) -> None:
        """Forget what an earlier run of the stream left: its events come again from the checkpoint.

        A stream with ``schema="infer"`` starts sampling its collection here, once per process:
        every batch of the stream then has the same schema. A failed sampling is tried again
        when the stream re-opens (its first batch failed with the sampling's error)."""
        self.take()
        self._in_flight = None
        self.failure = None
        task = self._inferring
        failed = task is not None and task.done() and (task.cancelled() or task.exception() is not None)
        if self._dataframe and self._schema == INFER and (task is None or failed):
            self._inferring = asyncio.get_running_loop().create_task(
                self._infer(), name=f"flowwarden-infer[{self._name}]"
            )
            self._inferring.add_done_callback(self._inferred)

    async def _infer(self) -> Any:
        from flowwarden.spark.infer import document_ddl, infer_document_spec_async

        dataframe = self._method
        assert self._collection is not None and dataframe is not None
        spec = await infer_document_spec_async(
            self._collection(CodecOptions()), sample_size=dataframe.sample_size, hints=dataframe.schema_hints
        )
        self.inferred_schema = document_ddl(spec)
        self.log.info(
            "stream %s: full_document schema inferred from a sample of up to %d documents: %s",
            self._name,
            dataframe.sample_size,
            self.inferred_schema,
        )
        return spec

    def _inferred(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.warning(
                "stream %s: inferring the schema failed (%s); the first batch fails with it and the "
                "stream samples again when it re-opens",
                self._name,
                task.exception(),
            )

    def _ended(self, task: asyncio.Task[bool]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failure = task.exception()
            self._failed()

    async def _deliver(
        self, batch: Batch, committer: CheckpointCommitter, prepared: asyncio.Task[Any] | None = None
    ) -> bool:
        """Plan the batch durably, hand it to the method, then commit it as one; True once it
        is committed, False when a stop left it unfinished.

        Before the method runs, the position before the batch (the previous batch's end) is
        saved and the batch's last token stored as its end: after a crash the batch is formed
        again from exactly the same events, so ``ctx.batch_id`` names the same events and
        writes keyed by it replace what the interrupted run wrote.
        """
        last = batch.last_token
        await committer.flush()
        await committer.save_batch_end(last)
        ctx = self._invoker.context(str(batch.first_token["_data"]))
        if not await self._run(batch.changes, ctx, batch.operations, prepared):
            return False  # stopping: the batch stays unfinished, the checkpoint stays before it
        await committer.commit_through(batch.last_sequence, last)
        self._delivered(len(batch))
        if ctx is not None and ctx.save_requested:
            await committer.flush()
        return True

    async def _run(
        self,
        changes: list[Mapping[str, Any]],
        ctx: StreamContext | None,
        operations: Counter[str],
        prepared: asyncio.Task[Any] | None = None,
    ) -> bool:
        """The method on one batch under the retry policy, or ``on_exhausted`` once it gave up;
        False when the stream stopped while a failed call waited for its next attempt."""
        try:
            calls, dropped, alone = await self._hand_over(changes, ctx, prepared)
            outcome = "ok" if calls == 1 else "retried"
            if dropped:
                await self._giving_up.park_malformed(dropped)
                alone += [change for change, _ in dropped]
        except Exhausted as exhausted:
            await self._giving_up.give_up(changes, exhausted.error, exhausted.attempts)
            outcome = ""  # counted by giving_up
        except Interrupted:
            return False
        if self._metrics is not None:
            self._metrics.batch_events.observe(len(changes))
            if outcome:
                # The events given up on alone were counted then, with their own outcome.
                operations = operations - Counter(str(change.get("operationType", "")) for change in alone)
                for operation, count in operations.items():
                    self._metrics.handled(operation, outcome, count)
        return True

    async def deliver_rows(self, rows: list[Any], batch_id: str) -> bool:
        """One chunk of initial-snapshot rows as one batch under ``batch_id``, handed over once
        the batch before it returned; False when a stop interrupted it. Never split: the copy
        plans chunks of at most ``max_events``, and a chunk handed over again after a restart
        (the same ``_id`` range, see :mod:`flowwarden.runtime.snapshot`) must be the same batch."""
        await self.settle()
        return await self._run(rows, self._invoker.context(batch_id), Counter(snapshot=len(rows)))

    def add(self, sequence: int, change: MutableMapping[str, Any]) -> None:
        self._batch.add(sequence, change)

    @property
    def pending(self) -> int:
        """Events in the batch being formed."""
        return len(self._batch)

    def idle(self) -> bool:
        """No event waits in a batch, and every batch handed over was committed.

        A batch whose method returned stays referenced as in flight until the next one is handed
        over; once it committed, the stream is idle (a caught-up stream moves its lastSeen on).
        """
        if self._batch:
            return False
        task = self._in_flight
        return task is None or (
            task.done() and not task.cancelled() and task.exception() is None and task.result()
        )

    def replay_until(self, end: ResumeToken | None) -> None:
        """Form the next batch to end exactly at ``end`` (a stored batch end), or not (None)."""
        self._replay_end = None if end is None else token_data(end)

    @property
    def replaying(self) -> bool:
        return self._replay_end is not None

    def past_replay_end(self, change: MutableMapping[str, Any]) -> bool:
        """Whether ``change`` lies after the end of the batch being formed again."""
        end = self._replay_end
        return end is not None and token_data(change["_id"]) > end

    def stop_replay(self) -> None:
        self._replay_end = None

    def due(self, position: ResumeToken | None = None) -> bool:
        """Whether the pending batch is to be delivered now; ``position`` is the stream's
        post-batch token at an empty read (everything up to it has been read)."""
        batch = self._batch
        if not batch:
            return False
        end = self._replay_end
        if end is not None:
            # A batch formed again ends where the stored batch ended, not by count or time.
            return token_data(batch.last_token) >= end or (
                position is not None and token_data(position) >= end
            )
        return len(batch) >= self.max_events or time.monotonic() - batch.first_at >= self.max_wait_seconds

    def take(self) -> Batch:
        """The pending events, now a batch of their own; a batch formed again is then over."""
        batch, self._batch = self._batch, Batch()
        if batch:
            self._replay_end = None
        return batch

    async def _hand_over(
        self,
        changes: list[Mapping[str, Any]],
        ctx: StreamContext | None,
        prepared: asyncio.Task[Any] | None = None,
    ) -> tuple[int, list[tuple[Mapping[str, Any], Any]], list[Mapping[str, Any]]]:
        """Hand the batch to the method (with its retry policy).

        Returns the calls it took; the events a DROPMALFORMED DataFrame conversion left out,
        each with its ``MalformedRow`` (field and error), for the caller to dead-letter; and what
        could be read of the events given up on as undecodable (already counted). Raises
        :class:`Exhausted` when the batch failed for good. An event of a DataFrame batch whose
        BSON cannot be decoded is given up on alone (on_exhausted at once: decoding again cannot
        help), and the rest of the batch is converted without it. ``prepared``: the batch's
        DataFrame, already under way (:meth:`_prepare`).
        """
        if not self._dataframe:
            return await self._invoker([ChangeEvent(change) for change in changes], ctx), [], []
        raws = list(changes)
        undecodable: list[Mapping[str, Any]] = []
        while True:
            try:
                frame, malformed = await (prepared if prepared is not None else self._frame(raws))
                break
            except UndecodableEventError as error:
                prepared = None
                undecodable.append(await self._giving_up.undecodable(raws[error.index], error, in_batch=True))
                del raws[error.index]
                if not raws:
                    return 1, [], undecodable
        calls = await self._invoker(frame, ctx)
        if self._mode != SchemaMode.DROPMALFORMED:
            return calls, [], undecodable  # PERMISSIVE rows stayed in the DataFrame, with _corrupt_record
        return calls, [(raws[m.index], m) for m in malformed], undecodable

    async def _frame(self, raws: list[Mapping[str, Any]]) -> Any:
        """``raws`` as a DataFrame, with the events a DROPMALFORMED conversion left out.

        Raises :class:`Exhausted` when there is no Spark session or the conversion fails (as a
        failed method would), UndecodableEventError naming an event whose BSON cannot be
        decoded, and the sampling's error when inferring the schema failed (it fails the stream,
        not the batch).
        """
        from flowwarden.spark import events_to_dataframe

        assert self._spark_provider is not None
        try:
            spark = await asyncio.to_thread(self._spark_provider)
        except Exception as error:  # no session: the batch fails as a handler would
            raise Exhausted(error, 1) from error
        schema, rescued = self._schema, False
        if schema == INFER:
            assert self._inferring is not None, "reset() starts the sampling before any batch"
            schema, rescued = await self._inferring, True
        try:
            return await asyncio.to_thread(
                events_to_dataframe, spark, raws, schema=schema, mode=self._mode, rescued_data=rescued
            )
        except UndecodableEventError:
            raise
        except Exception as error:  # FAILFAST and conversion errors fail the batch as a handler would
            raise Exhausted(error, 1) from error
