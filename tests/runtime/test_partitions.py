"""Partitioned streams in the connector: ``@change_stream(partitions=N)``.

Each bucket is a stream of its own (checkpoint, handler instance, status); together they deliver
every event of the collection once, each document's events in order, across restarts while a
writer keeps writing, and with more buckets than the driver's default pool has connections; a
checkpoint stored under another layout stops the stream instead of starting it elsewhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, defaultdict
from typing import Any

import pymongo
import pytest
from bson import Timestamp

from flowwarden import (
    ChangeEvent,
    Connector,
    StartPosition,
    StreamState,
    change_stream,
    checkpoint,
    on_batch,
    on_change,
    stream_spec,
)
from flowwarden.config.spec import partition_specs
from flowwarden.errors import ConfigurationError
from flowwarden.mongo.buckets import bucket_stage, layout_conflict, partition_name
from helpers import running, wait_until, wait_until_async

from .handlers import recording_handler

DOCUMENTS = 30


def _collection_events(
    client: pymongo.MongoClient[Any], collection: Any, start: Timestamp, count: int
) -> list[dict[str, Any]]:
    """The first ``count`` events of ``collection`` from ``start``, read by one plain stream."""
    with collection.watch(start_at_operation_time=start, max_await_time_ms=100) as stream:
        return _read(stream, count, "the collection")


def _read(stream: Any, count: int, what: str) -> list[dict[str, Any]]:
    """The next ``count`` events of an open change stream; fails naming ``what`` if they do not
    all come within 60 s."""
    events: list[dict[str, Any]] = []

    def all_read() -> bool:
        while len(events) < count and (event := stream.try_next()) is not None:
            events.append(event)
        return len(events) >= count

    wait_until(all_read, timeout=60, what=f"{count} events of {what}")
    return events


class Writer:
    """Inserts, updates and deletes documents 0..DOCUMENTS-1 until stopped, counting writes."""

    def __init__(self, collection: Any) -> None:
        self.collection = collection
        self.writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        present: set[int] = set()
        step = 0
        while not self._stop.is_set():
            key = (step * 7) % DOCUMENTS
            if key not in present:
                self.collection.insert_one({"_id": key, "n": step})
                present.add(key)
            elif step % 5 == 0:
                self.collection.delete_one({"_id": key})
                present.discard(key)
            else:
                self.collection.update_one({"_id": key}, {"$set": {"n": step}})
            self.writes += 1
            step += 1

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_partitioned_stream_delivers_every_event_once_across_three_restarts_with_writes(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, needs_hashed_index_key: None
) -> None:
    collection = client[db_name].orders
    start: Timestamp = client.admin.command("ping")["operationTime"]
    delivered: list[tuple[str, dict[str, Any]]] = []  # (bucket stream, event) in delivery order
    lock = threading.Lock()

    @change_stream("orders", db_name, name="orders", partitions=3, max_await_time_ms=50)
    @checkpoint(
        save_every_n=7, save_interval_seconds=0.2, start_position=StartPosition.AT_TIME, start_at=start
    )
    class Orders:
        @on_batch(max_events=10, max_wait_seconds=0.05)
        def handle(self, events: list[ChangeEvent], ctx: Any) -> None:
            with lock:
                delivered.extend((ctx.stream, event.raw) for event in events)

    def handled() -> int:
        with lock:
            return len(delivered)

    with Writer(collection) as writer:
        for run in range(4):  # the first run and three restarts, the writer writing throughout
            before = handled()
            with running(mongodb_uri, [Orders]) as connector:
                assert sorted(connector.status()) == [partition_name("orders", i, 3) for i in range(3)]
                wait_until(lambda before=before: handled() >= before + 40, what=f"events in run {run}")
    written = writer.writes
    with running(mongodb_uri, [Orders]):
        wait_until(lambda: handled() >= written, what="every written event")

    expected = _collection_events(client, collection, start, written)
    tokens = [event["_id"]["_data"] for _, event in delivered]
    assert len(tokens) == len(set(tokens)), "an event was delivered twice"
    assert set(tokens) == {event["_id"]["_data"] for event in expected}

    # Each document's events came in stream order, all from one bucket.
    order = {event["_id"]["_data"]: index for index, event in enumerate(expected)}
    per_document: dict[Any, list[tuple[str, int]]] = defaultdict(list)
    for stream, event in delivered:
        per_document[event["documentKey"]["_id"]].append((stream, order[event["_id"]["_data"]]))
    assert len(per_document) == DOCUMENTS
    for key, seen in per_document.items():
        assert len({stream for stream, _ in seen}) == 1, f"document {key} was split over buckets"
        positions = [position for _, position in seen]
        assert positions == sorted(positions), f"document {key}'s events came out of order"
    # Each bucket holds what the server's own bucket filter keeps, and every bucket had events.
    for index in range(3):
        name = partition_name("orders", index, 3)
        with collection.watch(
            [bucket_stage(index, 3)], start_at_operation_time=start, max_await_time_ms=100
        ) as stream:
            mine = sum(1 for s, _ in delivered if s == name)
            assert mine > 0
            bucket = [event["_id"]["_data"] for event in _read(stream, mine, f"bucket {index}")]
        assert bucket == [event["_id"]["_data"] for s, event in delivered if s == name]
        document = client[db_name]["_fw_checkpoints"].find_one({"_id": name})
        assert document is not None and document["lastProcessedToken"]["_data"] == bucket[-1]


@pytest.mark.parametrize(
    ("partitions", "documents"), [(128, 1000), pytest.param(256, 3000, marks=pytest.mark.slow)]
)
def test_more_buckets_than_the_drivers_default_pool_deliver_every_event_once(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    needs_hashed_index_key: None,
    partitions: int,
    documents: int,
) -> None:
    # Each bucket's getMore holds a connection while it waits: more buckets than the driver's
    # default maxPoolSize (100), on a URI that sets none.
    delivered: Counter[int] = Counter()
    lock = threading.Lock()

    @change_stream("orders", db_name, name="orders", partitions=partitions)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            with lock:
                delivered[event.raw["documentKey"]["_id"]] += 1

    def handled() -> int:
        with lock:
            return sum(delivered.values())

    with running(mongodb_uri, [Orders], progress_interval=0) as connector:
        assert len(connector.status()) == partitions
        client[db_name].orders.insert_many([{"_id": i} for i in range(documents)])
        wait_until(lambda: handled() >= documents, timeout=90, what=f"{documents} events")
        assert all(s.state is StreamState.RUNNING for s in connector.status().values())
    assert delivered == Counter(range(documents))


async def test_a_client_with_one_connection_beyond_the_buckets_delivers_every_event_once(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, needs_hashed_index_key: None
) -> None:
    # The smallest pool the connector accepts: every bucket's getMore holds a connection, and the
    # openings and checkpoint saves of all of them share the one left over.
    partitions, documents = 8, 200
    handler, seen = recording_handler(db_name, stream={"partitions": partitions})
    given = pymongo.AsyncMongoClient(mongodb_uri, maxPoolSize=partitions + 1)
    connector = Connector(given, [handler])
    task = asyncio.create_task(connector.run_async())
    try:
        await wait_until_async(
            lambda: all(s.state is StreamState.RUNNING for s in connector.status().values()),
            what="every bucket open",
        )
        client[db_name].orders.insert_many([{"_id": i} for i in range(documents)])
        await wait_until_async(lambda: len(seen) >= documents, what=f"{documents} events")
    finally:
        connector.stop()
        await task
        await given.close()
    assert sorted(seen) == [("insert", i) for i in range(documents)]


@pytest.mark.parametrize(("first", "then"), [(2, 3), (3, 2), (1, 2), (2, 1)])
def test_a_checkpoint_of_another_layout_stops_the_stream(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    needs_hashed_index_key: None,
    first: int,
    then: int,
) -> None:
    def handler_class(partitions: int) -> type:
        @change_stream("orders", db_name, name="orders", partitions=partitions, max_await_time_ms=50)
        @checkpoint(save_interval_seconds=0.1)
        class Orders:
            @on_change
            def handle(self, event: ChangeEvent) -> None:
                pass

        return Orders

    checkpoints = client[db_name]["_fw_checkpoints"]
    with running(mongodb_uri, [handler_class(first)]) as connector:
        names = sorted(connector.status())
        wait_until(lambda: checkpoints.count_documents({}) == first, what="the first layout's checkpoints")
    stored = {document["_id"]: document for document in checkpoints.find()}

    connector = Connector(mongodb_uri, [handler_class(then)])
    connector.start()
    try:
        wait_until(
            lambda: all(s.state is StreamState.FAILED for s in connector.status().values()),
            what="every bucket to refuse the layout",
        )
        for name, error in connector.stream_errors().items():
            assert isinstance(error, ConfigurationError) and error.stream == name
            held = "without partitions" if first == 1 else f"with partitions={first}"
            assert f"partitions={then}" in str(error) and held in str(error)
    finally:
        connector.stop()
    # Nothing was written for the refused layout, and the stored positions did not move.
    assert {document["_id"]: document for document in checkpoints.find()} == stored
    assert sorted(stored) == names


def test_buckets_are_streams_of_their_own_named_after_the_class_stream() -> None:
    @change_stream("orders", "shop", partitions=4, operation_types=["insert"])
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            pass

    spec = stream_spec(Orders)
    parts = partition_specs(spec)
    assert [part.name for part in parts] == ["Orders[0/4]", "Orders[1/4]", "Orders[2/4]", "Orders[3/4]"]
    for index, part in enumerate(parts):
        # The bucket filter comes first, then the class's own stages unchanged.
        assert part.pipeline == (bucket_stage(index, 4), *spec.pipeline)
        assert part.stream.name == "Orders" and part.handler_class is Orders


def test_an_unpartitioned_stream_is_run_as_it_is() -> None:
    @change_stream("orders", "shop")
    class Plain:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            pass

    assert partition_specs(stream_spec(Plain)) == [stream_spec(Plain)]


@pytest.mark.parametrize(
    ("count", "stored", "conflict"),
    [
        (1, [], None),
        (1, ["orders", "other[0/2]"], None),
        (3, ["orders[0/3]", "orders[2/3]", "orders-archive"], None),
        (2, ["orders"], "without partitions"),
        (1, ["orders[0/4]", "orders[1/4]"], "with partitions=4"),
        (4, ["orders[0/2]", "orders[0/3]"], "with partitions=2 and with partitions=3"),
        (2, ["orders[x/2]", "ordersX[0/3]"], None),
    ],
)
def test_layout_conflicts_name_what_is_stored(count: int, stored: list[str], conflict: str | None) -> None:
    found = layout_conflict("orders", count, stored)
    if conflict is None:
        assert found is None
    else:
        assert found is not None and conflict in found and f"partitions={count}" in found


@pytest.mark.parametrize("partitions", [0, 257, "two"])
def test_partitions_out_of_range_is_refused_at_decoration(partitions: Any) -> None:
    with pytest.raises(ConfigurationError, match="partitions"):

        @change_stream("orders", "shop", partitions=partitions)
        class Orders:
            @on_change
            def handle(self, event: ChangeEvent) -> None:
                pass
