"""Where a stream starts and resumes: restarts, start positions, the lastSeen token."""

from __future__ import annotations

from flowwarden import (
    ChangeEvent,
    StartPosition,
    StreamState,
    change_stream,
    checkpoint,
    on_batch,
    pipeline,
    token_cluster_time,
)
from flowwarden.events import token_datetime
from flowwarden.mongo.positions import oplog_edge
from helpers import checkpoint_doc, running, wait_until

from .handlers import recording_handler


def inserted(ids: range | list[int]) -> list[tuple[str, int]]:
    return [("insert", i) for i in ids]


def test_first_run_saves_its_position_before_any_event(mongodb_uri, client, db_name):
    handler, _ = recording_handler(db_name, save_interval_seconds=0)
    with running(mongodb_uri, [handler]) as connector:
        doc = wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        assert doc["lastSeenToken"]["_data"]
        assert doc.get("lastProcessedToken") is None
        assert connector.status()["orders"].state == StreamState.RUNNING


def test_restart_after_clean_stop_redelivers_nothing(mongodb_uri, client, db_name):
    orders = client[db_name]["orders"]
    handler, seen = recording_handler(db_name, save_every_n=1000, save_interval_seconds=60)
    with running(mongodb_uri, [handler]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(50)])
        wait_until(lambda: len(seen) == 50, what="50 events")
    # save_every_n=1000 and a 60 s heartbeat: only the graceful stop's flush saved these.
    doc = checkpoint_doc(client, db_name, "orders")
    assert doc["eventsProcessed"] == 50
    orders.insert_many([{"_id": i} for i in range(50, 80)])
    again, seen_again = recording_handler(db_name)
    with running(mongodb_uri, [again]):
        # A marker written after everything else: the stream is in order, so once it arrives any
        # redelivered event would already have arrived before it.
        orders.insert_one({"_id": "marker"})
        wait_until(lambda: ("insert", "marker") in seen_again, what="the marker")
    assert seen_again == [*inserted(range(50, 80)), ("insert", "marker")]


def test_latest_ignores_the_checkpoint(mongodb_uri, client, db_name):
    orders = client[db_name]["orders"]
    first, _ = recording_handler(db_name)
    with running(mongodb_uri, [first]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
    orders.insert_many([{"_id": i} for i in range(10)])  # while stopped
    latest, seen = recording_handler(db_name, start_position=StartPosition.LATEST)
    with running(mongodb_uri, [latest]) as connector:
        # RUNNING means the change stream is open: what is written from now on is delivered.
        wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING)
        orders.insert_one({"_id": 100})
        # The ten written while stopped come before it in the stream: had the stream started at
        # the checkpoint, they would have arrived first.
        wait_until(lambda: ("insert", 100) in seen, what="the new event")
    assert seen == inserted([100])


def test_earliest_starts_at_the_oldest_oplog_entry(mongodb_uri, client, db_name):
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i} for i in range(5)])
    handler, seen = recording_handler(db_name, start_position=StartPosition.EARLIEST)
    with running(mongodb_uri, [handler]):
        wait_until(lambda: len(seen) >= 5, what="the events written before the first start")
    assert seen[:5] == inserted(range(5))


def test_at_time_starts_at_start_at(mongodb_uri, client, db_name, next_server_second):
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i} for i in range(3)])
    cut = next_server_second()  # start_at is floored to its second
    orders.insert_many([{"_id": i} for i in range(3, 6)])
    handler, seen = recording_handler(db_name, start_position=StartPosition.AT_TIME, start_at=cut)
    with running(mongodb_uri, [handler]):
        # 0, 1 and 2 come before 3 in the oplog: had the stream started too early, they would
        # have arrived first.
        wait_until(lambda: ("insert", 5) in seen, what="the events after start_at")
    assert seen == inserted(range(3, 6))


def test_filtered_idle_stream_advances_last_seen_and_restart_skips_the_filtered_writes(
    mongodb_uri, client, db_name
):
    orders = client[db_name]["orders"]
    handler, seen = recording_handler(db_name, save_interval_seconds=0.1)
    handler = pipeline([{"$match": {"fullDocument.keep": True}}])(handler)
    with running(mongodb_uri, [handler]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i, "keep": False} for i in range(300)])
        newest = oplog_edge(client, -1)
        wait_until(
            lambda: token_cluster_time(checkpoint_doc(client, db_name, "orders")["lastSeenToken"]) >= newest,
            what="lastSeen to pass the filtered writes",
        )
    assert seen == []
    doc = checkpoint_doc(client, db_name, "orders")
    assert doc.get("lastProcessedToken") is None
    assert token_cluster_time(doc["lastSeenToken"]) >= newest


def test_a_caught_up_batch_stream_moves_last_seen_on_while_other_collections_are_written(
    mongodb_uri, client, db_name
):
    batches: list[list[int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=100, max_wait_seconds=0.1)
        def handle(self, events: list[ChangeEvent]) -> None:
            batches.append([e.document_key["_id"] for e in events])

    with running(mongodb_uri, [Batches]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name]["orders"].insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: checkpoint_doc(client, db_name, "orders").get("eventsProcessed") == 5)
        processed = checkpoint_doc(client, db_name, "orders")["lastProcessedToken"]
        # The watched collection is quiet from here; the rest of the database is written.
        client[db_name]["elsewhere"].insert_many([{"_id": i} for i in range(50)])
        newest = oplog_edge(client, -1)
        wait_until(
            lambda: token_cluster_time(checkpoint_doc(client, db_name, "orders")["lastSeenToken"]) >= newest,
            what="the stored lastSeen to pass the writes elsewhere",
        )
        status = connector.status()["orders"]
        assert status.last_seen_time is not None and status.last_seen_time >= token_datetime(
            checkpoint_doc(client, db_name, "orders")["lastSeenToken"]
        )
    assert batches == [list(range(5))]
    assert checkpoint_doc(client, db_name, "orders")["lastProcessedToken"] == processed
