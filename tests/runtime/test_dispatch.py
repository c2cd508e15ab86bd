"""Dispatch: concurrency with per-document order, batches, unhandled types, ctx."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from flowwarden import (
    ChangeEvent,
    StreamContext,
    change_stream,
    checkpoint,
    on_batch,
    on_change,
    on_insert,
)

from .conftest import checkpoint_doc, running, wait_until


def test_max_concurrency_runs_handlers_side_by_side_and_keeps_per_document_order(
    mongodb_uri, client, db_name
):
    handled: list[tuple[int, int]] = []
    active = {"now": 0, "peak": 0}
    lock = threading.Lock()
    rng = random.Random(7)

    @change_stream("orders", db_name, name="orders", max_concurrency=8, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Concurrent:
        @on_change
        async def handle(self, event: ChangeEvent) -> None:
            with lock:
                active["now"] += 1
                active["peak"] = max(active["peak"], active["now"])
            await asyncio.sleep(rng.uniform(0, 0.02))  # completions arrive out of order
            with lock:
                active["now"] -= 1
                handled.append((event.document_key["_id"], event.full_document["v"]))

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [Concurrent]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": k, "v": 0} for k in range(10)])
        for v in range(1, 6):
            for k in range(10):
                orders.replace_one({"_id": k}, {"v": v})
        wait_until(lambda: len(handled) == 60, what="60 events")
        wait_until(
            lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 60,
            what="the checkpoint to reach the last event",
        )
    assert active["peak"] > 1
    for k in range(10):
        assert [v for key, v in handled if key == k] == [0, 1, 2, 3, 4, 5]
    # out-of-order completion happened, yet the checkpoint only holds contiguous progress
    assert [key for key, _ in handled] != sorted(key for key, _ in handled)


def test_on_batch_delivers_bounded_batches_and_commits_after_return(mongodb_uri, client, db_name):
    batches: list[list[int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=40, max_wait_seconds=0.2)
        def handle(self, events: list[ChangeEvent], ctx: StreamContext) -> None:
            assert ctx.stream == "orders"
            batches.append([e.document_key["_id"] for e in events])

    orders = client[db_name]["orders"]
    with running(mongodb_uri, [Batches]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(100)])
        wait_until(lambda: sum(map(len, batches)) == 100, what="100 events in batches")
        wait_until(lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 100)
    assert [i for batch in batches for i in batch] == list(range(100))
    assert max(map(len, batches)) <= 40
    # the trailing partial batch was delivered by the max_wait deadline, not held back
    assert len(batches[-1]) == 100 % 40 or len(batches) > 3


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
    with running(mongodb_uri, [Eager]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(4)])
        doc = wait_until(
            lambda: (checkpoint_doc(client, db_name, "orders") or {}).get("eventsProcessed", 0) >= 3,
            what="the requested save",
        )
        assert doc
        time.sleep(0.2)
        assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 3
