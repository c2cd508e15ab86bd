"""Incremental snapshots in a running connector: requested while the stream runs, copied in chunks
between its changes, a row dropped when its document changed between the chunk's watermarks.

The kill -9 proof with a writer is in test_incremental_crashes.py; these tests pin each rule on a
connector in this process: where rows come in the stream, the watermark rule on a change placed
between the watermarks on purpose, batches, partitions, filters, cancelling, refusing, status and
metrics.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pymongo
import pytest
from bson import MinKey, ObjectId

from flowwarden import (
    ChangeEvent,
    Connector,
    StreamContext,
    change_stream,
    checkpoint,
    event_filter,
    on_batch,
    on_change,
    on_dataframe,
)
from flowwarden.checkpoints import IncrementalState
from flowwarden.errors import ConfigurationError
from flowwarden.mongo.buckets import bucket_stage
from flowwarden.mongo.calls import run
from flowwarden.mongo.initial_copy import copy_filter, document_key
from flowwarden.mongo.signals import insert_request, request_document
from flowwarden.runtime import incremental as incremental_module
from flowwarden.runtime.incremental import ChunkWindow, IncrementalSnapshot
from helpers import checkpoint_doc, running, samples, value, wait_until, wait_until_async

Row = tuple[str, Any]


def _orders(db: str, delivered: list[Row], *, chunk: int = 40, **stream: Any) -> type:
    @change_stream(
        "orders",
        db,
        name="orders",
        full_document="updateLookup",
        snapshot_chunk_size=chunk,
        max_await_time_ms=50,
        **stream,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            delivered.append((event.operation_type, event.document_key["_id"]))

    return Orders


def _progress(connector: Connector, stream: str = "orders") -> Any:
    return connector.status()[stream].incremental_snapshot


def _done(connector: Connector, stream: str = "orders") -> bool:
    progress = _progress(connector, stream)
    return progress is not None and progress.state is IncrementalState.DONE


def test_a_requested_snapshot_hands_every_document_over_between_the_changes(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(130)])
    delivered: list[Row] = []
    with running(mongodb_uri, [_orders(db_name, delivered)]) as connector:
        orders.insert_one({"_id": "before"})
        wait_until(lambda: ("insert", "before") in delivered, what="a change before the request")
        request = connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
        orders.insert_one({"_id": "after"})
        wait_until(lambda: ("insert", "after") in delivered, what="a change after the copy")
    rows = [key for operation, key in delivered if operation == "snapshot"]
    assert sorted(rows, key=str) == sorted([*range(130), "before"], key=str)
    assert delivered[0] == ("insert", "before") and delivered[-1] == ("insert", "after")
    progress = checkpoint_doc(client, db_name)["incrementalSnapshot"]
    assert progress["request"] == request and progress["state"] == "done"
    assert progress["copied"] == 131 and progress["dropped"] == 0 and progress["chunk"] == 4
    signal = client[db_name]["_fw_signals"].find_one({"_id": ObjectId(request)})
    assert signal["state"] == "requested" and signal["finished"] == ["orders"]


def _change_between_the_watermarks(
    monkeypatch: pytest.MonkeyPatch, orders: pymongo.collection.Collection[Any]
) -> list[bool]:
    """The first chunk's high watermark is written only after an update of document 3, a delete
    of document 4 and an insert past the bound: changes the chunk's read did not see."""
    written: list[bool] = []
    watermark = IncrementalSnapshot._watermark

    async def late_watermark(self: IncrementalSnapshot, session: Any, progress: Any) -> Any:
        if not written:
            orders.update_one({"_id": 3}, {"$set": {"qty": 33}})
            orders.delete_one({"_id": 4})
            orders.insert_one({"_id": 500, "qty": 5})
            written.append(True)
        return await watermark(self, session, progress)

    monkeypatch.setattr(IncrementalSnapshot, "_watermark", late_watermark)
    return written


def test_a_change_between_the_watermarks_drops_the_row_and_wins(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(20)])
    written = _change_between_the_watermarks(monkeypatch, orders)
    delivered: list[Row] = []
    with running(mongodb_uri, [_orders(db_name, delivered, chunk=10)]) as connector:
        connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
    assert written
    rows = [key for operation, key in delivered if operation == "snapshot"]
    # The changes came, in place of the rows of the documents they changed; the rest were copied.
    assert sorted(rows) == [i for i in range(20) if i not in (3, 4)]
    assert delivered[:11] == [
        ("update", 3),
        ("delete", 4),
        ("insert", 500),
        *[("snapshot", i) for i in (0, 1, 2, 5, 6, 7, 8, 9)],
    ]
    assert _progress(connector).dropped == 2 and _progress(connector).copied == 18


def test_without_the_watermark_rule_an_old_row_lands_after_the_change(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the rule prevents: with it switched off, the rows read before the update and the
    delete are handed over after them, bringing back the old document and the deleted one."""
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(10)])
    _change_between_the_watermarks(monkeypatch, orders)
    monkeypatch.setattr(ChunkWindow, "drop", lambda self, identity: None)
    delivered: list[Row] = []
    with running(mongodb_uri, [_orders(db_name, delivered, chunk=10)]) as connector:
        connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
    assert delivered.index(("update", 3)) < delivered.index(("snapshot", 3))
    assert delivered.index(("delete", 4)) < delivered.index(("snapshot", 4))


def test_a_chunk_waits_for_the_stream_to_pass_its_high_watermark(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes made before the high watermark come before the chunk's rows, changes after it
    after them: the rows sit at the watermark in stream order."""
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(5)])
    watermark = IncrementalSnapshot._watermark
    after: list[bool] = []

    async def then_write(self: IncrementalSnapshot, session: Any, progress: Any) -> Any:
        orders.insert_one({"_id": f"before-{progress.chunk}"})
        high = await watermark(self, session, progress)
        orders.insert_one({"_id": f"after-{progress.chunk}"})
        after.append(True)
        return high

    monkeypatch.setattr(IncrementalSnapshot, "_watermark", then_write)
    delivered: list[Row] = []
    with running(mongodb_uri, [_orders(db_name, delivered, chunk=5)]) as connector:
        connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
        wait_until(lambda: ("insert", "after-1") in delivered, what="the write after the watermark")
    assert delivered == [
        ("insert", "before-1"),
        *[("snapshot", i) for i in range(5)],
        ("insert", "after-1"),
    ]


def test_on_batch_gets_each_chunk_as_a_batch_of_its_own_after_the_changes_before_it(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(45)])
    written = _change_between_the_watermarks(monkeypatch, orders)
    batches: list[tuple[str | None, list[Row]]] = []

    @change_stream("orders", db_name, name="orders", snapshot_chunk_size=100, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_batch(max_events=20, max_wait_seconds=5)
        def handle(self, events: list[ChangeEvent], ctx: StreamContext) -> None:
            batches.append((ctx.batch_id, [(e.operation_type, e.document_key["_id"]) for e in events]))

    with running(mongodb_uri, [Orders]) as connector:
        request = connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
    assert written
    # The changes gathered before the first chunk's watermark went first, as a batch of their
    # own before its max_wait_seconds; each chunk (at most max_events rows) is then one batch.
    assert batches[0] == (batches[0][0], [("update", 3), ("delete", 4), ("insert", 500)])
    copies = [(batch_id, rows) for batch_id, rows in batches[1:]]
    assert [batch_id for batch_id, _ in copies] == [f"snapshot:{request}:{n}" for n in (1, 2, 3)]
    keys = [key for _, rows in copies for operation, key in rows if operation == "snapshot"]
    assert keys == [i for i in range(45) if i not in (3, 4)]
    assert all(len(rows) <= 20 for _, rows in copies)


@pytest.mark.spark
def test_on_dataframe_gets_each_chunk_as_a_dataframe_of_snapshot_rows(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: Any,
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": i} for i in range(25)])
    written = _change_between_the_watermarks(monkeypatch, orders)
    frames: list[tuple[str | None, list[tuple[str, str]]]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_dataframe(max_events=10, max_wait_seconds=5)
        def write(self, df: Any, ctx: StreamContext) -> None:
            rows = df.select("operation_type", "document_key").collect()
            frames.append((ctx.batch_id, [(row["operation_type"], row["document_key"]) for row in rows]))

    with running(mongodb_uri, [Orders], spark=spark) as connector:
        request = connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end", timeout=120)
    assert written
    assert [operation for operation, _ in frames[0][1]] == ["update", "delete", "insert"]
    assert [batch_id for batch_id, _ in frames[1:]] == [f"snapshot:{request}:{n}" for n in (1, 2, 3)]
    copied = [key for _, rows in frames[1:] for operation, key in rows if operation == "snapshot"]
    assert copied == [f'{{"_id":{{"$numberInt":"{i}"}}}}' for i in range(25) if i not in (3, 4)]


def test_each_bucket_of_a_partitioned_stream_copies_its_own_documents(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(90)])
    copied: dict[str, list[Any]] = {}
    lock = threading.Lock()

    @change_stream(
        "orders", db_name, name="orders", partitions=3, snapshot_chunk_size=10, max_await_time_ms=50
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def changed(self, event: ChangeEvent, ctx: StreamContext) -> None:
            with lock:
                copied.setdefault(ctx.stream, []).append(event.document_key["_id"])

    buckets = [f"orders[{index}/3]" for index in range(3)]
    with running(mongodb_uri, [Orders]) as connector:
        connector.request_snapshot("orders")
        wait_until(lambda: all(_done(connector, bucket) for bucket in buckets), what="every bucket's copy")
    assert sorted(key for keys in copied.values() for key in keys) == list(range(90))
    for index, bucket in enumerate(buckets):
        own = {doc["_id"] for doc in orders.find(copy_filter([bucket_stage(index, 3)]))}
        assert copied[bucket] and sorted(copied[bucket]) == sorted(own)


def test_a_database_stream_copies_the_collections_and_documents_requested(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    database = client[db_name]
    database.orders.insert_many([{"_id": i, "k": i} for i in range(10)])
    database.returns.insert_many([{"_id": i, "k": i} for i in range(10)])
    delivered: list[tuple[str, Any]] = []

    @change_stream(database=db_name, name="shop", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Shop:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            delivered.append((event.namespace[1], event.document_key["_id"]))

    with running(mongodb_uri, [Shop]) as connector:
        connector.request_snapshot("shop", ["returns"], {"k": {"$gte": 6}})
        wait_until(lambda: _done(connector, "shop"), what="the copy to end")
    assert delivered == [("returns", k) for k in range(6, 10)]
    progress = _progress(connector, "shop")
    assert progress.namespaces == (f"{db_name}.returns",) and progress.copied == 4


HASH_SALT = "salt-for-requested-copies"


def _hashed(value: str) -> str:
    return hashlib.sha256(HASH_SALT.encode() + value.encode()).hexdigest()


def test_a_requested_copy_goes_through_the_streams_filters_as_the_initial_copy_does(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exclude_collections chooses the collections copied (and refuses one it leaves out),
    exclude_fields are removed by the server, hash_fields hashed, and the @event_filter asked."""
    monkeypatch.setenv("FW_TEST_HASH_SALT", HASH_SALT)
    database = client[db_name]
    for name in ("orders", "returns", "audit"):
        database[name].insert_many(
            [{"_id": i, "email": f"{name}-{i}@example.com", "secret": {"pin": i}, "k": i} for i in range(6)]
        )
    delivered: list[tuple[str, str, Any, Any]] = []

    @change_stream(
        database=db_name,
        name="shop",
        exclude_collections=["audit"],
        exclude_fields=["secret"],
        hash_fields=["email"],
        hash_salt_env="FW_TEST_HASH_SALT",
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Shop:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return event.document_key["_id"] % 2 == 0

        @on_change
        def changed(self, event: ChangeEvent) -> None:
            delivered.append(
                (event.operation_type, event.namespace[1], event.document_key["_id"], event.full_document)
            )

    signals = database["_fw_signals"]
    with running(mongodb_uri, [Shop]) as connector:
        with pytest.raises(ConfigurationError, match=r"leave out \S+\.audit"):
            connector.request_snapshot("shop", ["audit"])
        connector.request_snapshot("shop")
        wait_until(lambda: _done(connector, "shop"), what="the copy to end")
        refused = run(insert_request(signals, request_document("shop", ["audit"])))
        wait_until(
            lambda: signals.find_one({"_id": ObjectId(refused)})["state"] == "refused", what="the refusal"
        )
        filtered = connector.status()["shop"].events_filtered
    assert delivered == [
        ("snapshot", name, i, {"_id": i, "email": _hashed(f"{name}-{i}@example.com"), "k": i})
        for name in ("orders", "returns")
        for i in (0, 2, 4)
    ]
    assert filtered == 6 and _progress(connector, "shop").namespaces == (
        f"{db_name}.orders",
        f"{db_name}.returns",
    )
    assert "exclude_collections leave out" in signals.find_one({"_id": ObjectId(refused)})["reason"]


def test_a_cancelled_request_stops_the_copy_at_its_next_chunk(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(400)])
    delivered: list[Row] = []

    @change_stream("orders", db_name, name="orders", snapshot_chunk_size=10, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            if event.operation_type == "snapshot":
                time.sleep(0.005)  # the copy lasts about 2 s
            delivered.append((event.operation_type, event.document_key["_id"]))

    signals = client[db_name]["_fw_signals"]
    with running(mongodb_uri, [Orders]) as connector:
        request = connector.request_snapshot("orders")
        wait_until(lambda: len(delivered) >= 10, what="the copy's first rows")
        signals.update_one({"_id": ObjectId(request)}, {"$set": {"state": "cancelled"}})
        wait_until(lambda: _progress(connector).state is IncrementalState.CANCELLED, what="the cancel")
        copied = len(delivered)
        orders.insert_one({"_id": "later"})
        wait_until(lambda: ("insert", "later") in delivered, what="a change after the cancel")
    assert 0 < copied < 400 and delivered[copied:] == [("insert", "later")]
    stored = checkpoint_doc(client, db_name)["incrementalSnapshot"]
    assert stored["state"] == "cancelled" and stored["endedAt"] is not None


def test_a_request_for_a_collection_the_stream_does_not_watch_is_refused(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    delivered: list[Row] = []
    orders = _orders(db_name, delivered)
    signals = client[db_name]["_fw_signals"]
    with running(mongodb_uri, [orders]) as connector:
        # The connector checks what it is asked for; a request written elsewhere is checked by
        # the stream that takes it.
        with pytest.raises(ConfigurationError, match=r"watches \S+\.orders only"):
            connector.request_snapshot("orders", ["returns"])
        with pytest.raises(ConfigurationError, match="no stream named 'order'"):
            connector.request_snapshot("order")
        request = run(insert_request(signals, request_document("orders", ["returns"])))
        wait_until(
            lambda: signals.find_one({"_id": ObjectId(request)})["state"] == "refused", what="the refusal"
        )
    stored = signals.find_one({"_id": ObjectId(request)})
    assert stored["reason"].startswith("orders: the stream watches") and delivered == []
    assert _progress(connector) is None


def test_status_and_metrics_show_the_copy(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(30)])
    _change_between_the_watermarks(monkeypatch, orders)
    delivered: list[Row] = []
    with running(mongodb_uri, [_orders(db_name, delivered, chunk=10)], metrics_port=0) as connector:
        request = connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
        found = samples(connector)
    labels = {"stream": "orders", "request": request}
    assert value(found, "flowwarden_snapshot_requested_documents_copied", **labels) == 28
    assert value(found, "flowwarden_snapshot_requested_documents_dropped", **labels) == 2
    assert value(found, "flowwarden_snapshot_requested_documents_estimated", **labels) == 30
    assert value(found, "flowwarden_snapshot_requested_running", **labels) == 0


def test_a_restarted_connector_goes_on_with_the_stored_progress(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(60)])
    delivered: list[Row] = []
    stop_after = threading.Event()

    @change_stream("orders", db_name, name="orders", snapshot_chunk_size=10, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            delivered.append((event.operation_type, event.document_key["_id"]))
            if len(delivered) == 25:
                stop_after.set()

    first = Connector(mongodb_uri, [Orders])
    first.start()
    try:
        request = first.request_snapshot("orders")
        stop_after.wait(30)
    finally:
        first.stop()
    stopped = checkpoint_doc(client, db_name)["incrementalSnapshot"]
    assert stopped["state"] == "running" and stopped["request"] == request
    with running(mongodb_uri, [Orders]) as second:
        wait_until(lambda: _done(second), what="the copy to end after the restart")
    rows = [key for operation, key in delivered if operation == "snapshot"]
    assert sorted(set(rows)) == list(range(60))
    # A graceful stop finishes the chunk in hand or leaves it planned: at most it comes again.
    assert len(rows) - 60 <= 10 and rows[:stopped["copied"]] == list(range(stopped["copied"]))


def test_document_keys_are_equal_where_mongodb_holds_ids_equal() -> None:
    from bson import Decimal128, Int64

    assert document_key(1) == document_key(1.0) == document_key(Int64(1)) == document_key(Decimal128("1"))
    assert document_key(1.5) != document_key(1) and document_key("1") != document_key(1)
    assert document_key(True) != document_key(1)
    assert document_key({"a": 1, "b": 2}) != document_key({"b": 2, "a": 1})  # field order counts
    assert incremental_module.DEFAULT_POLL_SECONDS > 0


def test_with_concurrent_handlers_the_rows_wait_for_the_changes_in_flight(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(20)])
    _change_between_the_watermarks(monkeypatch, orders)
    delivered: list[Row] = []
    lock = threading.Lock()

    @change_stream(
        "orders", db_name, name="orders", snapshot_chunk_size=10, max_concurrency=4, max_await_time_ms=50
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            if event.operation_type != "snapshot":
                time.sleep(0.5)  # still running when the stream passes the chunk's watermark
            with lock:
                delivered.append((event.operation_type, event.document_key["_id"]))

    with running(mongodb_uri, [Orders]) as connector:
        connector.request_snapshot("orders")
        wait_until(lambda: _done(connector), what="the copy to end")
    changes = [index for index, (operation, _) in enumerate(delivered) if operation != "snapshot"]
    rows = [index for index, (operation, _) in enumerate(delivered) if operation == "snapshot"]
    assert len(changes) == 3 and max(changes) < min(rows)
    assert sorted(key for operation, key in delivered if operation == "snapshot") == [
        i for i in range(20) if i not in (3, 4)
    ]


def test_a_request_made_before_the_connector_runs_or_on_its_loop(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    import asyncio

    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(12)])
    delivered: list[Row] = []
    connector = Connector(mongodb_uri, [_orders(db_name, delivered, chunk=5)])
    # Before it runs: through a client of its URI.
    before = connector.request_snapshot("orders", ["orders"], {"_id": {"$lt": 6}})

    async def run() -> str:
        task = asyncio.ensure_future(connector.run_async())
        await wait_until_async(lambda: _done(connector), what="the first copy")
        with pytest.raises(RuntimeError, match="request_snapshot_async"):
            connector.request_snapshot("orders")  # would block the loop it runs on
        second = await connector.request_snapshot_async("orders", filter={"_id": {"$gte": 6}})
        await wait_until_async(
            lambda: _progress(connector).request == second and _done(connector), what="the second copy"
        )
        connector.stop()
        await task
        return second

    second = asyncio.run(run())
    rows = [key for operation, key in delivered if operation == "snapshot"]
    assert rows == list(range(12))
    signals = client[db_name]["_fw_signals"]
    assert [s["finished"] for s in signals.find({"kind": "snapshot"}, sort=[("requestedAt", 1)])] == [
        ["orders"],
        ["orders"],
    ]
    assert {str(s["_id"]) for s in signals.find({"kind": "snapshot"})} == {before, second}


def test_a_change_to_another_collection_drops_no_row(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = client[db_name]
    database.orders.insert_many([{"_id": i} for i in range(10)])
    database.returns.insert_many([{"_id": i} for i in range(10)])
    watermark = IncrementalSnapshot._watermark

    async def late_watermark(self: IncrementalSnapshot, session: Any, progress: Any) -> Any:
        if progress.chunk == 1:
            database.orders.update_one({"_id": 3}, {"$set": {"x": 1}})  # same _id, other collection
            database.returns.update_one({"_id": 4}, {"$set": {"x": 1}})
        return await watermark(self, session, progress)

    monkeypatch.setattr(IncrementalSnapshot, "_watermark", late_watermark)
    delivered: list[tuple[str, str, Any]] = []

    @change_stream(database=db_name, name="shop", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Shop:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            delivered.append((event.operation_type, event.namespace[1], event.document_key["_id"]))

    with running(mongodb_uri, [Shop]) as connector:
        connector.request_snapshot("shop", ["returns"])
        wait_until(lambda: _done(connector, "shop"), what="the copy to end")
    assert delivered[:2] == [("update", "orders", 3), ("update", "returns", 4)]
    assert delivered[2:] == [("snapshot", "returns", i) for i in range(10) if i != 4]


def test_a_stop_ends_the_look_for_requests_even_when_the_driver_swallows_the_cancel(
    mongodb_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver call that a cancel interrupts may end with an error of its own rather than the
    cancellation; the stream's look for requests must end anyway, or the stop would wait for it."""
    from pymongo.errors import AutoReconnect

    polling = threading.Event()

    async def poll_as_the_driver_does(self: IncrementalSnapshot) -> None:
        import asyncio

        polling.set()
        try:
            await asyncio.Event().wait()  # a read that never answers
        except asyncio.CancelledError:
            raise AutoReconnect("connection closed while the operation was cancelled") from None

    monkeypatch.setattr(IncrementalSnapshot, "poll", poll_as_the_driver_does)
    connector = Connector(mongodb_uri, [_orders(db_name, [])])
    connector.start()
    try:
        assert polling.wait(20), "the stream did not look for requests"
    finally:
        connector.stop(timeout=20)
    assert connector.status()["orders"].state.value == "STOPPED"


def test_a_stream_that_leads_again_goes_on_from_the_progress_stored_meanwhile(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    """While this connector stood by (its lease taken), another took the copy on and stored its
    progress further: leading again, this one goes on from there, not from what it last knew."""
    from datetime import datetime, timedelta, timezone

    from flowwarden import StreamState

    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(100)])
    delivered: list[Row] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        deployment="single_leader",
        lease_ttl_seconds=1.5,
        snapshot_chunk_size=10,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            if event.operation_type == "snapshot":
                time.sleep(0.01)  # the copy lasts about a second
            delivered.append((event.operation_type, event.document_key["_id"]))

    locks, checkpoints = client[db_name]["_fw_locks"], client[db_name]["_fw_checkpoints"]
    with running(mongodb_uri, [Orders], instance_id="a") as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING, what="a leads")
        connector.request_snapshot("orders")
        wait_until(lambda: len(delivered) >= 15, what="the copy's first rows")
        # Another instance takes the stream over, as after a long pause of this one.
        taken = locks.find_one({"_id": "orders"})["epoch"] + 1
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        locks.update_one(
            {"_id": "orders"},
            {"$set": {"owner": "z", "ownerToken": "host-z:1:0000", "epoch": taken, "expiresAt": later}},
        )
        checkpoints.update_one({"_id": "orders"}, {"$set": {"epoch": taken}})
        wait_until(lambda: connector.status()["orders"].state == StreamState.STANDBY, what="a to stand by")
        copied_by_a = len(delivered)
        assert copied_by_a < 60, "the copy went too far before the lease was taken"
        # ... and copies up to _id 69, then goes away.
        checkpoints.update_one(
            {"_id": "orders"},
            {
                "$set": {
                    "incrementalSnapshot.chunk": 7,
                    "incrementalSnapshot.lastId": 69,
                    "incrementalSnapshot.chunkEnd": MinKey(),
                    "incrementalSnapshot.copied": 70,
                }
            },
        )
        gone = datetime.fromtimestamp(0, timezone.utc)
        locks.update_one(
            {"_id": "orders", "owner": "z"},
            {"$set": {"owner": None, "ownerToken": None, "expiresAt": gone}},
        )
        wait_until(lambda: _done(connector), what="the copy to end after a leads again")
    after = [key for operation, key in delivered[copied_by_a:] if operation == "snapshot"]
    assert after == list(range(70, 100))
    assert _progress(connector).copied == 100
