"""Stopping: the status says STOPPING while a stop waits, a second signal stops at once, a stop
does not wait for an unreachable deployment, and `flowwarden run` says how its streams ended."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pymongo
import pytest

from flowwarden import ChangeEvent, Connector, StreamState, change_stream, checkpoint, on_change
from flowwarden.testing import EmbeddedReplicaSet
from helpers import checkpoint_doc, wait_until

from .conftest import ChildLog, FailCommand, handled, run_connector
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


@pytest.mark.embedded_only
def test_a_stop_does_not_wait_for_a_checkpoint_save_that_hangs():
    # A server of its own: the save held here is still held when the test ends, and stopping the
    # server is what ends it (a shared server would apply it minutes later, to a dropped database).
    with EmbeddedReplicaSet() as rs, pymongo.MongoClient(rs.uri) as client:
        handler, seen = recording_handler("shop", save_every_n=1, save_interval_seconds=60)
        connector = Connector(rs.uri, [handler])
        connector.start()
        fail_command = FailCommand(client)
        # Every checkpoint write from now on is held for ten minutes before it is answered.
        fail_command(["update"], mode="alwaysOn", blockConnection=True, blockTimeMS=600_000)
        client.shop.orders.insert_one({"_id": 1})
        wait_until(lambda: seen == [("insert", 1)], what="the event, whose count save is now held")
        stopper = threading.Thread(target=connector.stop, kwargs={"timeout": 900}, daemon=True)
        stopper.start()
        wait_until(
            lambda: not stopper.is_alive(),
            timeout=60,
            what="the stop, which must not wait for the save held for ten minutes",
        )
        # The save is still held: it reached the fail point, and the server has not applied it.
        assert fail_command.off() >= 1
        assert checkpoint_doc(client, "shop", "orders")["eventsProcessed"] == 0
        assert connector.status()["orders"].state == StreamState.STOPPED


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
    # The child's driver waits ten minutes for a server before it gives up: far longer than the
    # test waits for the stop, so a stop that waited for the deployment could not end in time.
    uri = f"{rs.uri}&serverSelectionTimeoutMS=600000"
    # The first event is not saved before the stop (a save every 1000 events or 60 s): the stop's
    # final save has it to write, to a deployment that is gone.
    child = run_connector(uri, "shop", log, FW_TEST_LOG_SERVER_SELECTION="1")
    child_log = ChildLog(child.stderr)
    try:
        with pymongo.MongoClient(rs.uri) as client:
            wait_until(lambda: _opened(client, "shop"), what="the stream to open")
            client.shop.orders.insert_one({"_id": 1})
            wait_until(lambda: handled(log) == ["1"], what="the first event")
        before_stop = child_log.mark()
        rs.stop()  # for good: nothing brings the deployment back
        child_log.wait_for("Waiting for suitable server", after=before_stop)
        child.send_signal(signal.SIGINT)
        wait_until(
            lambda: child.poll() is not None,
            timeout=60,
            what="the stop, which must not wait ten minutes for the deployment",
        )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        rs.stop()
    assert child.returncode == 0, child_log.finish()
    stopping = child_log.finish()
    assert "the save in progress was abandoned" in stopping
    # No server selection ended: the process was gone while its driver still waited for a server.
    assert "Server selection failed" not in stopping


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


def test_the_loops_clean_up_gives_up_on_a_task_and_a_worker_thread_that_do_not_end(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What asyncio.run does after its coroutine waits for every task and worker thread, however
    long; the connector's clean-up waits for each at most its bound, then goes on."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from flowwarden.runtime import connector as connector_module

    monkeypatch.setattr(connector_module, "_CLOSE_TIMEOUT_SECONDS", 0.2)
    released = threading.Event()
    cancellations = 0

    async def holds_on() -> None:  # as a driver retrying a write through its cancellation
        nonlocal cancellations
        while not released.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                cancellations += 1

    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor()
    loop.set_default_executor(executor)
    task = loop.create_task(holds_on())
    loop.run_in_executor(None, released.wait)  # a handler hung in a worker thread
    loop.run_until_complete(asyncio.sleep(0))
    finished = threading.Event()

    def finish() -> None:
        connector_module._finish_loop(loop, executor)
        finished.set()

    cleaner = threading.Thread(target=finish, daemon=True)
    try:
        with caplog.at_level("WARNING", logger="flowwarden"):
            cleaner.start()
            assert finished.wait(30), "the clean-up waited for the task or the thread"
    finally:
        released.set()
        cleaner.join(30)
    assert cancellations == 1 and not task.done()  # given up on, not waited for
    assert "a worker thread (a handler or a blocking store call) was still busy" in caplog.text
    loop.run_until_complete(task)  # released: it ends now
    loop.close()


def test_a_wait_on_the_deployment_is_abandoned_at_a_stop_even_when_it_ignores_its_cancellation() -> None:
    import asyncio

    from flowwarden.runtime.stopping import StopRequested, unless_stopping

    async def scenario() -> tuple[int, bool]:
        stopping = asyncio.Event()
        release = asyncio.Event()
        cancellations = 0

        async def held() -> str:  # as a driver retrying a write through its cancellation
            nonlocal cancellations
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    cancellations += 1
            return "written"

        assert await unless_stopping(asyncio.sleep(0, "answered"), stopping) == "answered"
        waiting = asyncio.ensure_future(unless_stopping(held(), stopping))
        await asyncio.sleep(0.01)
        stopping.set()
        with pytest.raises(StopRequested):
            await asyncio.wait_for(waiting, 10)
        with pytest.raises(StopRequested):  # once stopping, nothing new is waited for
            await unless_stopping(held(), stopping)
        release.set()
        await asyncio.sleep(0.01)
        return cancellations, release.is_set()

    assert asyncio.run(scenario()) == (1, True)
