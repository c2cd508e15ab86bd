"""The initial snapshot: existing documents first, then their changes, with no gap.

The claim that matters most is tested with real processes: a connector SIGKILLed in the middle
of copying 5,000 documents while a writer inserts, updates and deletes, then restarted; every row
it delivered, applied in order (snapshot rows as upserts), rebuilds the collection exactly.
The copy's bound (what existed when it began) holds while inserts outrun the copy, also across a
kill; a batch method's snapshot batch handed over again after a kill keeps its id and its ``_id``
range while a writer deletes and inserts inside it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import Decimal128, MinKey, json_util
from bson.codec_options import TypeRegistry

from flowwarden import (
    ChangeEvent,
    Connector,
    OnError,
    Snapshot,
    StartPosition,
    StreamContext,
    StreamState,
    change_stream,
    checkpoint,
    on_batch,
    on_change,
    on_delete,
    on_insert,
    on_snapshot,
    pipeline,
    retry_policy,
    stream_spec,
)
from flowwarden.checkpoints import InMemoryCheckpointStore, SnapshotProgress
from flowwarden.checkpoints.model import utc_now
from flowwarden.errors import ConfigurationError
from flowwarden.mongo.buckets import partition_name
from flowwarden.runtime.opening import describe_token
from flowwarden.testing import EmbeddedReplicaSet
from helpers import checkpoint_doc, complete_lines, running, wait_until, wait_until_async

from .conftest import PoisonDecimal

WORKER = Path(__file__).with_name("snapshot_worker.py")


def _rows_class(db: str, mode: Snapshot, seen: list[Any], **stream: Any) -> type:
    @change_stream("orders", db, name="orders", snapshot=mode, max_await_time_ms=50, **stream)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            seen.append(("snapshot", event.document_key["_id"], event.full_document))

        @on_change
        def changed(self, event: ChangeEvent) -> None:
            key = event.document_key
            seen.append((event.operation_type, key["_id"] if key else None, None))

    return Orders


def test_initial_copies_existing_documents_then_streams_changes_after_the_copy_began(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": i} for i in range(25)])
    seen: list[Any] = []
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL, seen, snapshot_chunk_size=10)]) as c:
        wait_until(lambda: len(seen) == 25, what="the copy")
        orders.insert_one({"_id": 100})
        orders.delete_one({"_id": 3})
        wait_until(lambda: len(seen) == 27, what="the changes after the copy")
        status = c.status()["orders"]
    assert seen[:25] == [("snapshot", i, {"_id": i, "qty": i}) for i in range(25)]
    assert seen[25:] == [("insert", 100, None), ("delete", 3, None)]
    assert status.snapshot is not None and status.snapshot.done and status.snapshot.copied == 25
    assert status.snapshot.total == 25
    stored = checkpoint_doc(client, db_name, "orders")
    assert stored is not None and stored["snapshot"]["done"] is True and stored["snapshot"]["copied"] == 25
    # The copy began at the stored snapshot token: the stream resumed right after it.
    assert stored["lastSeenToken"] is not None

    # A restart does not copy again: it goes on with the changes.
    seen.clear()
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL, seen)]):
        orders.insert_one({"_id": 101})
        wait_until(lambda: seen == [("insert", 101, None)], what="the next change only")


def test_snapshot_rows_carry_the_document_and_go_to_on_insert_without_on_snapshot(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": "a", "sku": "tea"}, {"_id": "b", "sku": "jam"}])
    events: list[ChangeEvent] = []

    @change_stream("orders", db_name, name="orders", snapshot="initial", max_await_time_ms=50)
    class Orders:
        @on_insert
        def created(self, event: ChangeEvent) -> None:
            events.append(event)

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: len(events) == 2, what="both rows")
    first = events[0]
    assert first.operation_type == "snapshot"
    assert first.full_document == {"_id": "a", "sku": "tea"}
    assert first.document_key == {"_id": "a"}
    assert first.namespace == (db_name, "orders")
    assert first.cluster_time is not None and first.cluster_time == events[1].cluster_time
    assert first.raw.get("_id") is None  # a row is not a position: no resume token


def test_batch_methods_receive_snapshot_rows_in_batches(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(23)])
    batches: list[tuple[str, list[tuple[str, int]]]] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, snapshot_chunk_size=10)
    class Orders:
        @on_batch(max_events=4, max_wait_seconds=0.05)
        def handle(self, events: list[ChangeEvent], ctx: StreamContext) -> None:
            assert ctx.batch_id is not None
            batches.append((ctx.batch_id, [(e.operation_type, e.document_key["_id"]) for e in events]))

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: sum(len(rows) for _, rows in batches) == 23, what="every row")
        client[db_name].orders.insert_one({"_id": 99})
        wait_until(lambda: batches[-1][1] == [("insert", 99)], what="the change after the copy")
    rows = [row for _, rows in batches[:-1] for row in rows]
    assert rows == [("snapshot", i) for i in range(23)]
    assert max(len(rows) for _, rows in batches) == 4
    assert len({batch_id for batch_id, _ in batches}) == len(batches)


def test_initial_only_copies_and_stops(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(5)])
    seen: list[Any] = []
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL_ONLY, seen)]) as connector:
        wait_until(lambda: connector.status()["orders"].state is StreamState.STOPPED, what="the stop")
        status = connector.status()["orders"]
    assert [key for _, key, _ in seen] == [0, 1, 2, 3, 4]
    assert "INITIAL_ONLY" in (status.reason or "")
    assert connector.stream_errors() == {}
    # Started again, it has nothing left to copy and stops at once.
    client[db_name].orders.insert_one({"_id": 5})
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL_ONLY, seen)]) as connector:
        wait_until(lambda: connector.status()["orders"].state is StreamState.STOPPED, what="the stop")
    assert len(seen) == 5


def test_a_database_stream_copies_its_collections_in_order_and_not_flowwardens_own(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    database = client[db_name]
    database.create_collection("archive")  # first in name order, and nothing to copy
    database.returns.insert_many([{"_id": None}, {"_id": 1}, {"_id": 2}])  # null sorts first
    database.orders.insert_one({"_id": 1})
    database["_fw_dlq"].insert_one({"_id": "not user data"})
    seen: list[tuple[str, Any]] = []

    @change_stream(database=db_name, name="shop", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    class Shop:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            seen.append((event.namespace[1] or "", event.document_key["_id"]))

        @on_change
        def changed(self, event: ChangeEvent) -> None:
            pass  # the database's changes, checkpoint writes included

    with (
        caplog.at_level(logging.INFO, logger="flowwarden.runtime.snapshot"),
        running(mongodb_uri, [Shop]) as connector,
    ):
        wait_until(lambda: _copied(connector, "shop"), what="the copy")
    assert seen == [("orders", 1), ("returns", None), ("returns", 1), ("returns", 2)]
    assert _snapshot_lines(caplog)[0].startswith(
        f"stream shop: initial snapshot of {db_name}.archive, {db_name}.orders, {db_name}.returns (about 4 "
    )


def test_partitioned_streams_copy_their_own_bucket(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    if client.server_info()["versionArray"][0] < 7:
        pytest.skip("needs MongoDB 7.0+ ($toHashedIndexKey splits the stream)")
    client[db_name].orders.insert_many([{"_id": i} for i in range(60)])
    seen: list[tuple[str, int]] = []

    @change_stream("orders", db_name, name="orders", partitions=3, snapshot=Snapshot.INITIAL)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent, ctx: StreamContext) -> None:
            seen.append((ctx.stream, event.document_key["_id"]))

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: len(seen) == 60, what="every document once")
    assert sorted(key for _, key in seen) == list(range(60))
    buckets = {stream for stream, _ in seen}
    assert buckets == {partition_name("orders", i, 3) for i in range(3)}
    # A document's bucket is the one its changes go to: its hashed _id modulo 3.
    hashes = {
        row["_id"]: row["h"]
        for row in client[db_name].orders.aggregate([{"$project": {"h": {"$toHashedIndexKey": "$_id"}}}])
    }
    for stream, key in seen:
        assert stream == partition_name("orders", ((hashes[key] % 3) + 3) % 3, 3)


@pytest.mark.embedded_only
def test_when_needed_copies_again_once_history_is_lost() -> None:
    with EmbeddedReplicaSet(oplog_max_events=20) as rs, pymongo.MongoClient(rs.uri) as client:
        orders = client.shop.orders
        orders.insert_many([{"_id": i} for i in range(3)])
        seen: list[Any] = []
        with running(rs.uri, [_rows_class("shop", Snapshot.WHEN_NEEDED, seen)]):
            wait_until(lambda: len(seen) == 3, what="the first copy")
            orders.insert_one({"_id": 3})
            wait_until(lambda: len(seen) == 4, what="a change")
        assert [kind for kind, _, _ in seen] == ["snapshot"] * 3 + ["insert"]
        orders.insert_many([{"_id": i} for i in range(4, 40)])  # the stored position leaves the oplog
        seen.clear()
        with running(rs.uri, [_rows_class("shop", Snapshot.WHEN_NEEDED, seen)]) as connector:
            wait_until(lambda: len(seen) == 40, what="the second copy")
            assert connector.status()["orders"].state is StreamState.RUNNING
            orders.insert_one({"_id": 40})
            wait_until(lambda: len(seen) == 41, what="changes after the second copy")
        assert seen[:40] == [("snapshot", i, {"_id": i}) for i in range(40)]
        assert seen[40][:2] == ("insert", 40)


def test_a_store_without_snapshot_support_is_refused_by_name(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    class Minimal:  # the seven methods of the store SPI, and no save_snapshot
        def __init__(self) -> None:
            self._inner = InMemoryCheckpointStore()

        def __getattr__(self, name: str) -> Any:
            if name == "save_snapshot":
                raise AttributeError(name)
            return getattr(self._inner, name)

    store = Minimal()
    seen: list[Any] = []
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL, seen)], checkpoint_store=store) as c:
        wait_until(lambda: c.status()["orders"].state is StreamState.FAILED, what="the refusal")
        error = c.stream_errors()["orders"]
    assert isinstance(error, ConfigurationError)
    allowed = "a store with save_snapshot (every store flowwarden ships has it), or NEVER"
    assert str(error) == (
        f"stream 'orders', option 'snapshot': the checkpoint store {store!r} cannot keep an initial "
        f"snapshot's progress (it has no save_snapshot method) (allowed: {allowed})"
    )
    assert (error.stream, error.option, error.value, error.allowed) == (
        "orders",
        "snapshot",
        Snapshot.INITIAL,
        allowed,
    )
    assert seen == []


def test_on_snapshot_without_a_snapshot_is_refused_at_decoration() -> None:
    with pytest.raises(ConfigurationError, match="snapshot=NEVER"):

        @change_stream("orders", "shop")
        class Orders:
            @on_snapshot
            def copied(self, event: ChangeEvent) -> None:
                pass

        stream_spec(Orders)


# -- a crash in the middle of the copy, with writes going on ------------------------------------------


class _Writer:
    """Inserts, updates and deletes random documents of ``orders`` until stopped."""

    def __init__(self, collection: Any, seed: int) -> None:
        self._collection = collection
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.writes = 0

    def _run(self) -> None:
        next_id = 5_000
        while not self._stop.is_set():
            choice = self._random.random()
            key = self._random.randrange(next_id)
            if choice < 0.3:
                self._collection.insert_one({"_id": next_id, "qty": 0, "note": "new"})
                next_id += 1
            elif choice < 0.8:
                self._collection.update_one({"_id": key}, {"$inc": {"qty": 1}, "$set": {"by": "writer"}})
            else:
                self._collection.delete_one({"_id": key})
            self.writes += 1

    def __enter__(self) -> _Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start(uri: str, db: str, log: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(WORKER), uri, db, str(log), "250"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _rows(log: Path) -> list[list[Any]]:
    return [json_util.loads(line) for line in complete_lines(log)]


def _rebuild(rows: list[list[Any]]) -> dict[Any, Any]:
    """The collection as the delivered rows say, applied in order: snapshot rows and changes with
    a document as upserts, deletes as deletes (an update whose lookup found the document gone
    carries none, and its delete follows)."""
    state: dict[Any, Any] = {}
    for operation, key, document in rows:
        if operation == "delete":
            state.pop(key, None)
        elif document is not None:
            state[key] = document
    return state


def test_a_crash_in_the_middle_of_the_copy_loses_nothing(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, tmp_path: Path
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": i % 7, "sku": f"s{i}"} for i in range(5_000)])
    log = tmp_path / "rows.jsonl"
    with _Writer(orders, seed=7) as writer:
        first = _start(mongodb_uri, db_name, log)
        try:
            wait_until(lambda: log.exists() and len(_rows(log)) >= 1_200, timeout=60, what="part of the copy")
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(30)
        stored = checkpoint_doc(client, db_name, "orders")
        assert stored is not None and not stored["snapshot"]["done"]
        copied_before = stored["snapshot"]["copied"]
        assert 0 < copied_before < 5_000, "the kill did not land in the middle of the copy"

        second = _start(mongodb_uri, db_name, log)
        try:
            wait_until(
                lambda: (checkpoint_doc(client, db_name, "orders") or {}).get("snapshot", {}).get("done"),
                timeout=120,
                what="the copy to finish",
            )
            writer.stop()
            orders.insert_one({"_id": "end"})
            wait_until(lambda: any(row[1] == "end" for row in _rows(log)), timeout=60, what="the last write")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
    assert writer.writes > 100
    rows = _rows(log)
    snapshot_rows = [row for row in rows if row[0] == "snapshot"]
    # The restart went on from the saved progress: it repeated at most the chunk in flight.
    assert len(snapshot_rows) - len({row[1] for row in snapshot_rows}) <= 250
    assert _rebuild(rows) == {document["_id"]: document for document in orders.find()}


def test_match_stages_on_the_document_filter_the_copy_too(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i, "status": "A" if i % 3 else "B"} for i in range(12)])
    seen: list[Any] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, full_document="updateLookup")
    @pipeline([{"$match": {"fullDocument.status": "B"}}])
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append((event.operation_type, event.document_key["_id"]))

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: len(seen) == 4, what="the B documents")
        client[db_name].orders.insert_many([{"_id": 20, "status": "A"}, {"_id": 21, "status": "B"}])
        wait_until(lambda: len(seen) == 5, what="the B change")
    assert seen == [("snapshot", 0), ("snapshot", 3), ("snapshot", 6), ("snapshot", 9), ("insert", 21)]


@pytest.mark.parametrize(
    ("query", "documents"),
    [
        ({"fullDocument.status": "A"}, {"status": "A"}),
        ({"documentKey._id": {"$gt": 5}}, {"_id": {"$gt": 5}}),
        (
            {"$or": [{"fullDocument.qty": {"$gte": 2}}, {"fullDocument.tags": "x"}]},
            {"$or": [{"qty": {"$gte": 2}}, {"tags": "x"}]},
        ),
        (
            {"$expr": {"$eq": [{"$mod": [{"$toHashedIndexKey": "$documentKey._id"}, 4]}, 1]}},
            {"$expr": {"$eq": [{"$mod": [{"$toHashedIndexKey": "$_id"}, 4]}, 1]}},
        ),
        ({"operationType": {"$in": ["insert"]}}, None),
        ({"fullDocument.status": "A", "ns.coll": "orders"}, None),
        ({"$or": [{"fullDocument.status": "A"}, {"operationType": "delete"}]}, None),
        ({"$expr": {"$eq": ["$updateDescription.updatedFields.qty", 1]}}, None),
        ({"fullDocument": {"$exists": True}}, None),
    ],
)
def test_document_query_reads_the_document_or_gives_up(query: dict[str, Any], documents: Any) -> None:
    from flowwarden.mongo.initial_copy import document_query

    assert document_query(query) == documents


def test_ids_of_every_type_are_copied_once_in_mongodbs_order(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    from bson import ObjectId

    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    ids: list[Any] = [None, 1, 2.5, 3, "a", "b", {"k": 1}, b"\x01", oid, False, True]
    client[db_name].orders.insert_many([{"_id": key} for key in ids])
    seen: list[Any] = []
    # A chunk of 2: every chunk boundary crosses from one type to the next somewhere.
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL, seen, snapshot_chunk_size=2)]):
        wait_until(lambda: len(seen) == len(ids), what="every document")
    assert [key for _, key, _ in seen] == ids


# -- the copy is bounded at its start -------------------------------------------------------------


class _Inserter:
    """Inserts ``{"_id": first}``, ``first + 1``... one at a time, once ``start`` is set, until
    stopped or ``cap`` documents (so that a copy chasing it ends too)."""

    def __init__(self, collection: Any, first: int, start: threading.Event, cap: int = 4_000) -> None:
        self._collection = collection
        self._first = first
        self._start = start
        self._cap = cap
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.count = 0

    def _run(self) -> None:
        if not self._start.wait(60):
            return
        while not self._stop.is_set() and self.count < self._cap:
            self._collection.insert_one({"_id": self._first + self.count})
            self.count += 1

    def inserted(self) -> list[int]:
        return list(range(self._first, self._first + self.count))

    def __enter__(self) -> _Inserter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def test_the_copy_ends_at_what_existed_when_it_began_while_inserts_outrun_it(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(150)])
    seen: list[tuple[str, Any]] = []
    copying = threading.Event()
    inserter = _Inserter(orders, 150, copying)

    @change_stream(
        "orders",
        db_name,
        name="orders",
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=25,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=100, save_interval_seconds=0.2)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            if not copying.is_set():
                copying.set()
                # The first row waits for 200 inserts: the copy has all of them ahead of it.
                wait_until(lambda: inserter.count >= 200, timeout=60, what="200 inserts during the copy")
            time.sleep(0.002)  # slower than the writer: it keeps inserting while the copy runs
            seen.append(("snapshot", event.document_key["_id"]))

        @on_insert
        def inserted(self, event: ChangeEvent) -> None:
            seen.append(("insert", event.document_key["_id"]))

    with running(mongodb_uri, [Orders]) as connector:
        with inserter:
            wait_until(
                lambda: (s := connector.status()["orders"].snapshot) is not None and s.done,
                timeout=120,
                what="the copy to end",
            )
        expected = inserter.inserted()
        wait_until(lambda: len(seen) >= 150 + len(expected), timeout=60, what="every insert as a change")
    assert len(expected) >= 200
    assert seen[:150] == [("snapshot", i) for i in range(150)]
    assert seen[150:] == [("insert", key) for key in expected]
    stored = checkpoint_doc(client, db_name, "orders")
    assert stored is not None and stored["snapshot"]["endId"] == 149 and stored["snapshot"]["copied"] == 150


# -- crashes in the middle of the copy, with a batch method ----------------------------------------

BATCH_WORKER = Path(__file__).with_name("snapshot_batch_worker.py")


def _start_batches(
    uri: str, db: str, log: Path, *, kind: str, chunk: int, max_events: int, kill_at: int, delay: float
) -> subprocess.Popen[str]:
    args = [uri, db, str(log), kind, str(chunk), str(max_events), str(kill_at), str(delay)]
    process = subprocess.Popen(
        [sys.executable, str(BATCH_WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr.read() if process.stderr else ""
    return process


def _batches(log: Path) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The batches the worker recorded, in order: (batch id, [(operation, _id), ...])."""
    lines = [json_util.loads(line) for line in complete_lines(log)]
    return [(batch_id, [(operation, key) for operation, key in rows]) for batch_id, rows in lines]


def _snapshot_done(client: pymongo.MongoClient[Any], db: str) -> bool:
    return bool((checkpoint_doc(client, db, "orders") or {}).get("snapshot", {}).get("done"))


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, process.stderr.read() if process.stderr else ""


@pytest.mark.slow
def test_the_bound_survives_a_kill_in_the_middle_of_the_copy(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, tmp_path: Path
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(300)])
    log = tmp_path / "batches.jsonl"
    worker = {"kind": "batch", "chunk": 20, "max_events": 20, "delay": 0.05}
    first_batch = threading.Event()
    with _Inserter(orders, 300, first_batch) as inserter:
        first = _start_batches(mongodb_uri, db_name, log, kill_at=3, **worker)  # type: ignore[arg-type]
        wait_until(lambda: _batches(log), timeout=60, what="the first batch")
        first_batch.set()  # the bound was stored before the first batch: inserts come after it
        assert first.wait(60) == -signal.SIGKILL
        stored = checkpoint_doc(client, db_name, "orders")
        assert stored is not None and not stored["snapshot"]["done"]
        assert stored["snapshot"]["endId"] == 299
        # The restart finds documents past the bound, more coming as it copies.
        wait_until(lambda: inserter.count >= 200, timeout=60, what="200 inserts")
        second = _start_batches(mongodb_uri, db_name, log, kill_at=0, **worker)  # type: ignore[arg-type]
        try:
            wait_until(lambda: _snapshot_done(client, db_name), timeout=120, what="the copy to end")
            inserter.stop()
            expected = set(inserter.inserted())
            wait_until(
                lambda: {key for _, rows in _batches(log) for op, key in rows if op == "insert"} >= expected,
                timeout=60,
                what="every insert as a change",
            )
        finally:
            _stop(second)
    rows = [row for _, batch in _batches(log) for row in batch]
    assert {key for op, key in rows if op == "snapshot"} == set(range(300))
    assert {key for op, key in rows if op == "insert"} == expected
    stored = checkpoint_doc(client, db_name, "orders")
    assert stored is not None and stored["snapshot"]["endId"] == 299 and stored["snapshot"]["done"]


class _RangeWriter:
    """Deletes documents and inserts new ones between them (``_id`` k + 0.5) in ``orders``'s
    first ``size`` _ids, at random, until stopped, unless paused; keeps what it deleted and
    inserted."""

    def __init__(self, collection: Any, size: int, seed: int) -> None:
        self._collection = collection
        self._size = size
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._going = threading.Event()
        self._going.set()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.deleted: set[Any] = set()
        self.inserted: set[Any] = set()

    def pause(self) -> None:
        """Return once the writer wrote its last write until :meth:`resume`."""
        self._idle.clear()
        self._going.clear()
        assert self._idle.wait(30), "the writer did not pause"

    def resume(self) -> None:
        self._going.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._going.is_set():
                self._idle.set()
                self._going.wait()
                continue
            key = self._random.randrange(self._size)
            if self._random.random() < 0.5:
                self.delete(key)
            else:
                self.insert(key + 0.5)
            self._stop.wait(0.005)

    def delete(self, key: Any) -> None:
        if self._collection.delete_one({"_id": key}).deleted_count:
            self.deleted.add(key)

    def insert(self, key: Any) -> None:
        if key not in self.inserted and key not in self.deleted:
            self._collection.insert_one({"_id": key})
            self.inserted.add(key)

    def __enter__(self) -> _RangeWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._going.set()
        self._thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["batch", pytest.param("dataframe", marks=pytest.mark.spark)], ids=["on_batch", "on_dataframe"]
)
def test_a_snapshot_batch_handed_over_again_after_a_kill_keeps_its_id_and_its_id_range(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, tmp_path: Path, kind: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(200)])
    log = tmp_path / "batches.jsonl"
    # Chunks of 30 read for batches of 10: a chunk must still be one batch.
    worker = {"kind": kind, "chunk": 30, "max_events": 10, "delay": 0.05}
    with _RangeWriter(orders, 200, seed=11) as writer:
        first = _start_batches(mongodb_uri, db_name, log, kill_at=4, **worker)  # type: ignore[arg-type]
        assert first.wait(120) == -signal.SIGKILL, first.stderr.read() if first.stderr else ""
        killed_id, killed_rows = _batches(log)[-1]
        killed = sorted(key for _, key in killed_rows)
        # Between the two runs, inside the batch whose progress was not saved: every other
        # document goes, one new comes between two others, and nothing else changes until the
        # batch comes again (a chunk read again as "the next max_events" would reach past it).
        writer.pause()
        for key in killed[1::2]:
            writer.delete(key)
        writer.insert(killed[0] + 0.25)
        delivered_before = len(_batches(log))
        second = _start_batches(mongodb_uri, db_name, log, kill_at=0, **worker)  # type: ignore[arg-type]
        try:
            wait_until(lambda: len(_batches(log)) > delivered_before, timeout=60, what="a batch again")
            writer.resume()
            wait_until(lambda: _snapshot_done(client, db_name), timeout=120, what="the copy to end")
            writer.stop()
            orders.insert_one({"_id": "end"})
            wait_until(
                lambda: any(key == "end" for _, rows in _batches(log) for _, key in rows),
                timeout=60,
                what="the last insert",
            )
        finally:
            _stop(second)

    batches = _batches(log)
    snapshot = [
        (batch_id, {key for _, key in rows}) for batch_id, rows in batches if rows[0][0] == "snapshot"
    ]
    # The batch the kill interrupted came first after the restart, under the same id.
    assert next(b for b, rows in batches[delivered_before:] if rows[0][0] == "snapshot") == killed_id
    # A batch's _id range: after the end of the batch before it, through its own end (its
    # first delivery's highest _id: where its chunk was planned to end).
    ends: dict[str, Any] = {}
    for batch_id, keys in snapshot:
        ends.setdefault(batch_id, max(keys))
    order = sorted(ends, key=ends.__getitem__)
    ranges = {batch_id: (ends[order[i - 1]] if i else -1, ends[batch_id]) for i, batch_id in enumerate(order)}
    for batch_id, keys in snapshot:
        low, high = ranges[batch_id]
        assert all(low < key <= high for key in keys), f"{batch_id} holds rows outside ({low}, {high}]"
    under: dict[Any, set[str]] = {}
    for batch_id, keys in snapshot:
        for key in keys:
            under.setdefault(key, set()).add(batch_id)
    assert [key for key, ids in under.items() if len(ids) > 1] == []
    # Handed over again: what it held, less what was deleted since, plus what was inserted since.
    deliveries: dict[str, list[set[Any]]] = {}
    for batch_id, keys in snapshot:
        deliveries.setdefault(batch_id, []).append(keys)
    again = {batch_id: keys for batch_id, keys in deliveries.items() if len(keys) > 1}
    assert killed_id in again
    for batch_id, (before, *later) in again.items():
        for after in later:
            assert before - after <= writer.deleted, batch_id
            assert after - before <= writer.inserted, batch_id
    before, after = again[killed_id][:2]
    assert set(killed[1::2]) <= before - after and killed[0] + 0.25 in after - before
    # Nothing lost: the rows, applied in order, are the collection.
    state: set[Any] = set()
    for _, rows in batches:
        for operation, key in rows:
            (state.discard if operation == "delete" else state.add)(key)
    assert state == {document["_id"] for document in orders.find()}


class _HeldProgressStore(InMemoryCheckpointStore):
    """An in-memory store called in a worker thread, as a store doing I/O is, whose snapshot
    progress writes after the first one hang until released: a write the server holds."""

    nonblocking = False

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Event()
        self.release = threading.Event()
        self._writes = 0

    def _hold(self) -> None:
        self._writes += 1
        if self._writes > 1:
            self.held.set()
            self.release.wait(60)

    def save_snapshot(self, stream_id: str, progress: Any, epoch: int) -> Any:
        self._hold()
        return super().save_snapshot(stream_id, progress, epoch)

    def save_incremental(self, stream_id: str, progress: Any, epoch: int) -> Any:
        self._hold()
        return super().save_incremental(stream_id, progress, epoch)


@pytest.mark.parametrize("copy", ["initial", "requested"])
def test_a_stop_does_not_wait_for_a_snapshot_progress_write_the_store_holds(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, copy: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(30)])
    store = _HeldProgressStore()
    seen: list[Any] = []
    if copy == "initial":
        orders = _rows_class(db_name, Snapshot.INITIAL, seen, snapshot_chunk_size=10)
    else:

        @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
        @checkpoint(save_every_n=1, save_interval_seconds=0.1)
        class Orders:
            @on_change
            def changed(self, event: ChangeEvent) -> None:
                seen.append(event.operation_type)

        orders = Orders
    connector = Connector(mongodb_uri, [orders], checkpoint_store=store)
    connector.start()
    try:
        if copy == "requested":
            wait_until(lambda: connector.status()["orders"].state is StreamState.RUNNING, what="RUNNING")
            connector.request_snapshot("orders", chunk_size=10)
        assert store.held.wait(30), "no progress write was held"
        connector.stop(timeout=20)  # TimeoutError while the stop waits for the held write
        assert connector.status()["orders"].state is StreamState.STOPPED
    finally:
        store.release.set()


# -- the copy's progress and its lines, step by step, in this process -----------------------------


class _RecordingStore(InMemoryCheckpointStore):
    """An in-memory store that keeps every snapshot progress written to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[tuple[str, SnapshotProgress]] = []

    def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> Any:
        self.saved.append((stream_id, progress))
        return super().save_snapshot(stream_id, progress, epoch)


def _copied(connector: Connector, stream: str = "orders") -> bool:
    progress = connector.status()[stream].snapshot
    return progress is not None and progress.done


def _steps(saved: list[tuple[str, SnapshotProgress]]) -> list[tuple[Any, ...]]:
    return [(stream, p.chunk, p.chunk_end, p.last_id, p.copied, p.done) for stream, p in saved]


def _snapshot_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "flowwarden.runtime.snapshot" and record.levelno == logging.INFO
    ]


def test_each_chunk_is_stored_as_planned_then_as_finished_and_the_copy_as_done(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(25)])
    store = _RecordingStore()
    seen: list[Any] = []
    began = utc_now()
    with caplog.at_level(logging.INFO, logger="flowwarden.runtime.snapshot"):
        with running(
            mongodb_uri,
            [_rows_class(db_name, Snapshot.INITIAL, seen, snapshot_chunk_size=10)],
            checkpoint_store=store,
        ) as connector:
            wait_until(lambda: _copied(connector), what="the copy")
    none = MinKey()
    assert _steps(store.saved) == [
        ("orders", 0, none, none, 0, False),  # the position and the plan, before any row
        ("orders", 1, 9, none, 0, False),  # chunk 1 planned: its last _id
        ("orders", 1, none, 9, 10, False),  # and finished
        ("orders", 2, 19, 9, 10, False),
        ("orders", 2, none, 19, 20, False),
        ("orders", 3, 24, 19, 20, False),
        ("orders", 3, none, 24, 25, False),
        ("orders", 3, none, 24, 25, True),
    ]
    first = store.saved[0][1]
    assert first.namespaces == (f"{db_name}.orders",) and first.namespace == f"{db_name}.orders"
    assert first.end_id == 24 and first.total == 25
    assert first.started_at is not None and began <= first.started_at <= utc_now()
    assert all(p.token == first.token and p.started_at == first.started_at for _, p in store.saved)
    stored = store.load("orders")
    assert stored is not None and stored.last_seen_token == first.token
    assert seen == [("snapshot", i, {"_id": i}) for i in range(25)]
    assert _snapshot_lines(caplog) == [
        f"stream orders: initial snapshot of {db_name}.orders (about 25 document(s)); "
        f"changes will follow from {describe_token(first.token)}",
        f"stream orders: initial snapshot done: 25 document(s); "
        f"streaming changes after {describe_token(first.token)}",
    ]
    assert {record.stream for record in caplog.records if record.name == "flowwarden.runtime.snapshot"} == {
        "orders"
    }


def _refusing_batches(
    db: str, batches: list[tuple[str, list[Any]]], refuse: threading.Event, hold: threading.Event
) -> type:
    @change_stream(
        "orders", db, name="orders", snapshot=Snapshot.INITIAL, snapshot_chunk_size=10, max_await_time_ms=50
    )
    @retry_policy(max_attempts=10_000, initial_delay_seconds=0.02, max_delay_seconds=0.02, jitter=0)
    class Orders:
        @on_batch(max_events=10, max_wait_seconds=0.05)
        def handle(self, events: list[ChangeEvent], ctx: StreamContext) -> None:
            keys = [event.document_key["_id"] for event in events]
            assert ctx.batch_id is not None
            batches.append((ctx.batch_id, keys))
            hold.wait(30)
            if refuse.is_set() and keys[0] == 10:
                raise ValueError("not yet")

    return Orders


def test_a_copy_stopped_in_a_chunk_hands_that_chunk_over_again_then_goes_on(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(25)])
    store = _RecordingStore()
    batches: list[tuple[str, list[Any]]] = []
    refuse, hold = threading.Event(), threading.Event()
    refuse.set()
    hold.set()
    orders = _refusing_batches(db_name, batches, refuse, hold)
    with running(mongodb_uri, [orders], checkpoint_store=store):
        wait_until(lambda: sum(keys[0] == 10 for _, keys in batches) >= 2, what="chunk 2 refused")
    # The stop came while chunk 2 was retried: it stays planned, not finished.
    stored = store.load("orders")
    assert stored is not None and stored.snapshot is not None
    interrupted = stored.snapshot
    assert (interrupted.chunk, interrupted.chunk_end, interrupted.last_id, interrupted.copied) == (
        2,
        19,
        9,
        10,
    )
    assert not interrupted.done
    token = interrupted.token["_data"]
    assert batches[0] == (f"snapshot:{token}:1", list(range(10)))
    assert all(batch == (f"snapshot:{token}:2", list(range(10, 20))) for batch in batches[1:])

    batches.clear()
    refuse.clear()
    hold.clear()
    with caplog.at_level(logging.INFO, logger="flowwarden.runtime.snapshot"):
        with running(mongodb_uri, [orders], checkpoint_store=store) as connector:
            wait_until(lambda: batches, what="the chunk handed over again")
            during = connector.status()["orders"].snapshot
            hold.set()
            wait_until(lambda: _copied(connector), what="the copy")
    # The same number, the same _id range, read whole again; then the copy goes on after it.
    assert batches == [
        (f"snapshot:{token}:2", list(range(10, 20))),
        (f"snapshot:{token}:3", list(range(20, 25))),
    ]
    assert during is not None and (during.chunk, during.copied) == (2, 10)
    assert _steps(store.saved)[-4:] == [
        ("orders", 2, MinKey(), 19, 20, False),
        ("orders", 3, 24, 19, 20, False),
        ("orders", 3, MinKey(), 24, 25, False),
        ("orders", 3, MinKey(), 24, 25, True),
    ]
    assert all(p.token == interrupted.token for _, p in store.saved)
    assert _snapshot_lines(caplog)[0] == (
        f"stream orders: continuing the initial snapshot after 10 document(s), in {db_name}.orders, "
        "handing chunk 2 over again"
    )

    # A copy stopped between two chunks plans the next one, and says so without "again".
    between = next(p for _, p in store.saved if p.chunk == 1 and not p.pending)
    fresh = _RecordingStore()
    fresh.save_seen("orders", between.token, 0)
    fresh.save_snapshot("orders", between, 0)
    batches.clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flowwarden.runtime.snapshot"):
        with running(mongodb_uri, [orders], checkpoint_store=fresh) as connector:
            wait_until(lambda: _copied(connector), what="the copy")
    assert batches == [
        (f"snapshot:{token}:2", list(range(10, 20))),
        (f"snapshot:{token}:3", list(range(20, 25))),
    ]
    assert _snapshot_lines(caplog)[0] == (
        f"stream orders: continuing the initial snapshot after 10 document(s), in {db_name}.orders"
    )


def test_a_finished_copy_is_not_made_again_by_a_restart_or_a_checkpoint_without_one(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, fail_command: Any
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(3)])
    seen: list[Any] = []
    handler = _rows_class(
        db_name, Snapshot.INITIAL, seen, restart_initial_delay_seconds=0.05, restart_max_delay_seconds=0.1
    )
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: len(seen) == 3, what="the copy")
        # BadValue, no resumable label: the stream restarts in this process.
        fail_command(["getMore"], mode={"times": 2}, errorCode=2)
        wait_until(lambda: connector.status()["orders"].restarts >= 1, what="a restart")
        orders.insert_one({"_id": 3})
        wait_until(lambda: ("insert", 3, None) in seen, what="the change after the restart")
    assert [kind for kind, _, _ in seen] == ["snapshot"] * 3 + ["insert"]

    # A stream whose checkpoint was stored before its class asked for a snapshot streams on.
    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    class Streaming:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            pass

    store = InMemoryCheckpointStore()
    with running(mongodb_uri, [Streaming], checkpoint_store=store):
        wait_until(lambda: store.load("orders") is not None, what="a checkpoint without a snapshot")
    seen.clear()
    with running(mongodb_uri, [_rows_class(db_name, Snapshot.INITIAL, seen)], checkpoint_store=store) as c:
        orders.insert_one({"_id": 4})
        wait_until(lambda: seen, what="the change")
        assert c.status()["orders"].snapshot is None
    assert seen == [("insert", 4, None)]


def test_with_latest_the_copy_is_followed_by_the_changes_made_during_it(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(3)])
    seen: list[Any] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    @checkpoint(start_position=StartPosition.LATEST, save_every_n=1)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            if event.document_key["_id"] == 0:
                orders.insert_one({"_id": "during"})  # after T: a change, not a row
            seen.append(("snapshot", event.document_key["_id"]))

        @on_change
        def changed(self, event: ChangeEvent) -> None:
            seen.append((event.operation_type, event.document_key["_id"]))

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: ("insert", "during") in seen, what="the insert made during the copy")
    assert seen == [("snapshot", 0), ("snapshot", 1), ("snapshot", 2), ("insert", "during")]


def test_a_database_stream_over_no_collection_finishes_an_empty_copy(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Any] = []

    @change_stream(database=db_name, name="shop", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    class Shop:
        @on_change
        def changed(self, event: ChangeEvent) -> None:
            seen.append((event.operation_type, event.namespace[1]))

    with caplog.at_level(logging.INFO, logger="flowwarden.runtime.snapshot"):
        with running(mongodb_uri, [Shop]) as connector:
            wait_until(lambda: _copied(connector, "shop"), what="the copy")
            client[db_name].orders.insert_one({"_id": 1})
            wait_until(lambda: ("insert", "orders") in seen, what="the first change")
    progress = connector.status()["shop"].snapshot
    assert progress is not None and (progress.copied, progress.namespaces) == (0, ("",))
    assert seen == [("insert", "orders")]
    assert (
        "stream shop: initial snapshot of no collection (about 0 document(s))" in _snapshot_lines(caplog)[0]
    )


def test_a_document_the_copy_cannot_decode_is_dead_lettered_and_the_copy_goes_on(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many(
        [{"_id": i, "amount": Decimal128("666" if i == 2 else str(i))} for i in range(5)]
    )
    seen: list[Any] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    @retry_policy(on_exhausted=OnError.DEAD_LETTER)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            seen.append(event.document_key["_id"])

    async def run() -> None:
        async_client = pymongo.AsyncMongoClient(mongodb_uri, type_registry=TypeRegistry([PoisonDecimal()]))
        connector = Connector(async_client, [Orders])
        task = asyncio.create_task(connector.run_async())
        try:
            await wait_until_async(
                lambda: (s := connector.status()["orders"].snapshot) is not None and s.done, what="the copy"
            )
        finally:
            connector.stop()
            await task
            await async_client.close()

    asyncio.run(run())
    assert seen == [0, 1, 3, 4]
    (letter,) = client[db_name]["_fw_dlq"].find()
    assert letter["event"]["documentKey"] == {"_id": 2} and letter["event"]["operationType"] == "snapshot"
    assert letter["errorType"] == "bson.errors.InvalidBSON"


def test_concurrent_methods_copy_every_row_once_and_a_stop_in_a_row_leaves_its_chunk_to_the_next_run(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(10)])
    store = _RecordingStore()
    seen: list[int] = []
    refuse = threading.Event()
    refuse.set()
    started: set[int] = set()

    @change_stream(
        "orders",
        db_name,
        name="orders",
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=4,
        max_concurrency=3,
        max_await_time_ms=50,
    )
    @retry_policy(max_attempts=10_000, initial_delay_seconds=0.02, max_delay_seconds=0.02, jitter=0)
    class Orders:
        @on_snapshot
        async def copied(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"]
            started.add(key)
            # Chunks of 4 go three rows at a time: the first of each three waits for the others.
            others = {0: {1, 2}, 4: {5, 6}, 8: {9}}.get(key, set())
            await wait_until_async(lambda: others <= started, timeout=5, what="rows handed over together")
            if key == 6 and refuse.is_set():
                raise ValueError("not yet")
            seen.append(key)

    with running(mongodb_uri, [Orders], checkpoint_store=store):
        # Rows go three at a time: 4 and 5 beside the refused 6; 7 waits for the three.
        wait_until(lambda: 4 in seen and 5 in seen, what="the rows beside the refused one")
    stored = store.load("orders")
    assert stored is not None and stored.snapshot is not None
    # Chunk 2 (_id 4 to 7) was in hand when the stop came: planned, not finished.
    assert (stored.snapshot.chunk, stored.snapshot.chunk_end, stored.snapshot.copied) == (2, 7, 4)
    assert sorted(seen) == [0, 1, 2, 3, 4, 5]
    refuse.clear()
    seen.clear()
    with running(mongodb_uri, [Orders], checkpoint_store=store) as connector:
        wait_until(lambda: _copied(connector), what="the copy")
    assert sorted(seen) == [4, 5, 6, 7, 8, 9]  # the chunk in hand again, then the rest, once each


@pytest.mark.parametrize("concurrency", [1, 2])
def test_an_async_method_gets_as_many_rows_at_once_as_the_streams_concurrency(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, concurrency: int
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(6)])
    in_method: set[int] = set()
    together: list[int] = []
    seen: list[int] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        snapshot=Snapshot.INITIAL,
        max_concurrency=concurrency,
        max_await_time_ms=50,
    )
    class Orders:
        @on_snapshot
        async def copied(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"]
            in_method.add(key)
            together.append(len(in_method))
            await asyncio.sleep(0.02)  # the loop is free: any other row handed over runs meanwhile
            in_method.discard(key)
            seen.append(key)

    with running(mongodb_uri, [Orders]) as connector:
        wait_until(lambda: _copied(connector), what="the copy")
    assert sorted(seen) == list(range(6))
    assert max(together) == concurrency



def test_a_class_without_a_method_for_rows_copies_them_as_done_and_goes_on_to_its_changes(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(5)])
    deleted: list[int] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    class Deletions:
        @on_delete
        def gone(self, event: ChangeEvent) -> None:
            deleted.append(event.document_key["_id"])

    with running(mongodb_uri, [Deletions], metrics_port=0) as connector:
        wait_until(lambda: _copied(connector), what="the copy")
        client[db_name].orders.delete_one({"_id": 3})
        wait_until(lambda: deleted == [3], what="the delete after the copy")
        status = connector.status()["orders"]
    assert status.snapshot is not None and status.snapshot.copied == 5
    assert (status.restarts, status.last_error) == (0, None)
