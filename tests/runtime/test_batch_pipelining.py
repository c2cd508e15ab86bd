"""BatchDelivery on its own (no server): a batch is handed over while the stream reads on, the
next one only after it was committed, and reading ahead stops at the byte bound."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument

from flowwarden import change_stream, on_batch, retry_policy
from flowwarden.cli.logs import JsonFormatter
from flowwarden.config.spec import stream_spec
from flowwarden.runtime import batching
from flowwarden.runtime.batching import BatchDelivery
from flowwarden.runtime.invoke import Invoker


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


def delivery(method: Gated, delivered: list[int], max_events: int, max_attempts: int = 3) -> BatchDelivery:
    @change_stream("orders", "shop", name="orders")
    @retry_policy(max_attempts=max_attempts, initial_delay_seconds=0.01)
    class Batches:
        @on_batch(max_events=max_events, max_wait_seconds=3600)
        async def handle(self, events: list[Any]) -> None: ...

    spec = stream_spec(Batches)
    invoker = Invoker(
        method.handle,
        is_async=True,
        wants_ctx=False,
        stream="orders",
        policy=spec.retry,
        stopping=asyncio.Event(),
        threaded=False,
    )
    return BatchDelivery(
        spec,
        invoker=invoker,
        spark_provider=None,
        giving_up=None,  # type: ignore[arg-type]  # nothing here gives up
        delivered=delivered.append,
        failed=lambda: None,
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

    method, delivered, committer = Refused(), [], Committer()
    batches = delivery(method, delivered, max_events=1, max_attempts=1)
    giving_up = batches._giving_up = StopOnExhausted()  # type: ignore[assignment]
    batches._failed = lambda: halted.append(True)
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
    assert "formed again without its last event" in line["message"]
    method.gates[0].set()
    await batches.wait_in_flight()
