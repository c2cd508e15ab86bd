"""Failures: lost history, dropped connections, server errors, failing handlers, invalidation."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import pymongo
import pytest
from bson.codec_options import TypeRegistry
from bson.decimal128 import Decimal128
from pymongo import monitoring

from flowwarden import (
    ChangeEvent,
    Connector,
    HandlerError,
    HistoryLostError,
    OnError,
    OnHistoryLost,
    StreamInvalidatedError,
    StreamState,
    change_stream,
    checkpoint,
    dead_letter_queue,
    event_filter,
    on_batch,
    on_change,
    retry_policy,
)
from flowwarden.checkpoints import Checkpoint, InMemoryCheckpointStore
from flowwarden.events import token_cluster_time
from flowwarden.runtime import opening
from flowwarden.runtime.opening import describe_token
from flowwarden.testing import EmbeddedReplicaSet
from helpers import checkpoint_doc, running, wait_until, wait_until_async

from .conftest import PoisonDecimal
from .handlers import recording_handler
from .test_raw_strings import ten_orders

# ------------------------------------------------------------------------------------------------
# history lost


def _server_message(client: pymongo.MongoClient, token: dict) -> str:
    """What the server says to a stream resuming after ``token``, without PyMongo's "full error"
    (whose cluster times differ from one reply to the next)."""
    with pytest.raises(pymongo.errors.OperationFailure) as refused:
        with client.shop.orders.watch(resume_after=token) as stream:
            stream.try_next()
    assert refused.value.code == 286
    return str(refused.value).split(", full error")[0]


def _oplog_edge(client: pymongo.MongoClient, direction: int) -> datetime:
    (entry,) = client.local["oplog.rs"].find().sort("$natural", direction).limit(1)
    return datetime.fromtimestamp(entry["ts"].time, timezone.utc)


def _audit_checks(client: pymongo.MongoClient, stored: dict, strategy: str, began: datetime) -> dict:
    """The audit entry, checked field by field."""
    audit = checkpoint_doc(client, "shop", "orders")["metadata"]["historyLost"]
    assert set(audit) == {"at", "strategy", "lostFrom", "lostTo", "serverMessage"}
    assert audit["strategy"] == strategy
    assert began <= audit["at"].replace(tzinfo=timezone.utc) <= datetime.now(timezone.utc)
    # Where the gap begins: the stored checkpoint's processed position, not its later lastSeen.
    assert audit["lostFrom"] == stored["lastProcessedTimestamp"] != stored.get("lastSeenTimestamp")
    assert audit["serverMessage"].startswith(_server_message(client, stored["lastProcessedToken"]))
    return audit


@contextmanager
def _lost_history(
    strategy: OnHistoryLost, **stream: Any
) -> Iterator[tuple[EmbeddedReplicaSet, pymongo.MongoClient, dict]]:
    """A replica set whose oplog keeps 20 entries, a stream that ran once and stopped, and 37
    writes since: the stream's checkpoint is no longer in the oplog."""
    with EmbeddedReplicaSet(oplog_max_events=20) as rs, pymongo.MongoClient(rs.uri) as client:
        orders = client.shop.orders
        first, _ = recording_handler("shop", on_history_lost=strategy, stream=stream)
        with running(rs.uri, [first]):
            wait_until(lambda: checkpoint_doc(client, "shop", "orders"), what="initial checkpoint")
            orders.insert_many([{"_id": i} for i in range(3)])
            wait_until(lambda: (checkpoint_doc(client, "shop", "orders") or {}).get("eventsProcessed") == 3)
            # A write elsewhere a second later: the idle stream's lastSeen moves past lastProcessed.
            time.sleep(1.1)
            client.shop.elsewhere.insert_one({})
            wait_until(
                lambda: (
                    (c := checkpoint_doc(client, "shop", "orders"))["lastSeenTimestamp"]
                    > c["lastProcessedTimestamp"]
                ),
                what="lastSeen a second past lastProcessed",
            )
        stored = checkpoint_doc(client, "shop", "orders")
        assert stored is not None
        orders.insert_many([{"_id": i} for i in range(3, 40)])  # 37 entries: the window keeps 20
        yield rs, client, stored


@pytest.mark.embedded_only
def test_history_lost_fail_names_the_window_and_leaves_the_checkpoint():
    with _lost_history(OnHistoryLost.FAIL) as (rs, client, stored):
        time.sleep(1.1)  # the newest oplog entry a second after the oldest: the two edges differ
        client.shop.orders.insert_one({"_id": "later"})
        handler, seen = recording_handler("shop", on_history_lost=OnHistoryLost.FAIL)
        with running(rs.uri, [handler]) as connector:
            wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
            error = connector.stream_errors()["orders"]
        assert isinstance(error, HistoryLostError)
        message = str(error)
        assert "orders" in message and "RESUME_FROM_OPLOG_START" in message and "RESUME_FROM_NOW" in message
        assert error.stream == "orders"
        assert error.checkpoint_time is not None
        assert error.checkpoint_time.replace(tzinfo=None) == stored["lastProcessedTimestamp"]
        # The window the server kept, both edges read from the oplog itself.
        assert (error.oplog_start, error.oplog_end) == (_oplog_edge(client, 1), _oplog_edge(client, -1))
        assert error.oplog_start < error.oplog_end
        assert error.server_message.startswith(_server_message(client, stored["lastProcessedToken"]))
        assert seen == []
        after = checkpoint_doc(client, "shop", "orders")
        assert after["lastProcessedToken"] == stored["lastProcessedToken"]


@pytest.mark.embedded_only
def test_history_lost_resume_from_oplog_start_replays_what_is_left():
    with _lost_history(OnHistoryLost.RESUME_FROM_OPLOG_START) as (rs, client, stored):
        handler, seen = recording_handler("shop", on_history_lost=OnHistoryLost.RESUME_FROM_OPLOG_START)
        began = datetime.now(timezone.utc).replace(microsecond=0)
        with running(rs.uri, [handler]):
            wait_until(lambda: ("insert", 39) in seen, what="the surviving oplog entries")
            oldest = _oplog_edge(client, 1)
            # A marker after the last one (written only now: it pushes one entry out of the
            # window): nothing is replayed twice before it.
            client.shop.orders.insert_one({"_id": 100})
            wait_until(lambda: ("insert", 100) in seen, what="the marker")
        # The window held 20..39; the record that the connector runs the stream (_fw_locks),
        # written as it starts, pushed 20 out.
        assert seen == [("insert", i) for i in range(21, 40)] + [("insert", 100)]
        audit = _audit_checks(client, stored, "RESUME_FROM_OPLOG_START", began)
        assert (
            audit["lostTo"].replace(tzinfo=timezone.utc) <= oldest
        )  # where it went on: the oldest entry kept


@pytest.mark.embedded_only
def test_history_lost_resume_from_oplog_start_goes_on_now_and_says_so_when_the_oplog_cannot_be_read(
    monkeypatch, caplog
):
    async def unreadable(client: Any, direction: int) -> None:  # a user without read on 'local'
        return None

    monkeypatch.setattr(opening, "oplog_edge_async", unreadable)
    with _lost_history(OnHistoryLost.RESUME_FROM_OPLOG_START) as (rs, client, _):
        handler, seen = recording_handler("shop", on_history_lost=OnHistoryLost.RESUME_FROM_OPLOG_START)
        with caplog.at_level(logging.INFO, logger="flowwarden.runtime.opening"):
            with running(rs.uri, [handler]):
                wait_until(
                    lambda: (
                        "historyLost" in (checkpoint_doc(client, "shop", "orders") or {}).get("metadata", {})
                    ),
                    what="the audit entry",
                )
                client.shop.orders.insert_one({"_id": 100})
                wait_until(lambda: ("insert", 100) in seen, what="the next event")
    assert seen == [("insert", 100)]  # what is left of the gap is not replayed: it went on now
    assert "stream orders: the oplog cannot be read; RESUME_FROM_OPLOG_START falls back to now" in [
        record.getMessage() for record in caplog.records if record.levelno == logging.WARNING
    ]


@pytest.mark.embedded_only
def test_history_lost_resume_from_now_skips_the_gap(caplog, far_from_utc):
    # Under a lease: its checkpoints carry an epoch.
    leader = {"deployment": "single_leader"}
    with _lost_history(OnHistoryLost.RESUME_FROM_NOW, **leader) as (rs, client, stored):
        handler, seen = recording_handler(
            "shop", on_history_lost=OnHistoryLost.RESUME_FROM_NOW, stream=leader
        )
        began = datetime.now(timezone.utc).replace(microsecond=0)
        with (
            caplog.at_level(logging.INFO, logger="flowwarden.runtime.opening"),
            running(rs.uri, [handler]) as connector,
        ):
            after = wait_until(
                lambda: (
                    "historyLost" in (c := checkpoint_doc(client, "shop", "orders") or {}).get("metadata", {})
                    and c
                ),
                what="the audit entry",
            )
            # Stored as the processed position, with what a save by this connector carries.
            assert after["instanceId"] == connector.instance_id
            assert after["instanceToken"] == connector.instance_token
            opened_at = datetime.fromtimestamp(
                int(after["lastProcessedToken"]["_data"][2:10], 16), timezone.utc
            )
            assert after["lastProcessedTimestamp"].replace(tzinfo=timezone.utc) == opened_at
            assert after["eventsProcessed"] == stored["eventsProcessed"] == 3
            lease = client.shop["_fw_locks"].find_one({"_id": "orders"})
            assert lease is not None and after["epoch"] == lease["epoch"] > stored["epoch"]
            assert connector.status()["orders"].state == StreamState.RUNNING
            client.shop.orders.insert_one({"_id": 100})
            # What is left of the gap comes before 100 in the stream: it would have arrived first.
            wait_until(lambda: ("insert", 100) in seen, what="the next event")
        assert seen == [("insert", 100)]
        audit = _audit_checks(client, stored, "RESUME_FROM_NOW", began)
        lines = [r.getMessage() for r in caplog.records if r.name == "flowwarden.runtime.opening"]
        lost_from = stored["lastProcessedTimestamp"].replace(tzinfo=timezone.utc).isoformat()
        (lost,) = [line for line in lines if line.startswith("stream orders: history lost; ")]
        assert re.fullmatch(
            rf"stream orders: history lost; events between {re.escape(lost_from)} and (\S+) were not "
            r"delivered \(strategy RESUME_FROM_NOW\)",
            lost,
        )
        lost_to = datetime.fromisoformat(lost.split(" and ")[1].split(" ")[0])
        assert lost_to.replace(microsecond=lost_to.microsecond // 1000 * 1000) == audit["lostTo"].replace(
            tzinfo=timezone.utc
        )
        opened = describe_token(after["lastProcessedToken"])
        assert (
            f"stream orders: history lost, strategy RESUME_FROM_NOW: opened at {opened}, stored with the "
            "audit entry (stored)"
        ) in lines
        assert began <= audit["lostTo"].replace(tzinfo=timezone.utc) <= datetime.now(timezone.utc)


@pytest.mark.embedded_only
def test_history_lost_from_a_checkpoint_stored_without_times_is_lost_from_its_tokens_time(caplog):
    """A custom store may keep a processed token alone: the gap starts at the token's time."""
    with EmbeddedReplicaSet(oplog_max_events=20) as rs, pymongo.MongoClient(rs.uri) as client:
        orders = client.shop.orders
        with orders.watch() as stream:
            orders.insert_one({"_id": 0})
            token = stream.next()["_id"]
        orders.insert_many([{"_id": i} for i in range(1, 40)])  # the window keeps 20
        store = InMemoryCheckpointStore()
        store.save(Checkpoint(stream_id="orders", last_processed_token=token))
        handler, seen = recording_handler("shop", on_history_lost=OnHistoryLost.RESUME_FROM_NOW)
        with (
            caplog.at_level(logging.INFO, logger="flowwarden.runtime.opening"),
            running(rs.uri, [handler], checkpoint_store=store),
        ):
            audit = wait_until(
                lambda: ((store.load("orders") or Checkpoint("orders")).metadata or {}).get("historyLost"),
                what="the audit entry",
            )
    lost_from = datetime.fromtimestamp(token_cluster_time(token).time, timezone.utc)
    assert audit["lostFrom"] == lost_from and audit["strategy"] == "RESUME_FROM_NOW"
    assert any(
        r.getMessage().startswith(f"stream orders: history lost; events between {lost_from.isoformat()} and ")
        for r in caplog.records
    )
    assert seen == []


# ------------------------------------------------------------------------------------------------
# connections and server errors


@pytest.mark.embedded_only
def test_dropped_connections_lose_nothing(rs, client, db_name):
    orders = client[db_name]["orders"]
    handler, seen = recording_handler(db_name)
    with running(rs.uri, [handler]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        for start in range(0, 60, 20):
            orders.insert_many([{"_id": i} for i in range(start, start + 20)])
            rs.drop_connections()
        wait_until(lambda: len({k for _, k in seen}) == 60, what="all 60 events")
    assert sorted({k for _, k in seen}) == list(range(60))


def test_resumable_getmore_error_is_resumed_by_the_driver(mongodb_uri, client, db_name, fail_command):
    orders = client[db_name]["orders"]
    handler, seen = recording_handler(db_name)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        # HostUnreachable on the next getMore
        fail_command(["getMore"], mode={"times": 1}, errorCode=6, errorLabels=["ResumableChangeStreamError"])
        orders.insert_many([{"_id": i} for i in range(10)])
        wait_until(lambda: ("insert", 9) in seen, what="10 events")
        # A getMore already waiting when the fail point was set may have brought all ten: the one
        # bringing this later event comes after it, so by then the fail point has fired.
        orders.insert_one({"_id": 10})
        wait_until(lambda: ("insert", 10) in seen, what="the event after them")
        assert fail_command.off() == 1
        assert connector.status()["orders"].restarts == 0  # the driver resumed, not the stream
    assert seen == [("insert", i) for i in range(11)]


def test_non_resumable_error_reopens_from_the_checkpoint(mongodb_uri, client, db_name, fail_command):
    orders = client[db_name]["orders"]
    handler, seen = recording_handler(
        db_name, stream={"restart_initial_delay_seconds": 0.05, "restart_max_delay_seconds": 0.1}
    )
    with running(mongodb_uri, [handler]) as connector:
        orders.insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: len(seen) >= 5)
        # BadValue, no resumable label: the driver gives up. The next getMores fail (a getMore
        # already in flight is past the fail point).
        fail_command(["getMore"], mode={"times": 2}, errorCode=2)
        wait_until(lambda: connector.status()["orders"].restarts >= 1, what="a restart")
        orders.insert_many([{"_id": i} for i in range(5, 10)])
        wait_until(lambda: len({k for _, k in seen}) == 10, what="all events after the restart")
        wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING, what="RUNNING again")
    assert sorted({k for _, k in seen}) == list(range(10))
    assert seen[:5] == [("insert", i) for i in range(5)]


# ------------------------------------------------------------------------------------------------
# failing handlers


def failing_handler(db: str, on_exhausted: OnError, poison: int, calls: list[int]) -> type:
    @change_stream("orders", db, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(
        max_attempts=3, initial_delay_seconds=0.01, max_delay_seconds=0.02, on_exhausted=on_exhausted
    )
    @dead_letter_queue(retention_days=7)
    class Flaky:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"]
            calls.append(key)
            if key == poison:
                raise ValueError(f"cannot handle order {key}")

    return Flaky


def test_poison_event_with_stop_fails_the_stream_before_the_event(mongodb_uri, client, db_name):
    calls: list[int] = []
    handler = failing_handler(db_name, OnError.STOP, poison=3, calls=calls)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(6)])
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
        error = connector.stream_errors()["orders"]
    assert isinstance(error, HandlerError) and error.attempts == 3
    assert calls == [0, 1, 2, 3, 3, 3]
    doc = checkpoint_doc(client, db_name, "orders")
    assert doc["eventsProcessed"] == 3  # 0, 1, 2: the checkpoint stays before the poison event


def test_poison_event_with_skip_advances(mongodb_uri, client, db_name):
    calls: list[int] = []
    handler = failing_handler(db_name, OnError.SKIP, poison=3, calls=calls)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(6)])
        wait_until(lambda: (checkpoint_doc(client, db_name, "orders") or {}).get("eventsProcessed") == 6)
        assert connector.status()["orders"].events_failed == 1
    assert calls == [0, 1, 2, 3, 3, 3, 4, 5]
    assert connector.status()["orders"].state == StreamState.STOPPED


def test_poison_event_with_dead_letter_parks_it_and_advances(mongodb_uri, client, db_name):
    calls: list[int] = []
    handler = failing_handler(db_name, OnError.DEAD_LETTER, poison=3, calls=calls)
    with running(mongodb_uri, [handler]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(6)])
        wait_until(lambda: (checkpoint_doc(client, db_name, "orders") or {}).get("eventsProcessed") == 6)
    letters = list(client[db_name]["_fw_dlq"].find())
    assert len(letters) == 1
    letter = letters[0]
    assert letter["stream"] == "orders"
    assert letter["event"]["documentKey"] == {"_id": 3}
    assert letter["token"] == letter["event"]["_id"]
    assert letter["errorType"] == "builtins.ValueError"
    assert "cannot handle order 3" in letter["message"] and "Traceback" in letter["traceback"]
    assert letter["attempts"] == 3 and letter["clusterTime"] is not None and letter["failedAt"]
    ttl = [i for i in client[db_name]["_fw_dlq"].list_indexes() if "expireAfterSeconds" in i]
    assert ttl and ttl[0]["expireAfterSeconds"] == 7 * 86400


# ------------------------------------------------------------------------------------------------
# invalidation


def test_drop_of_the_watched_collection_stops_the_stream(mongodb_uri, client, db_name, caplog):
    handler, seen = recording_handler(db_name)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        with client[db_name].orders.watch(max_await_time_ms=50) as watching:
            client[db_name].orders.insert_one({"_id": 1})
            client[db_name].orders.drop()
            invalidate = [watching.next() for _ in range(3)][-1]["_id"]
        wait_until(lambda: connector.status()["orders"].state == StreamState.STOPPED, what="STOPPED")
        status = connector.status()["orders"]
        error = connector.stream_errors()["orders"]
    assert [op for op, _ in seen] == ["insert", "drop", "invalidate"]
    assert isinstance(error, StreamInvalidatedError)
    assert (error.stream, error.operation, error.token) == ("orders", "drop or rename", invalidate)
    assert status.reason == str(error) and str(error).startswith("stream 'orders' was invalidated by a ")
    assert str(error) in [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_restart_after_invalidate_when_configured(mongodb_uri, client, db_name, caplog):
    handler, seen = recording_handler(db_name, stream={"on_invalidate": "restart"})
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_one({"_id": 1})
        client[db_name].orders.drop()
        wait_until(lambda: ("invalidate", None) in seen, what="the invalidate event")
        client[db_name].orders.insert_one({"_id": 2})
        wait_until(lambda: ("insert", 2) in seen, what="the insert after the restart")
        assert connector.status()["orders"].state == StreamState.RUNNING
    # Opened again right after the invalidate event: nothing before it comes twice.
    assert seen == [("insert", 1), ("drop", None), ("invalidate", None), ("insert", 2)]
    assert "stream orders: invalidated; restarting after the invalidate event" in [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("on_invalidate", ["stop", "restart"])
def test_a_batch_forming_when_the_stream_is_invalidated_is_handed_over_first(
    mongodb_uri, client, db_name, on_invalidate
):
    batches: list[list[tuple[str, Any]]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50, on_invalidate=on_invalidate)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=100, max_wait_seconds=3600)  # due by neither count nor time here
        def handle(self, events: list[ChangeEvent]) -> None:
            batches.append([(e.operation_type, (e.document_key or {}).get("_id")) for e in events])

    with running(mongodb_uri, [Batches]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_one({"_id": 1})
        client[db_name].orders.drop()
        wait_until(lambda: batches, what="the batch the invalidate ended")
        if on_invalidate == "stop":
            wait_until(lambda: connector.status()["orders"].state == StreamState.STOPPED, what="STOPPED")
    assert batches == [[("insert", 1), ("drop", None), ("invalidate", None)]]
    # Handed over and committed: a restart does not read them again.
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 3


# ------------------------------------------------------------------------------------------------
# events that cannot be decoded


def _undecodable_run(mongodb_uri, client, db_name, on_exhausted: OnError):
    """Ten orders in one batch; order 5 cannot be decoded by the connector's client."""
    calls: list[int] = []
    handler = failing_handler(db_name, on_exhausted, poison=-1, calls=calls)
    registry = TypeRegistry([PoisonDecimal()])

    async def run() -> Connector:
        async_client = pymongo.AsyncMongoClient(mongodb_uri, type_registry=registry)
        connector = Connector(async_client, [handler])
        task = asyncio.create_task(connector.run_async())
        try:
            await wait_until_async(
                lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint"
            )
            client[db_name].orders.insert_many(
                [{"_id": i, "amount": Decimal128("666" if i == 5 else str(i))} for i in range(10)]
            )
            await wait_until_async(
                lambda: connector.status()["orders"].events_failed == 1, what="the undecodable event"
            )
            await wait_until_async(
                lambda: len(calls) == 9 or connector.status()["orders"].state == StreamState.FAILED,
                what="the other events",
            )
        finally:
            connector.stop()
            await task
            await async_client.close()
        return connector

    return asyncio.run(run()), calls


def test_the_events_read_with_an_undecodable_one_go_through_the_filter_and_hashing_in_order(
    mongodb_uri, client, db_name, monkeypatch
):
    """Ten events in one batch (written while the stream was stopped), the sixth holding text
    that is not UTF-8: the client cannot decode the batch, so the events are read again one by
    one, and the five before that one reach the methods as any event does, through the filter
    and with their hashed fields hashed."""
    monkeypatch.setenv("FW_TEST_SALT", "pepper")
    calls: list[tuple[int, str]] = []
    asked: list[int] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        max_await_time_ms=50,
        hash_fields=["name"],
        hash_salt_env="FW_TEST_SALT",
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(on_exhausted=OnError.SKIP, initial_delay_seconds=0.01, jitter=0)
    class Orders:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            key = event.document_key["_id"]
            asked.append(key)
            if key == 3 and asked.count(3) == 1:
                raise ConnectionError("the filter's lookup failed for now")  # then it judges
            return key % 2 == 0

        @on_change
        async def handle(self, event: ChangeEvent) -> None:  # not inline: the general path
            calls.append((event.document_key["_id"], event.full_document["name"]))

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
    client[db_name].orders.insert_many(ten_orders())
    with running(mongodb_uri, [Orders]) as connector:
        wait_until(lambda: connector.status()["orders"].events_processed == 10, what="the ten events")
        status = connector.status()["orders"]
    assert [key for key, _ in calls] == [0, 2, 4, 6, 8]
    assert all(name != f"n{key}" and len(name) == 64 for key, name in calls)  # hashed
    # The undecodable one is given up on, not asked about; 3 is asked again after its failure.
    assert asked == [0, 1, 2, 3, 3, 4, 6, 7, 8, 9]
    assert (status.events_filtered, status.events_failed) == (4, 1)
    assert (status.restarts, status.last_error) == (0, None)
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 10


def test_a_batch_methods_events_before_an_undecodable_one_are_handed_over_before_it_is_given_up_on(
    mongodb_uri, client, db_name, caplog
):
    """A batch stream: the events before the undecodable one, read again one by one, wait in the
    batch being formed; they are handed over and committed before the stream gives up on it."""
    caplog.set_level(logging.ERROR, logger="flowwarden")
    batches: list[list[int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(on_exhausted=OnError.SKIP)
    class Orders:
        @on_batch(max_events=100, max_wait_seconds=3600)  # due by neither count nor time here
        def handle(self, events: list[ChangeEvent]) -> None:
            batches.append([event.document_key["_id"] for event in events])

    with running(mongodb_uri, [Orders]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
    client[db_name].orders.insert_many(ten_orders())
    with running(mongodb_uri, [Orders]) as connector:
        wait_until(lambda: batches[:1] == [[0, 1, 2, 3, 4]], what="the events before the undecodable one")
        # Re-opened past it: the rest form a batch of their own, due at its hundredth event.
        client[db_name].orders.insert_many([{"_id": i, "name": f"n{i}"} for i in range(10, 106)])
        wait_until(lambda: len(batches) == 2, what="the events after it")
        status = connector.status()["orders"]
    assert batches == [[0, 1, 2, 3, 4], [6, 7, 8, 9, *range(10, 106)]]
    assert (status.events_failed, status.restarts, status.last_error) == (1, 0, None)
    lines = [r.getMessage() for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("stream orders: an event cannot be decoded: ")


def test_undecodable_event_with_skip_is_skipped_and_its_batch_mates_handled(mongodb_uri, client, db_name):
    _, calls = _undecodable_run(mongodb_uri, client, db_name, OnError.SKIP)
    assert calls == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 10


def test_undecodable_event_with_dead_letter_is_parked(mongodb_uri, client, db_name):
    _, calls = _undecodable_run(mongodb_uri, client, db_name, OnError.DEAD_LETTER)
    assert calls == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    (letter,) = client[db_name]["_fw_dlq"].find()
    assert letter["event"]["documentKey"] == {"_id": 5}
    assert letter["errorType"] == "bson.errors.InvalidBSON" and letter["attempts"] == 1


def test_undecodable_event_with_stop_fails_before_it(mongodb_uri, client, db_name):
    connector, calls = _undecodable_run(mongodb_uri, client, db_name, OnError.STOP)
    assert calls == [0, 1, 2, 3, 4]
    assert connector.status()["orders"].state == StreamState.FAILED
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 5


def test_a_failing_dead_letter_write_keeps_the_checkpoint_before_the_event(
    mongodb_uri, client, db_name, fail_command
):
    calls: list[int] = []
    handler = failing_handler(db_name, OnError.DEAD_LETTER, poison=3, calls=calls)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        fail_command(["insert"], mode="alwaysOn", errorCode=2)
        client[db_name].orders.insert_many([{"_id": i} for i in range(6)])
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
    assert client[db_name]["_fw_dlq"].count_documents({}) == 0
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 3


@pytest.mark.embedded_only
def test_an_outage_longer_than_the_drivers_resume_reopens_and_loses_nothing(rs, client, db_name):
    orders = client[db_name]["orders"]
    handler, seen = recording_handler(
        db_name, stream={"restart_initial_delay_seconds": 0.1, "restart_max_delay_seconds": 0.5}
    )
    # A short server selection timeout: PyMongo's one automatic resume gives up during the outage,
    # so the stream's own re-open with backoff has to bring it back.
    with running(f"{rs.uri}&serverSelectionTimeoutMS=300", [handler]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: len(seen) >= 5, what="5 events")
        rs.outage(3.0)
        wait_until(lambda: connector.status()["orders"].restarts >= 1, what="a restart", timeout=30)
        wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING, timeout=30)
        orders.insert_many([{"_id": i} for i in range(5, 10)])
        wait_until(lambda: {k for _, k in seen} >= set(range(10)), what="events after the outage")
    assert sorted({k for _, k in seen}) == list(range(10))


# ------------------------------------------------------------------------------------------------
# nothing unfinished is ever passed by the lastSeen token


def test_a_stop_during_a_batch_retry_leaves_the_batch_to_the_next_run(mongodb_uri, client, db_name, caplog):
    calls: list[list[int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=100)
    @checkpoint(save_every_n=1, save_interval_seconds=0.2)
    @retry_policy(max_attempts=3, initial_delay_seconds=30, on_exhausted=OnError.STOP)
    class Failing:
        @on_batch(max_events=100, max_wait_seconds=0.1)
        def handle(self, events: list[ChangeEvent]) -> None:
            calls.append([e.document_key["_id"] for e in events])
            raise RuntimeError("sink down")

    with running(mongodb_uri, [Failing]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(5)])
        wait_until(
            lambda: any("(attempt 1 of 3), retrying in" in r.getMessage() for r in caplog.records),
            what="the first attempt to fail and its backoff (about 30 s) to begin",
        )
        # The stop interrupts the backoff.
    again, seen = recording_handler(db_name)
    with running(mongodb_uri, [again]):
        wait_until(lambda: len(seen) >= 5, what="the batch again")
    assert seen[:5] == [("insert", i) for i in range(5)]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_stop_during_an_events_retry_leaves_it_to_the_next_run(mongodb_uri, client, db_name, concurrency):
    handled: list[int] = []
    attempts: list[int] = []
    failing = threading.Event()
    failing.set()

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50, max_concurrency=concurrency)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=10_000, initial_delay_seconds=0.02, max_delay_seconds=0.02, jitter=0)
    class Failing:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"]
            attempts.append(key)
            if key == 1 and failing.is_set():
                raise RuntimeError("sink down")
            handled.append(key)

    with running(mongodb_uri, [Failing]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_one({"_id": 0})
        wait_until(lambda: handled == [0], what="the first event")
        client[db_name].orders.insert_one({"_id": 1})
        wait_until(lambda: attempts.count(1) >= 3, what="retries of the second")
        # The stop interrupts the retries.
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 1
    failing.clear()
    with running(mongodb_uri, [Failing]):
        wait_until(lambda: handled == [0, 1], what="the event again")


class _EmptyGetMores(monitoring.CommandListener):
    """Counts the getMores that came back without events (each gives the stream an empty read)."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "getMore" and not event.reply["cursor"]["nextBatch"]:
            self.count += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_a_concurrent_handler_failing_under_stop_is_not_passed_by_last_seen(mongodb_uri, client, db_name):
    """While order 3's handler runs, the read loop goes on: it reads an empty batch whose
    post-batch token is past 3, and hands a later event to another handler. That token must not
    become the stream's position; when 3 fails, a restart handles it again."""
    started: list[int] = []
    finished: list[int] = []
    release = threading.Event()

    @change_stream("orders", db_name, name="orders", max_concurrency=4, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=1, on_exhausted=OnError.STOP)
    class FailsOnThree:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"]
            started.append(key)
            if key == 3:
                release.wait(30)
                raise ValueError("order 3 is broken")
            finished.append(key)

    orders = client[db_name].orders
    empty_reads = _EmptyGetMores()

    async def run() -> Connector:
        async_client = pymongo.AsyncMongoClient(mongodb_uri, event_listeners=[empty_reads])
        connector = Connector(async_client, [FailsOnThree])
        task = asyncio.create_task(connector.run_async())
        try:
            await wait_until_async(
                lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint"
            )
            with client.start_session() as session:
                orders.insert_many([{"_id": i} for i in range(4)], session=session)
                written = session.operation_time.time
                await wait_until_async(lambda: 3 in started, what="order 3's handler to start")
                # Step the server's cluster time into the next second (writes to a collection the
                # stream does not watch), so that any post-batch token read from now on is
                # distinguishable from 3's time in status().last_seen_time.
                probes = client[db_name].clock

                def next_second() -> bool:
                    probes.insert_one({}, session=session)
                    return session.operation_time.time > written

                await wait_until_async(next_second, what="the server's clock to reach its next second")
            # Two empty getMores after that: the second one was sent after the probes.
            reads = empty_reads.count
            await wait_until_async(lambda: empty_reads.count >= reads + 2, what="two empty reads")
            # A later event, read after those empty reads: once it is handled, the read loop has
            # taken the empty reads (3 still running).
            orders.insert_one({"_id": 4})
            await wait_until_async(lambda: 4 in finished, what="order 4")
            assert 3 not in finished
            # The stream's seen position is still from before the probes: not past 3.
            last_seen = connector.status()["orders"].last_seen_time
            assert last_seen is not None and last_seen < datetime.fromtimestamp(written + 1, timezone.utc)
            release.set()
            await wait_until_async(
                lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED"
            )
        finally:
            release.set()
            connector.stop()
            await task
            await async_client.close()
        return connector

    asyncio.run(run())
    again, seen = recording_handler(db_name)
    with running(mongodb_uri, [again]):
        wait_until(lambda: ("insert", 3) in seen, what="order 3 again")
