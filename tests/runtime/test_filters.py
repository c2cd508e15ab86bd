"""@event_filter: the events it leaves out reach no method, and their positions are committed in
stream order as handled events' are, so the stored lastProcessedToken passes them (a kill -9 and
a restart does not ask about them again), with one event at a time, in batches and with
concurrent handlers alike; a failing filter is a failing handler; snapshot rows are filtered too;
each left-out event counts as ``filtered``."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import pymongo
import pytest

from flowwarden import (
    ChangeEvent,
    OnError,
    Snapshot,
    StreamState,
    change_stream,
    checkpoint,
    event_filter,
    on_batch,
    on_change,
    retry_policy,
)
from helpers import checkpoint_doc, running, samples, value, wait_until

from .test_processes import handled, start_worker


def filter_log(path: Path) -> list[tuple[int, str]]:
    """The ``(_id, token _data)`` lines the worker's filter wrote, one per event it was asked about."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line]
    return [(int(key), token) for key, token in lines]


def stored_position(client: pymongo.MongoClient[Any], db: str, stream: str = "orders") -> str | None:
    document = checkpoint_doc(client, db, stream)
    token = (document or {}).get("lastProcessedToken")
    return token["_data"] if token else None


def inserted(client: pymongo.MongoClient[Any], db: str, count: int) -> list[str]:
    """Insert ``_id`` 0 to ``count - 1`` into ``orders``; the resume tokens of their events."""
    with client[db].orders.watch(max_await_time_ms=50) as stream:
        client[db].orders.insert_many([{"_id": i} for i in range(count)])
        found: list[str] = []
        while len(found) < count:
            event = stream.try_next()
            if event is not None:
                found.append(event["_id"]["_data"])
    return found


@pytest.mark.slow
def test_events_left_out_before_a_kill_are_not_asked_about_again(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, tmp_path: Path
) -> None:
    """The stored position moves past the events the filter left out (lastProcessedToken, not
    only lastSeenToken); after a SIGKILL the restarted stream goes on after the last of them."""
    log, asked = tmp_path / "handled.log", tmp_path / "filter.log"
    orders = client[db_name].orders
    worker = start_worker(mongodb_uri, db_name, log, 1, "--keep-even", str(asked))
    try:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="initial checkpoint")
        orders.insert_many([{"_id": i} for i in range(10)])  # the last one, 9, is left out
        wait_until(lambda: handled(log) == [0, 2, 4, 6, 8], what="the even events handled")
        wait_until(lambda: len(filter_log(asked)) == 10, what="the filter asked about every event")
        last_left_out = dict(filter_log(asked))[9]
        wait_until(
            lambda: stored_position(client, db_name) == last_left_out,
            what="the stored lastProcessedToken to pass the events the filter left out",
        )
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        asked_before = len(filter_log(asked))
        worker = start_worker(mongodb_uri, db_name, log, 1, "--keep-even", str(asked))
        orders.insert_one({"_id": 10})
        wait_until(lambda: 10 in handled(log), timeout=30, what="the event written after the restart")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    assert code == 0
    assert [key for key, _ in filter_log(asked)[asked_before:]] == [10]
    assert handled(log) == [0, 2, 4, 6, 8, 10]


def test_left_out_events_between_and_inside_batches_are_passed_once_the_batches_commit(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    batches: list[list[int]] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batched:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return event.document_key["_id"] % 2 == 0

        @on_batch(max_events=3, max_wait_seconds=0.2)
        def handle(self, events: list[ChangeEvent]) -> None:
            batches.append([event.document_key["_id"] for event in events])

    with running(mongodb_uri, [Batched]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
        tokens = inserted(client, db_name, 10)
        wait_until(
            lambda: stored_position(client, db_name) == tokens[9],
            what="the stored position to pass the event left out after the last batch",
        )
        status = connector.status()["orders"]
    assert batches == [[0, 2, 4], [6, 8]]
    assert status.events_filtered == 5 and status.events_processed == 10


def test_concurrent_handlers_pass_left_out_events_too(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    seen: list[int] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50, max_concurrency=4)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Concurrent:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return event.document_key["_id"] < 5

        @on_change
        async def handle(self, event: ChangeEvent) -> None:
            seen.append(event.document_key["_id"])

    with running(mongodb_uri, [Concurrent]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
        tokens = inserted(client, db_name, 8)
        wait_until(lambda: stored_position(client, db_name) == tokens[7], what="the position past the last")
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_left_out_events_count_as_filtered(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    seen: list[int] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Counted:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return event.operation_type != "insert" or event.document_key["_id"] % 3 == 0

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append(event.document_key["_id"])

    with running(mongodb_uri, [Counted], metrics_port=0) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
        orders = client[db_name].orders
        orders.insert_many([{"_id": i} for i in range(9)])
        orders.delete_one({"_id": 1})
        wait_until(lambda: 1 in seen, what="the delete, which the filter keeps")
        found = samples(connector)
        status = connector.status()["orders"]
    assert seen == [0, 3, 6, 1]
    assert status.events_filtered == 6
    inserts = {"stream": "orders", "operation": "insert"}
    assert value(found, "flowwarden_events_total", **inserts, outcome="filtered") == 6
    assert value(found, "flowwarden_events_total", **inserts, outcome="ok") == 3


class Flaky(Exception):
    pass


@pytest.mark.parametrize("outcome", [OnError.SKIP, OnError.DEAD_LETTER, OnError.STOP])
def test_a_failing_filter_is_retried_then_given_up_on_like_a_handler(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, outcome: OnError
) -> None:
    seen: list[int] = []
    calls: dict[int, int] = {}

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=3, initial_delay_seconds=0.01, jitter=0, on_exhausted=outcome)
    class Failing:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            key = event.document_key["_id"]
            calls[key] = calls.get(key, 0) + 1
            if key == 1 and calls[key] < 3:
                raise Flaky("the filter's lookup failed for now")
            if key == 2:
                raise Flaky("the filter cannot judge this event")
            return True

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append(event.document_key["_id"])

    with running(mongodb_uri, [Failing]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
        tokens = inserted(client, db_name, 4)
        if outcome is OnError.STOP:
            failed = StreamState.FAILED
            wait_until(lambda: connector.status()["orders"].state is failed, what="the stream to fail")
        else:
            wait_until(lambda: 3 in seen, what="the event after the one given up on")
            wait_until(lambda: stored_position(client, db_name) == tokens[3], what="the position past it")
        status = connector.status()["orders"]
    assert calls[1] == 3 and calls[2] == 3  # retried up to max_attempts
    if outcome is OnError.STOP:
        assert seen == [0, 1]
        assert stored_position(client, db_name) == tokens[1]
        assert "HandlerError" in (status.last_error or "")
        return
    assert seen == [0, 1, 3]
    assert status.events_failed == 1 and status.events_filtered == 0
    assert status.events_processed == 4  # the one given up on is done with too
    dead = list(client[db_name]["_fw_dlq"].find())
    if outcome is OnError.DEAD_LETTER:
        assert [entry["event"]["documentKey"]["_id"] for entry in dead] == [2]
        assert "cannot judge" in dead[0]["message"]
    else:
        assert dead == []


def test_snapshot_rows_are_filtered_too(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flowwarden")
    seen: list[tuple[str, int]] = []
    client[db_name].orders.insert_many([{"_id": i} for i in range(6)])

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50, snapshot=Snapshot.INITIAL)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Copied:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return event.document_key["_id"] % 2 == 0

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append((event.operation_type, event.document_key["_id"]))

    # With metrics: a row or an event left out is counted there too.
    with running(mongodb_uri, [Copied], metrics_port=0) as connector:
        wait_until(lambda: len(seen) == 3, what="the copy")
        client[db_name].orders.insert_many([{"_id": 6}, {"_id": 7}])
        wait_until(lambda: len(seen) == 4, what="the change after the copy")
        # The insert of 7, left out, comes after the one of 6.
        wait_until(lambda: connector.status()["orders"].events_filtered == 4, what="4 left out")
        status = connector.status()["orders"]
    assert seen == [("snapshot", 0), ("snapshot", 2), ("snapshot", 4), ("insert", 6)]
    assert status.events_filtered == 4 and status.snapshot is not None and status.snapshot.copied == 6
    assert (status.restarts, status.last_error) == (0, None)
    assert [r.getMessage() for r in caplog.records] == []  # each row judged at its first call


def _judging_class(db: str, judge: Any, seen: list[Any], **policy: Any) -> type:
    @change_stream("orders", db, name="orders", max_await_time_ms=50, snapshot=Snapshot.INITIAL)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(initial_delay_seconds=0.01, max_delay_seconds=0.01, jitter=0, **policy)
    class Judged:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return judge(event)

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append((event.operation_type, event.document_key["_id"]))

    return Judged


def test_a_filter_that_fails_then_judges_or_gives_up_completes_rows_and_events_alike(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    """Keys 1 fail once, then are left out; keys 2 always fail and are skipped; the last event is
    one of those, so only its own completion can move the stored position past it."""
    orders = client[db_name].orders
    orders.insert_many([{"_id": f"row-{n}"} for n in range(3)])
    calls: dict[Any, int] = {}

    def judge(event: ChangeEvent) -> bool:
        key = event.document_key["_id"]
        n = int(key.rpartition("-")[2])
        calls[key] = calls.get(key, 0) + 1
        if n == 1 and calls[key] == 1:
            raise Flaky("the filter's lookup failed for now")
        if n == 2:
            raise Flaky("the filter cannot judge this one")
        return n == 0

    seen: list[Any] = []
    judged = _judging_class(db_name, judge, seen, max_attempts=2, on_exhausted=OnError.SKIP)
    # With metrics: a row or an event left out is counted there too.
    with running(mongodb_uri, [judged], metrics_port=0) as connector:
        wait_until(
            lambda: (s := connector.status()["orders"].snapshot) is not None and s.done, what="the copy"
        )
        tokens = []
        with orders.watch(max_await_time_ms=50) as stream:
            orders.insert_many([{"_id": f"event-{n}"} for n in range(3)])
            while len(tokens) < 3:
                if (event := stream.try_next()) is not None:
                    tokens.append(event["_id"]["_data"])
        wait_until(lambda: stored_position(client, db_name) == tokens[2], what="the position past the last")
        status = connector.status()["orders"]
    assert seen == [("snapshot", "row-0"), ("insert", "event-0")]
    # Left out after a failure: filtered, rows and events alike; the skipped ones failed.
    assert status.events_filtered == 2 and status.events_failed == 2
    assert status.events_processed == 3  # the stream's events; rows are counted by the copy
    assert status.snapshot is not None and status.snapshot.copied == 3
    # Each completed where it was judged: no error re-opened the stream and judged it again.
    assert (status.restarts, status.last_error) == (0, None)
    assert calls == {"row-0": 1, "row-1": 2, "row-2": 2, "event-0": 1, "event-1": 2, "event-2": 2}


def test_a_stop_while_the_filter_is_retried_leaves_the_event_unfinished(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    asked: list[int] = []
    judging = {"failing": True}

    def judge(event: ChangeEvent) -> bool:
        key = event.document_key["_id"]
        asked.append(key)
        if key == 1 and judging["failing"]:
            raise Flaky("the filter's lookup is down")
        return True

    seen: list[Any] = []
    judged = _judging_class(db_name, judge, seen, max_attempts=100_000)
    with running(mongodb_uri, [judged]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="its opening position")
        tokens = inserted(client, db_name, 3)
        wait_until(lambda: asked.count(1) >= 3, what="the filter retried")
    assert seen == [("insert", 0)]
    assert stored_position(client, db_name) == tokens[0]  # before the event in the filter's hands
    judging["failing"] = False
    with running(mongodb_uri, [judged]):
        wait_until(lambda: len(seen) == 3, what="the event asked about again, and the one after it")
    assert seen == [("insert", 0), ("insert", 1), ("insert", 2)]
