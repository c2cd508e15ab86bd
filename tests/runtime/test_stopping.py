"""Stopping: the status says STOPPING while a stop waits, a second signal stops at once, a stop
does not wait for an unreachable deployment, and `flowwarden run` says how its streams ended."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pymongo
import pytest

from flowwarden import ChangeEvent, Connector, StreamState, change_stream, checkpoint, on_change
from flowwarden.testing import EmbeddedReplicaSet
from helpers import checkpoint_doc, wait_until

from .conftest import ChildLog, handled, run_connector
from .handlers import recording_handler


def test_the_status_says_stopping_while_a_stop_waits_for_a_handler(mongodb_uri, client, db_name):
    release = threading.Event()
    entered = threading.Event()

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.2)
    class Slow:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            entered.set()
            release.wait(30)

    connector = Connector(mongodb_uri, [Slow])
    connector.start()
    client[db_name].orders.insert_one({"_id": 1})
    assert entered.wait(10)
    stopper = threading.Thread(target=connector.stop)
    stopper.start()
    wait_until(lambda: connector.status()["orders"].state == StreamState.STOPPING, what="STOPPING")
    release.set()
    stopper.join(30)
    assert connector.status()["orders"].state == StreamState.STOPPED
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 1


def test_a_stop_does_not_wait_for_a_checkpoint_save_that_hangs(mongodb_uri, client, db_name):
    handler, seen = recording_handler(db_name, save_every_n=1, save_interval_seconds=60)
    connector = Connector(mongodb_uri, [handler])
    connector.start()
    try:
        # Every checkpoint write from now on hangs for 20 s before it is answered.
        client.admin.command(
            "configureFailPoint",
            "failCommand",
            mode="alwaysOn",
            data={
                "failCommands": ["update"],
                "blockConnection": True,
                "blockTimeMS": 20_000,
                "appName": "flowwarden",
            },
        )
        client[db_name].orders.insert_one({"_id": 1})
        wait_until(lambda: seen == [("insert", 1)], what="the event, whose count save now hangs")
        started = time.monotonic()
        connector.stop(timeout=30)
        took = time.monotonic() - started
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert connector.status()["orders"].state == StreamState.STOPPED
    assert took < 8, f"the stop waited {took:.1f}s for a hung save"


# ------------------------------------------------------------------------------------------------
# `flowwarden run` in its own process


def _opened(client: pymongo.MongoClient[Any], db: str) -> bool:
    return checkpoint_doc(client, db, "orders") is not None


@pytest.mark.parametrize("concurrency", ["1", "2"], ids=["on the event loop", "in a worker thread"])
def test_a_second_signal_stops_at_once_without_passing_the_hung_event(
    mongodb_uri, client, db_name, tmp_path, concurrency
):
    log = tmp_path / "handled.log"
    child = run_connector(
        mongodb_uri,
        db_name,
        log,
        FW_TEST_BLOCK_ON="3",
        FW_TEST_SAVE_EVERY_N="1",
        FW_TEST_CONCURRENCY=concurrency,
    )
    child_log = ChildLog(child.stderr)
    try:
        wait_until(lambda: _opened(client, db_name), what="the stream to open")
        client[db_name].orders.insert_many([{"_id": i} for i in range(6)])
        wait_until(lambda: "blocked" in handled(log), what="the handler of event 3 to hang")
        child.send_signal(signal.SIGINT)
        child_log.wait_for("stopping gracefully")
        assert child.poll() is None, "a graceful stop waits for handlers in flight"
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    assert code == 130
    assert "stopped at once" in child_log.finish()
    first_run = handled(log)
    assert "blocked" in first_run and "3" not in first_run
    # Event 3 was never finished: a restart handles it (and whatever came after it) again.
    restart = run_connector(mongodb_uri, db_name, log, FW_TEST_SAVE_EVERY_N="1")
    try:
        wait_until(lambda: {"3", "4", "5"} <= set(handled(log)[len(first_run) :]), what="events 3-5 again")
    finally:
        restart.send_signal(signal.SIGTERM)
        assert restart.wait(timeout=30) == 0


@pytest.mark.embedded_only
def test_a_stop_does_not_wait_for_an_unreachable_deployment(tmp_path):
    rs = EmbeddedReplicaSet().start()
    log = tmp_path / "handled.log"
    child = run_connector(rs.uri, "shop", log, FW_TEST_SAVE_EVERY_N="1", FW_TEST_LOG_SERVER_SELECTION="1")
    child_log = ChildLog(child.stderr)
    try:
        with pymongo.MongoClient(rs.uri) as client:
            wait_until(lambda: _opened(client, "shop"), what="the stream to open")
            client.shop.orders.insert_one({"_id": 1})
            wait_until(lambda: handled(log) == ["1"], what="the first event")
        before_stop = child_log.mark()
        rs.stop()
        child_log.wait_for("Waiting for suitable server", after=before_stop)
        started = time.monotonic()
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=20)
        took = time.monotonic() - started
    finally:
        if child.poll() is None:
            child.kill()
        rs.stop()
    assert code == 0
    assert took < 8, f"the stop took {took:.1f}s with the deployment out of reach"


def test_run_exits_non_zero_when_the_watched_collection_is_dropped(mongodb_uri, client, db_name, tmp_path):
    log = tmp_path / "handled.log"
    client[db_name].orders.insert_one({"_id": 0})
    child = run_connector(mongodb_uri, db_name, log, FW_TEST_SAVE_EVERY_N="1")
    child_log = ChildLog(child.stderr)
    try:
        wait_until(lambda: _opened(client, db_name), what="the stream to open")
        client[db_name].orders.drop()
        code = child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert code == 1
    assert "orders" in child_log.finish()
