"""BatchDelivery on its own (no server): a batch is handed over while the stream reads on, the
next one only after it was committed, and reading ahead stops at the byte bound."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument

from flowwarden import change_stream, on_batch, on_dataframe, retry_policy
from flowwarden.cli.logs import JsonFormatter
from flowwarden.config.spec import stream_spec
from flowwarden.runtime import batching
from flowwarden.runtime.batching import BatchDelivery
from flowwarden.runtime.invoke import Invoker
from flowwarden.runtime.metrics import StreamMetrics
from flowwarden.runtime.opening import describe_token

from .test_dataframe_delivery import ArrowSession


class Committer:
    """What BatchDelivery asks of the checkpoint committer, written down in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def flush(self) -> None:
        self.calls.append(("flush", None))

    async def save_batch_end(self, token: Any) -> None:
        self.calls.append(("batch end", token["_data"]))

    async def commit_through(self, sequence: int, token: Any) -> None:
        self.calls.append(("commit", token["_data"]))


def change(n: int) -> RawBSONDocument:
    return RawBSONDocument(
        bson.encode({"_id": {"_data": f"{n:04d}"}, "operationType": "insert", "documentKey": {"_id": n}})
    )


EVENT_BYTES = len(change(0).raw)


class Gated:
    """A batch method that records each batch and waits for the test to let it return."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gates: list[asyncio.Event] = []

    async def handle(self, events: list[Any]) -> None:
        gate = asyncio.Event()
        self.gates.append(gate)
        self.batches.append([event.document_key["_id"] for event in events])
        await gate.wait()


def delivery(
    method: Gated,
    delivered: list[int],
    max_events: int,
    max_attempts: int = 3,
    *,
    giving_up: Any = None,
    failed: Any = lambda: None,
    metrics: StreamMetrics | None = None,
    wants_ctx: bool = False,
) -> BatchDelivery:
    @change_stream("orders", "shop", name="orders")
    @retry_policy(max_attempts=max_attempts, initial_delay_seconds=0.01, max_delay_seconds=0.01)
    class Batches:
        @on_batch(max_events=max_events, max_wait_seconds=3600)
        async def handle(self, events: list[Any]) -> None: ...

    spec = stream_spec(Batches)
    invoker = Invoker(
        method.handle,
        is_async=True,
        wants_ctx=wants_ctx,
        stream="orders",
        policy=spec.retry,
        stopping=asyncio.Event(),
        threaded=False,
    )
    return BatchDelivery(
        spec,
        invoker=invoker,
        spark_provider=None,
        giving_up=giving_up,  # None: nothing here gives up
        delivered=delivered.append,
        failed=failed,
        metrics=metrics,
    )


async def settle_loop() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_next_batch_forms_while_one_is_in_flight_and_is_handed_over_after_its_commit() -> None:
    method, delivered, committer = Gated(), [], Committer()
    batches = delivery(method, delivered, max_events=3)
    for n in range(1, 4):
        await batches.offer(n, change(n), committer)  # the third makes the batch due
    await settle_loop()
    assert method.batches == [[1, 2, 3]] and not batches.idle()
    # The method has not returned: the stream goes on, and the next batch forms behind it.
    await batches.offer(4, change(4), committer)
    await batches.offer(5, change(5), committer)
    assert batches.pending == 2
    assert committer.calls == [("flush", None), ("batch end", "0003")]
    sixth = asyncio.ensure_future(batches.offer(6, change(6), committer))  # due: waits for the first
    await settle_loop()
    assert not sixth.done() and method.batches == [[1, 2, 3]]
    method.gates[0].set()
    await sixth
    await settle_loop()
    assert method.batches == [[1, 2, 3], [4, 5, 6]] and delivered == [3]
    # The second batch's end is stored only after the first batch was committed.
    assert committer.calls == [
        ("flush", None),
        ("batch end", "0003"),
        ("commit", "0003"),
        ("flush", None),
        ("batch end", "0006"),
    ]
    method.gates[1].set()
    await batches.wait_in_flight()
    assert delivered == [3, 3] and committer.calls[-1] == ("commit", "0006") and batches.idle()


async def test_reading_ahead_behind_a_batch_in_flight_stops_at_the_byte_bound(monkeypatch) -> None:
    monkeypatch.setattr(batching, "READ_AHEAD_BYTES", 2 * EVENT_BYTES)
    method, delivered, committer = Gated(), [], Committer()
    batches = delivery(method, delivered, max_events=2)
    await batches.offer(1, change(1), committer)
    await batches.offer(2, change(2), committer)  # in flight from here
    await batches.offer(3, change(3), committer)  # one event's bytes: reading goes on
    # max_events is 2 only so that the first batch is small; a bigger second batch is the point.
    batches.max_events = 10
    fourth = asyncio.ensure_future(batches.offer(4, change(4), committer))  # the bound: waits
    await settle_loop()
    assert not fourth.done() and batches.pending == 2
    method.gates[0].set()
    await fourth
    # The bound paused reading; it did not cut the batch, which goes on forming.
    assert batches.pending == 2 and not batches.due()
    await batches.offer(5, change(5), committer)
    assert batches.pending == 3 and delivered == [2]


class StopOnExhausted:
    """GivingUp with on_exhausted=STOP: the stream ends with the handler's error."""

    def __init__(self) -> None:
        self.given_up: list[list[int]] = []

    async def give_up(self, changes: list[Any], error: BaseException, attempts: int) -> None:
        self.given_up.append([c["documentKey"]["_id"] for c in changes])
        raise RuntimeError(f"the stream stops: {error}")


async def test_a_batch_that_fails_in_flight_halts_the_stream_and_fails_the_next_hand_over() -> None:
    halted: list[bool] = []

    class Refused(Gated):
        async def handle(self, events: list[Any]) -> None:
            raise ValueError("the sink refused the batch")

    method, delivered, committer, giving_up = Refused(), [], Committer(), StopOnExhausted()
    batches = delivery(
        method,
        delivered,
        max_events=1,
        max_attempts=1,
        giving_up=giving_up,
        failed=lambda: halted.append(True),
    )
    await batches.offer(1, change(1), committer)  # handed over; fails in flight
    await settle_loop()
    assert halted == [True] and giving_up.given_up == [[1]]
    assert str(batches.failure) == "the stream stops: the sink refused the batch"
    assert not batches.idle()  # the failed batch's events are unfinished
    with pytest.raises(RuntimeError, match="the stream stops"):
        await batches.offer(2, change(2), committer)  # the next hand-over raises it
    assert ("commit", "0001") not in committer.calls and delivered == []


async def test_a_committed_batch_leaves_the_stream_idle_before_the_next_hand_over() -> None:
    # A caught-up batch stream must be idle once its last batch committed, or its lastSeen
    # never moves on while its collection is quiet.
    method, delivered, committer = Gated(), [], Committer()
    batches = delivery(method, delivered, max_events=2)
    await batches.offer(1, change(1), committer)
    await batches.offer(2, change(2), committer)  # due: handed over
    await settle_loop()
    assert not batches.idle()  # its method has not returned
    method.gates[0].set()
    await settle_loop()
    assert committer.calls[-1] == ("commit", "0002") and batches.idle()
    await batches.offer(3, change(3), committer)
    assert not batches.idle()  # an event waits in the next batch


async def test_a_batch_formed_again_without_its_last_event_says_so_naming_the_stream(caplog) -> None:
    """The one line batching writes, as the JSON format shows it: under its own module, with ``stream``."""
    caplog.set_level(logging.WARNING, logger="flowwarden")
    method, delivered, committer = Gated(), [], Committer()
    batches = delivery(method, delivered, max_events=10)
    batches.replay_until({"_data": "0003"})  # stored as ending at 3, which the stream skips now
    await batches.offer(1, change(1), committer)
    await batches.offer(2, change(4), committer)
    await settle_loop()
    assert method.batches == [[1]]
    lines = [JsonFormatter().format(r) for r in caplog.records if r.name.startswith("flowwarden")]
    [line] = [json.loads(text) for text in lines]
    assert line["logger"] == "flowwarden.runtime.batching" and line["stream"] == "orders"
    assert line["message"] == (
        f"stream orders: the batch stored as ending at {describe_token({'_data': '0003'})} was formed "
        "again without its last event, which the stream no longer returns"
    )
    method.gates[0].set()
    await batches.wait_in_flight()


async def test_a_batch_formed_again_ends_exactly_at_its_stored_end_whatever_its_size() -> None:
    method, delivered, committer = Gated(), [], Committer()
    batches = delivery(method, delivered, max_events=2)
    batches.replay_until({"_data": "0005"})
    assert batches.replaying and not batches.due()  # nothing pending: never due
    for n in range(1, 5):
        await batches.offer(n, change(n), committer)  # past max_events, not due: not at its end
    assert method.batches == [] and batches.pending == 4
    await batches.offer(5, change(5), committer)  # its end, the stored one included
    await settle_loop()
    assert method.batches == [[1, 2, 3, 4, 5]] and not batches.replaying
    method.gates[0].set()
    await batches.offer(6, change(6), committer)
    await batches.offer(7, change(7), committer)  # formed by count again
    await settle_loop()
    assert method.batches == [[1, 2, 3, 4, 5], [6, 7]]
    method.gates[1].set()
    await batches.wait_in_flight()


async def test_a_batch_formed_again_is_due_once_the_stream_read_up_to_its_end_without_it() -> None:
    method, delivered, committer = Gated(), [], Committer()
    batches = delivery(method, delivered, max_events=2)
    batches.replay_until({"_data": "0005"})
    for n in range(1, 4):
        await batches.offer(n, change(n), committer)
    # An empty read whose post-batch token is before the end: not yet; at or past it: due.
    assert not batches.due({"_data": "0004"}) and not batches.due()
    assert batches.due({"_data": "0005"}) and batches.due({"_data": "0006"})


async def test_each_batch_is_one_named_task_and_its_context_names_its_first_event() -> None:
    seen: list[str | None] = []

    class Recording(Gated):
        async def handle(self, events: list[Any], ctx: Any) -> None:  # type: ignore[override]
            seen.append(ctx.batch_id)
            await super().handle(events)

    method, delivered, committer = Recording(), [], Committer()
    batches = delivery(method, delivered, max_events=2, wants_ctx=True)
    await batches.offer(1, change(1), committer)
    await batches.offer(2, change(2), committer)
    await settle_loop()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("flowwarden-batch")] == [
        "flowwarden-batch[orders]"
    ]
    assert seen == ["0001"]
    method.gates[0].set()
    await batches.wait_in_flight()


class Recorder:
    """GivingUp with on_exhausted=SKIP or DEAD_LETTER: records what it was given, and goes on."""

    def __init__(self) -> None:
        self.given_up: list[tuple[list[int], str, int]] = []

    async def give_up(self, changes: list[Any], error: BaseException, attempts: int) -> None:
        self.given_up.append(([c["documentKey"]["_id"] for c in changes], str(error), attempts))


async def test_outcomes_are_counted_per_batch_and_an_exhausted_one_is_left_to_giving_up() -> None:
    calls: list[list[int]] = []

    class Flaky(Gated):
        async def handle(self, events: list[Any]) -> None:
            keys = [event.document_key["_id"] for event in events]
            calls.append(keys)
            if keys[0] == 3 and calls.count(keys) == 1:
                raise ValueError("once")  # retried, then handled
            if keys[0] == 5:
                raise ValueError("never")  # exhausted

    metrics, giving_up, committer = StreamMetrics(), Recorder(), Committer()
    delivered: list[int] = []
    batches = delivery(Flaky(), delivered, max_events=2, max_attempts=2, giving_up=giving_up, metrics=metrics)
    for n in range(1, 7):
        await batches.offer(n, change(n), committer)
    await batches.deliver_all(committer)
    assert metrics.outcomes() == {("insert", "ok"): 2, ("insert", "retried"): 2}
    assert giving_up.given_up == [([5, 6], "never", 2)]
    assert delivered == [2, 2, 2] and committer.calls[-1] == ("commit", "0006")
    assert metrics.batch_events.count == 3


async def test_waiting_for_a_failed_batch_in_flight_does_not_raise_its_error() -> None:
    class Refused(Gated):
        async def handle(self, events: list[Any]) -> None:
            raise ValueError("the sink refused the batch")

    committer, giving_up = Committer(), StopOnExhausted()
    batches = delivery(Refused(), [], max_events=1, max_attempts=1, giving_up=giving_up)
    await batches.offer(1, change(1), committer)
    await batches.wait_in_flight()  # the stream stopping: it waits, and reads the outcome from failure
    assert str(batches.failure) == "the stream stops: the sink refused the batch"


async def test_reading_ahead_waits_once_the_batch_holds_the_bound_and_not_a_byte_before(monkeypatch) -> None:
    monkeypatch.setattr(batching, "READ_AHEAD_BYTES", EVENT_BYTES + 1)
    method, committer = Gated(), Committer()
    batches = delivery(method, [], max_events=10)
    in_flight = batches._in_flight = asyncio.ensure_future(asyncio.Event().wait())  # in its method
    await asyncio.wait_for(batches.offer(1, change(1), committer), 5)  # one byte short: reads on
    second = asyncio.ensure_future(batches.offer(2, change(2), committer))  # the bound: waits
    await settle_loop()
    assert not second.done() and batches.pending == 2
    second.cancel()
    in_flight.cancel()


class SaveRefused(Committer):
    """A committer whose store refuses to store the second batch's end."""

    async def save_batch_end(self, token: Any) -> None:
        if token["_data"] == "0004":
            raise RuntimeError("the store refused the write")
        await super().save_batch_end(token)


async def test_a_failed_conversion_made_ahead_of_a_batch_that_never_ran_leaves_asyncio_nothing_to_report(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The second batch is converted while the first is in its method, and its conversion fails;
    the save before the second batch fails too, so that batch never reaches its method and its
    conversion is never awaited: what the conversion raised must not surface later, when the task
    is collected, as asyncio's "Task exception was never retrieved"."""
    import flowwarden.spark

    caplog.set_level(logging.ERROR, logger="asyncio")
    convert = flowwarden.spark.events_to_dataframe
    conversions: list[int] = []

    def converting(spark: Any, events: Any, **options: Any) -> Any:
        conversions.append(events[0]["documentKey"]["_id"])
        if events[0]["documentKey"]["_id"] == 3:
            raise RuntimeError("the second batch's conversion failed")
        return convert(spark, events, **options)

    monkeypatch.setattr(flowwarden.spark, "events_to_dataframe", converting)
    gate = asyncio.Event()
    tables: list[Any] = []

    @change_stream("orders", "shop", name="orders")
    @retry_policy(max_attempts=1)
    class Frames:
        @on_dataframe(max_events=2, max_wait_seconds=3600)
        async def write(self, table: Any) -> None:
            tables.append(table)
            await gate.wait()

    spec = stream_spec(Frames)
    invoker = Invoker(
        Frames().write,
        is_async=True,
        wants_ctx=False,
        stream="orders",
        policy=spec.retry,
        stopping=asyncio.Event(),
        threaded=False,
    )
    delivered: list[int] = []
    batches = BatchDelivery(
        spec,
        invoker=invoker,
        spark_provider=ArrowSession,
        giving_up=None,  # nothing here gives up: the failed save fails the batch first
        delivered=delivered.append,
        failed=lambda: None,
    )
    committer = SaveRefused()
    await batches.offer(1, change(1), committer)
    await batches.offer(2, change(2), committer)
    await batches.offer(3, change(3), committer)
    fourth = asyncio.ensure_future(batches.offer(4, change(4), committer))  # due: waits for the first
    for _ in range(500):
        if conversions == [1, 3] and tables:
            break
        await asyncio.sleep(0.01)
    assert conversions == [1, 3] and len(tables) == 1, "the second batch was not converted ahead"
    gate.set()
    await fourth
    await batches.wait_in_flight()
    assert isinstance(batches.failure, RuntimeError) and str(batches.failure) == "the store refused the write"
    assert delivered == [2] and len(tables) == 1
    # The failure's traceback holds the frames that held the dropped conversion, and the loop's
    # pending callbacks hold the tasks until they ran.
    del batches, fourth
    await settle_loop()
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
