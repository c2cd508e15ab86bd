"""Dispatch: concurrency with per-document order, batches, unhandled types, ctx."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from flowwarden import (
    ChangeEvent,
    StreamContext,
    change_stream,
    checkpoint,
    on_batch,
    on_change,
    on_delete,
    on_insert,
    retry_policy,
)
from helpers import checkpoint_doc, running, samples, value, wait_until


async def _wait(event: asyncio.Event | threading.Event, deadline: float) -> None:
    """Wait in a handler for ``event``; give up at ``deadline``, so that a broken build fails the
    test's assertions instead of hanging it."""
    timeout = max(0.0, deadline - time.monotonic())
    if isinstance(event, threading.Event):
        await asyncio.to_thread(event.wait, timeout)
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def test_max_concurrency_runs_handlers_side_by_side_and_keeps_per_document_order(
    mongodb_uri, client, db_name
):
    completed: list[tuple[int, int]] = []
    running_keys: set[int] = set()
    overlapping: list[tuple[int, int]] = []
    active = {"now": 0, "peak": 0}
    eight_at_once = asyncio.Event()  # used on the connector's event loop only
    release_first = threading.Event()
    deadline = time.monotonic() + 30

    @change_stream("orders", db_name, name="orders", max_concurrency=8, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Concurrent:
        @on_change
        async def handle(self, event: ChangeEvent) -> None:
            key, v = event.document_key["_id"], event.full_document["v"]
            if key in running_keys:
                overlapping.append((key, v))
            running_keys.add(key)
            active["now"] += 1
            active["peak"] = max(active["peak"], active["now"])
            if active["peak"] >= 8:
                eight_at_once.set()
            if v == 0 and key < 8:
                # The first eight events (eight documents) all wait until eight run at once.
                await _wait(eight_at_once, deadline)
            if (key, v) == (0, 0):
                # The very first event finishes only when the test says so: everything of the
                # other documents can finish before it, nothing of its own document.
                await _wait(release_first, deadline)
            active["now"] -= 1
            running_keys.discard(key)
            completed.append((key, v))

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [Concurrent]) as connector:
        try:
            wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
            orders.insert_many([{"_id": k, "v": 0} for k in range(10)])
            for v in range(1, 6):
                for k in range(10):
                    orders.replace_one({"_id": k}, {"v": v})
            # All 54 events of documents 1-9 finish while the first event of document 0 runs;
            # the other five of document 0 wait behind it.
            wait_until(lambda: connector.status()["orders"].events_processed >= 54, what="54 events")
            assert [(key, v) for key, v in completed if key == 0] == []
            # They finished out of stream order, yet the checkpoint holds only contiguous
            # progress: nothing is saved past the unfinished first event.
            assert checkpoint_doc(client, db_name, "orders").get("lastProcessedToken") is None
            release_first.set()
            wait_until(lambda: len(completed) == 60, what="60 events")
            wait_until(
                lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 60,
                what="the checkpoint to reach the last event",
            )
        finally:
            release_first.set()  # also when the test failed: the stop waits for handlers
    assert active["peak"] == 8  # eight at once, never more
    assert overlapping == []  # never two events of one document at once
    for k in range(10):
        assert [v for key, v in completed if key == k] == [0, 1, 2, 3, 4, 5]
    assert completed[-6:] == [(0, v) for v in range(6)]


def test_each_concurrent_call_reads_its_own_events_attempt_after_an_await(mongodb_uri, client, db_name):
    # Every event fails twice: its calls must see attempts 1, 2, 3, before and after an await,
    # while the other events' attempts run beside them.
    attempts: dict[int, list[tuple[int, int]]] = {}

    @change_stream("orders", db_name, name="orders", max_concurrency=4, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=3, initial_delay_seconds=0.001, max_delay_seconds=0.001, jitter=0)
    class Flaky:
        @on_change
        async def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            before = ctx.attempt
            # The other events' calls run meanwhile, each taking its own time.
            await asyncio.sleep(0.003 * (1 + event.document_key["_id"] % 5))
            attempts.setdefault(event.document_key["_id"], []).append((before, ctx.attempt))
            if ctx.attempt < 3:
                raise RuntimeError("fails twice")

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [Flaky]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(8)])
        wait_until(lambda: connector.status()["orders"].events_processed == 8, what="eight events")
    assert attempts == {i: [(1, 1), (2, 2), (3, 3)] for i in range(8)}



def test_an_inline_method_that_failed_gets_its_context_again_on_each_retry(mongodb_uri, client, db_name):
    # A sync method with one event at a time runs on the event loop: its first call is inline,
    # and the retries after it get the same context, its attempt counted on.
    calls: list[tuple[int, int, str]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=3, initial_delay_seconds=0.001, max_delay_seconds=0.001, jitter=0)
    class Flaky:
        @on_change
        def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            calls.append((event.document_key["_id"], ctx.attempt, ctx.stream))
            if ctx.attempt < 3:
                raise RuntimeError("fails twice")

    with running(mongodb_uri, [Flaky]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name]["orders"].insert_many([{"_id": i} for i in range(2)])
        wait_until(lambda: connector.status()["orders"].events_processed == 2, what="both events")
        status = connector.status()["orders"]
    assert calls == [(i, attempt, "orders") for i in range(2) for attempt in (1, 2, 3)]
    assert status.events_failed == 0

def test_on_batch_delivers_bounded_batches_and_commits_after_return(mongodb_uri, client, db_name, caplog):
    caplog.set_level(logging.WARNING, logger="flowwarden")
    batches: list[list[int]] = []
    saved_before: list[int] = []  # the stored eventsProcessed when each batch was handed over

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=40, max_wait_seconds=0.2)
        def handle(self, events: list[ChangeEvent], ctx: StreamContext) -> None:
            assert ctx.stream == "orders"
            saved_before.append(checkpoint_doc(client, db_name, "orders").get("eventsProcessed", 0))
            batches.append([e.document_key["_id"] for e in events])

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [Batches]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        assert connector.status()["orders"].inferred_schema is None  # no schema="infer": none
        orders.insert_many([{"_id": i} for i in range(100)])
        # 100 is not a multiple of 40 and nothing is written after the 100th event: they can all
        # arrive only if a batch smaller than max_events is handed over at its max_wait deadline.
        wait_until(lambda: sum(map(len, batches)) == 100, what="100 events in batches")
        wait_until(lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 100)
    assert [i for batch in batches for i in batch] == list(range(100))
    assert max(map(len, batches)) <= 40
    # Each batch was handed over with exactly the batches before it saved: a batch is committed
    # after its method returned, and before the next one starts.
    assert saved_before == [sum(map(len, batches[:n])) for n in range(len(batches))]
    assert [r.getMessage() for r in caplog.records] == []  # nothing to sample, nothing to warn of


def test_events_without_a_handler_still_advance_the_checkpoint(mongodb_uri, client, db_name):
    inserts: list[int] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class InsertsOnly:
        @on_insert
        def created(self, event: ChangeEvent) -> None:
            inserts.append(event.document_key["_id"])

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [InsertsOnly]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_one({"_id": 1})
        orders.update_one({"_id": 1}, {"$set": {"x": 1}})
        orders.delete_one({"_id": 1})
        wait_until(lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 3)
    assert inserts == [1]


def test_save_checkpoint_now_saves_right_after_the_call(mongodb_uri, client, db_name):
    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1000, save_interval_seconds=3600)
    class Eager:
        @on_change
        def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            if event.document_key["_id"] == 2:
                ctx.save_checkpoint_now()

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [Eager]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(5)])
        # Once all five are handled, a save asked for by event 2 has been written (the stream
        # waits for it before the next event), and no other trigger is due for 1000 events or
        # an hour: the checkpoint is exactly after event 2.
        wait_until(lambda: connector.status()["orders"].events_processed == 5, what="five events")
        assert checkpoint_doc(client, db_name, "orders").get("eventsProcessed") == 3


def test_the_stream_reads_the_next_batch_while_a_method_works_and_stores_its_end_only_after(
    mongodb_uri, client, db_name
):
    release = threading.Event()
    batches: list[list[int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50, batch_size=2)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=10, max_wait_seconds=60)
        def handle(self, events: list[ChangeEvent]) -> None:
            batches.append([e.document_key["_id"] for e in events])
            if len(batches) == 1:
                release.wait(30)

    orders = client[db_name]["orders"]
    try:
        with running(mongodb_uri, [Batches]) as connector:
            wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="the opening position")
            with orders.watch() as own:
                orders.insert_many([{"_id": i} for i in range(20)])
                tokens = [own.next()["_id"] for _ in range(20)]
            wait_until(lambda: len(batches) == 1, what="the first batch in its method")
            # With getMores of 2 events the reader holds at most 4 ahead: 10 waiting means the
            # stream went on reading into the next batch while the method works.
            wait_until(lambda: connector.status()["orders"].events_waiting >= 10, what="the next batch read")
            doc = checkpoint_doc(client, db_name, "orders")
            assert doc.get("eventsProcessed", 0) == 0
            assert doc["batchEndToken"] == tokens[9]  # the batch in flight's end, not the next one's
            release.set()
            wait_until(lambda: connector.status()["orders"].events_processed == 20, what="both batches")
            wait_until(lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 20)
    finally:
        release.set()
    assert batches == [list(range(10)), list(range(10, 20))]
    doc = checkpoint_doc(client, db_name, "orders")
    assert doc["lastProcessedToken"] == tokens[19]


def test_async_and_concurrent_methods_get_the_events_of_their_operation_type(mongodb_uri, client, db_name):
    seen: list[tuple[str, int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50, max_concurrency=2)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class PerType:
        @on_insert
        async def created(self, event: ChangeEvent) -> None:
            seen.append(("created", event.document_key["_id"]))

        @on_delete
        async def deleted(self, event: ChangeEvent) -> None:
            seen.append(("deleted", event.document_key["_id"]))

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [PerType], metrics_port=0) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_one({"_id": 1})
        orders.update_one({"_id": 1}, {"$set": {"x": 1}})  # no method: passed, in its place
        orders.delete_one({"_id": 1})
        wait_until(lambda: connector.status()["orders"].events_processed == 3, what="three events")
        found = samples(connector)
    assert seen == [("created", 1), ("deleted", 1)]
    for operation in ("insert", "update", "delete"):
        assert (
            value(found, "flowwarden_events_total", stream="orders", operation=operation, outcome="ok") == 1
        )
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 3
