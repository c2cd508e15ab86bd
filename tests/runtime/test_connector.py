"""The Connector's surface: clients it accepts, what it sends, what it reports."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pymongo
import pytest
from pymongo import monitoring

from flowwarden import ConfigurationError, Connector, StreamState
from flowwarden.runtime import redact_uri
from helpers import checkpoint_doc, wait_until, wait_until_async

from .handlers import recording_handler


def test_redact_uri_hides_the_password_only():
    assert redact_uri("mongodb://app:s3cr3t@db1:27017,db2/?replicaSet=rs0") == (
        "mongodb://app:***@db1:27017,db2/?replicaSet=rs0"
    )
    assert redact_uri("mongodb://db1/?replicaSet=rs0") == "mongodb://db1/?replicaSet=rs0"


def test_the_password_never_reaches_the_logs(caplog, mongodb_uri, db_name):
    handler, _ = recording_handler(db_name)
    secret_uri = mongodb_uri.replace("mongodb://", "mongodb://app:hunter2@", 1)
    connector = Connector(secret_uri, [handler])
    with caplog.at_level(logging.DEBUG, logger="flowwarden"):
        connector.start()
        connector.stop()
    assert "hunter2" not in caplog.text
    assert "app:***@" in caplog.text


def test_a_sync_client_is_refused_with_the_fix(mongodb_uri, db_name):
    handler, _ = recording_handler(db_name)
    with pymongo.MongoClient(mongodb_uri) as sync_client:
        with pytest.raises(ConfigurationError, match="AsyncMongoClient"):
            Connector(sync_client, [handler])


def test_two_classes_with_one_stream_name_are_refused(db_name):
    first, _ = recording_handler(db_name, name="same")
    second, _ = recording_handler(db_name, name="same")
    with pytest.raises(ConfigurationError, match="same"):
        Connector("mongodb://127.0.0.1:1/?replicaSet=rs0", [first, second])


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.aggregates: list[dict] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "aggregate":
            self.aggregates.append(dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_cursors_carry_the_stream_name_as_comment(mongodb_uri, client, db_name):
    listener = _Commands()
    handler, _ = recording_handler(db_name)
    async_client = pymongo.AsyncMongoClient(mongodb_uri, event_listeners=[listener])
    connector = Connector(async_client, [handler])
    task = asyncio.create_task(connector.run_async())
    try:
        await wait_until_async(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
    finally:
        connector.stop()
        await task
        await async_client.close()
    streams = [c for c in listener.aggregates if c["pipeline"] and "$changeStream" in c["pipeline"][0]]
    assert streams and all(c["comment"] == "flowwarden:orders" for c in streams)


async def test_a_motor_client_works(mongodb_uri, client, db_name):
    motor_asyncio = pytest.importorskip("motor.motor_asyncio", reason="motor is the 'motor' extra")
    motor = motor_asyncio.AsyncIOMotorClient(mongodb_uri)
    handler, seen = recording_handler(db_name)
    connector = Connector(motor, [handler])
    task = asyncio.create_task(connector.run_async())
    try:
        await wait_until_async(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(5)])
        await wait_until_async(lambda: len(seen) == 5, what="5 events")
        assert connector.status()["orders"].state == StreamState.RUNNING
    finally:
        connector.stop()
        await task
        motor.close()
    assert seen == [("insert", i) for i in range(5)]
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 5


def test_status_reports_progress_and_lag(mongodb_uri, client, db_name):
    handler, _ = recording_handler(db_name)
    connector = Connector(mongodb_uri, [handler])
    assert connector.status()["orders"].state == StreamState.STARTING
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(3)])
        wait_until(lambda: connector.status()["orders"].events_processed == 3, what="3 events")
        status = connector.status()["orders"]
        assert status.state == StreamState.RUNNING
        assert status.last_seen_time is not None
        assert status.lag_seconds is not None and 0 <= status.lag_seconds < 60
        assert status.events_failed == 0 and status.last_error is None
    finally:
        connector.stop()
    assert connector.status()["orders"].state == StreamState.STOPPED


def _run_observing_freeze(connector: Connector) -> list[int]:
    """Run ``connector`` with run() on this (the main) thread; another thread notes
    gc.get_freeze_count() once the stream runs, then stops it."""
    observed: list[int] = []

    def observe() -> None:
        try:
            wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING, what="running")
            observed.append(gc.get_freeze_count())
        finally:
            connector.stop()

    observer = threading.Thread(target=observe)
    observer.start()
    connector.run()
    observer.join()
    return observed


def test_run_leaves_the_heap_it_began_with_out_of_the_collectors_passes(mongodb_uri, db_name):
    assert gc.get_freeze_count() == 0
    alive = [object()]  # tracked objects alive when run() begins
    handler, _ = recording_handler(db_name)
    observed = _run_observing_freeze(Connector(mongodb_uri, [handler]))
    assert observed and observed[0] >= len(alive)
    assert gc.get_freeze_count() == 0, "run() hands the objects back to the collector when it returns"


def test_run_keeps_a_heap_the_process_froze_itself(mongodb_uri, db_name):
    handler, _ = recording_handler(db_name)
    gc.freeze()
    try:
        observed = _run_observing_freeze(Connector(mongodb_uri, [handler]))
        assert observed and observed[0] > 0
        assert gc.get_freeze_count() > 0, "the process's own freeze stays when run() returns"
    finally:
        gc.unfreeze()
