"""Failing closed: a first run loses nothing, errors a re-open cannot fix fail at once, positions
that cannot be right are refused, and an operator hears about a second writer."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pymongo
import pytest
from bson import DatetimeMS, Timestamp

from flowwarden import (
    ChangeEvent,
    HandlerError,
    StreamState,
    change_stream,
    checkpoint,
    on_change,
)
from flowwarden.checkpoints import Checkpoint, FileCheckpointStore, InMemoryCheckpointStore
from flowwarden.checkpoints.contract import DAMAGED_RECORDS, damaged_record, sample_token
from flowwarden.errors import RestartsExhaustedError, ResumePositionError, UnreadableCheckpointError
from helpers import checkpoint_doc, running, wait_until

from .handlers import recording_handler

# ------------------------------------------------------------------------------------------------
# the first seconds of a new stream


def flaky_until_fixed(db: str, fixed: threading.Event, seen: list[int]) -> type:
    """A class whose handler raises (default retry policy: STOP) until ``fixed`` is set."""

    @change_stream("orders", db, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=100, save_interval_seconds=60)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            if not fixed.is_set():
                raise RuntimeError("the handler is broken")
            seen.append(event.document_key["_id"])

    return Orders


def test_a_new_stream_whose_handler_fails_at_once_loses_nothing(mongodb_uri, client, db_name):
    fixed = threading.Event()
    seen: list[int] = []
    handler = flaky_until_fixed(db_name, fixed, seen)
    with running(mongodb_uri, [handler]) as connector:
        # start() returned: the opening position is stored, before any event arrived.
        assert checkpoint_doc(client, db_name, "orders")["lastSeenToken"] is not None
        client[db_name].orders.insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
        assert isinstance(connector.stream_errors()["orders"], HandlerError)
    fixed.set()
    with running(mongodb_uri, [handler]):
        wait_until(lambda: len(seen) >= 5, what="the 5 events of the first run")
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"start_position": "LATEST"},
        {"start_position": "EARLIEST"},
        {"start_position": "AT_TIME", "start_at": Timestamp(int(time.time()) - 1, 0)},
    ],
    ids=["resume", "latest", "earliest", "at_time"],
)
@pytest.mark.parametrize("batch_size", [None, 10])
def test_every_start_position_is_stored_before_the_first_event(
    mongodb_uri, client, db_name, options, batch_size
):
    handler, seen = recording_handler(
        db_name, save_every_n=1000, save_interval_seconds=60, stream={"batch_size": batch_size}, **options
    )
    with running(mongodb_uri, [handler]) as connector:
        stored = checkpoint_doc(client, db_name, "orders")
        assert stored is not None and stored["lastSeenToken"] is not None
        assert stored["lastProcessedToken"] is None
        client[db_name].orders.insert_many([{"_id": i} for i in range(25)])
        wait_until(lambda: ("insert", 24) in seen, what="the events after the open")
        assert connector.status()["orders"].restarts == 0


# ------------------------------------------------------------------------------------------------
# errors a re-open cannot fix


def _write_checkpoint(client: pymongo.MongoClient[Any], db: str, document: dict[str, Any]) -> None:
    client[db]["_fw_checkpoints"].replace_one({"_id": document["_id"]}, document, upsert=True)


@pytest.mark.parametrize("damage", sorted(DAMAGED_RECORDS))
def test_an_unreadable_checkpoint_fails_the_stream_and_is_left_as_it_was(
    mongodb_uri, client, db_name, damage
):
    field, value = DAMAGED_RECORDS[damage]
    _write_checkpoint(client, db_name, damaged_record(field, value))
    before = checkpoint_doc(client, db_name, "orders")
    handler, seen = recording_handler(db_name)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=5, what="FAILED")
        status = connector.status()["orders"]
        assert status.restarts == 0
        assert isinstance(connector.stream_errors()["orders"], UnreadableCheckpointError)
        assert field in status.last_error
    assert checkpoint_doc(client, db_name, "orders") == before
    assert seen == []


def test_a_checkpoint_with_a_date_out_of_range_fails_the_stream(mongodb_uri, client, db_name):
    # A BSON date no datetime can hold (year 292278994): the driver cannot decode the document.
    _write_checkpoint(
        client,
        db_name,
        {"_id": "orders", "lastProcessedToken": sample_token(1), "updatedAt": DatetimeMS(2**62)},
    )
    handler, _ = recording_handler(db_name)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=5, what="FAILED")
        assert isinstance(connector.stream_errors()["orders"], UnreadableCheckpointError)
        assert connector.status()["orders"].restarts == 0


@pytest.mark.parametrize("damage", ["truncated", "not utf-8", "not an object", "another stream's record"])
def test_an_unreadable_checkpoint_file_fails_the_stream(mongodb_uri, db_name, tmp_path, damage):
    path = tmp_path / "checkpoints.json"
    store = FileCheckpointStore(path)
    store.save_seen("orders", sample_token(1_700_000_000), 0)
    text = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(text[: len(text) // 2])
    elif damage == "not utf-8":
        path.write_bytes(text.replace(b"orders", b"ord\xffrs", 1))
    elif damage == "not an object":
        path.write_text('{"format": "flowwarden-checkpoints", "version": 1, "checkpoints": {"orders": [1]}}')
    else:
        path.write_bytes(text.replace(b'"_id": "orders"', b'"_id": "payments"'))
    before = path.read_bytes()
    handler, _ = recording_handler(db_name)
    with running(mongodb_uri, [handler], checkpoint_store=store) as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=5, what="FAILED")
        assert isinstance(connector.stream_errors()["orders"], UnreadableCheckpointError)
        assert connector.status()["orders"].restarts == 0
    assert path.read_bytes() == before


def _fail_find_on_checkpoints(client: pymongo.MongoClient[Any], code: int) -> None:
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode="alwaysOn",
        data={"failCommands": ["find"], "errorCode": code, "appName": "flowwarden"},
    )


def _fail_points_off(client: pymongo.MongoClient[Any]) -> None:
    client.admin.command("configureFailPoint", "failCommand", mode="off")


@pytest.mark.parametrize("code", [13, 18, 8000], ids=["Unauthorized", "AuthenticationFailed", "AtlasError"])
def test_a_refused_checkpoint_read_fails_the_stream_at_once(mongodb_uri, client, db_name, code):
    _fail_find_on_checkpoints(client, code)
    try:
        handler, _ = recording_handler(db_name)
        with running(mongodb_uri, [handler]) as connector:
            wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=5)
            status = connector.status()["orders"]
            assert status.restarts == 0
            assert f"code {code}" in status.last_error or f"'code': {code}" in status.last_error
    finally:
        _fail_points_off(client)


def test_a_token_dated_in_the_future_is_refused(mongodb_uri, client, db_name):
    future = {"_data": "827FFFFFFF000000012B0429296E1404"}
    _write_checkpoint(client, db_name, {"_id": "orders", "lastProcessedToken": future, "epoch": 0})
    handler, _ = recording_handler(db_name)
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=5, what="FAILED")
        error = connector.stream_errors()["orders"]
    assert isinstance(error, ResumePositionError)
    assert (error.stream, error.token) == ("orders", future)
    assert error.reason.startswith("its cluster time 2038-01-19T03:14:07+00:00 is ahead of the server's (")
    assert str(error).startswith(f"stream 'orders' cannot resume from its stored position {future!r}: ")
    assert "flowwarden checkpoints rewind orders" in str(error)
    assert checkpoint_doc(client, db_name, "orders")["lastProcessedToken"] == future


def test_a_token_of_the_wrong_form_from_a_custom_store_is_refused_saying_why(mongodb_uri, db_name):
    store = InMemoryCheckpointStore()
    store.save(Checkpoint(stream_id="orders", last_processed_token={"_data": "zz"}))
    handler, seen = recording_handler(db_name)
    with running(mongodb_uri, [handler], checkpoint_store=store) as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=5, what="FAILED")
        error = connector.stream_errors()["orders"]
    assert isinstance(error, ResumePositionError)
    assert (error.stream, error.token) == ("orders", {"_data": "zz"})
    assert error.reason == "resume token _data must be hex digits, two per byte; got 'ZZ'"
    assert seen == []


def test_a_token_the_server_cannot_find_fails_with_the_rewind_hint(mongodb_uri, client, db_name):
    # An event token of another collection: well formed, in the oplog's window, not in this stream.
    with client[db_name].other.watch() as other:
        client[db_name].other.insert_one({"_id": 1})
        foreign = other.next()["_id"]
    _write_checkpoint(client, db_name, {"_id": "orders", "lastProcessedToken": foreign, "epoch": 0})
    handler, seen = recording_handler(db_name)
    with running(mongodb_uri, [handler]) as connector:
        # The server finds out when the stream passes where the token would have been.
        client[db_name].orders.insert_one({"_id": 1})
        wait_until(
            lambda: connector.status()["orders"].state == StreamState.FAILED, timeout=10, what="FAILED"
        )
        error = connector.stream_errors()["orders"]
        assert connector.status()["orders"].restarts == 0
    assert seen == []
    assert isinstance(error, ResumePositionError)
    assert "flowwarden checkpoints rewind" in str(error)


def _fail_getmore(client: pymongo.MongoClient[Any], code: int) -> None:
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode="alwaysOn",
        data={"failCommands": ["getMore"], "errorCode": code, "appName": "flowwarden"},
    )


def test_an_unknown_error_restarts_at_most_max_restarts_times_then_fails(mongodb_uri, client, db_name):
    handler, _ = recording_handler(
        db_name,
        stream={"restart_initial_delay_seconds": 0.01, "restart_max_delay_seconds": 0.02, "max_restarts": 3},
    )
    try:
        with running(mongodb_uri, [handler]) as connector:
            _fail_getmore(client, 2)  # BadValue: not known to be transient, not known to be fatal
            wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
            error = connector.stream_errors()["orders"]
            assert connector.status()["orders"].restarts == 3
    finally:
        _fail_points_off(client)
    assert isinstance(error, RestartsExhaustedError) and error.restarts == 3
    assert "max_restarts" in str(error)


def test_a_transient_error_restarts_for_as_long_as_it_lasts(mongodb_uri, client, db_name):
    handler, seen = recording_handler(
        db_name,
        stream={"restart_initial_delay_seconds": 0.01, "restart_max_delay_seconds": 0.02, "max_restarts": 1},
    )
    try:
        with running(mongodb_uri, [handler]) as connector:
            _fail_getmore(client, 6)  # HostUnreachable, without the label the driver resumes on
            wait_until(lambda: connector.status()["orders"].restarts >= 5, what="5 restarts")
            assert connector.status()["orders"].state != StreamState.FAILED
            _fail_points_off(client)
            client[db_name].orders.insert_one({"_id": 1})
            wait_until(lambda: seen == [("insert", 1)], what="the event after the outage")
            assert connector.status()["orders"].state == StreamState.RUNNING
    finally:
        _fail_points_off(client)


# ------------------------------------------------------------------------------------------------
# two writers of one checkpoint


def test_a_second_instance_writing_the_same_checkpoint_is_named_in_a_warning(
    mongodb_uri, client, db_name, caplog
):
    store = InMemoryCheckpointStore()
    handler, seen = recording_handler(db_name, save_every_n=1, save_interval_seconds=0.2)
    caplog.set_level(logging.WARNING, logger="flowwarden")
    with (
        running(mongodb_uri, [handler], instance_id="east", checkpoint_store=store),
        running(mongodb_uri, [handler], instance_id="west", checkpoint_store=store),
    ):
        for i in range(20):
            client[db_name].orders.insert_one({"_id": i})
        wait_until(lambda: len(seen) >= 40, what="both instances handling every event")
        wait_until(
            lambda: any("also writes this stream's checkpoint" in r.getMessage() for r in caplog.records),
            timeout=10,
            what="the warning",
        )
    warning = next(r.getMessage() for r in caplog.records if "also writes" in r.getMessage())
    assert "'east'" in warning and "'west'" in warning and "single_leader" in warning


def test_a_second_process_with_the_same_instance_id_writing_the_checkpoint_is_warned_about(
    mongodb_uri, client, db_name, caplog
):
    """Two connectors configured with one instance id are still two writers: their instance
    tokens tell them apart, and the warning says that the ids are the same."""
    store = InMemoryCheckpointStore()
    handler, seen = recording_handler(db_name, save_every_n=1, save_interval_seconds=0.2)
    caplog.set_level(logging.WARNING, logger="flowwarden")
    with (
        running(mongodb_uri, [handler], instance_id="orders-1", checkpoint_store=store) as east,
        running(mongodb_uri, [handler], instance_id="orders-1", checkpoint_store=store) as west,
    ):
        for i in range(20):
            client[db_name].orders.insert_one({"_id": i})
        wait_until(lambda: len(seen) >= 40, what="both connectors handling every event")
        wait_until(
            lambda: any("also writes this stream's checkpoint" in r.getMessage() for r in caplog.records),
            timeout=10,
            what="the warning",
        )
    warning = next(r.getMessage() for r in caplog.records if "also writes" in r.getMessage())
    assert "same instance id 'orders-1'" in warning and "single_leader" in warning
    assert east.instance_token in warning and west.instance_token in warning


def test_one_instance_after_another_is_not_mistaken_for_two_writers(mongodb_uri, client, db_name, caplog):
    store = InMemoryCheckpointStore()
    handler, seen = recording_handler(db_name, save_every_n=1, save_interval_seconds=0.2)
    caplog.set_level(logging.DEBUG, logger="flowwarden")

    def checked_after_saving(instance: str) -> bool:
        check = f"checked for other writers; last saved by {instance!r}"
        return any(check in r.getMessage() for r in caplog.records)

    for instance in ("east", "west"):
        with running(mongodb_uri, [handler], instance_id=instance, checkpoint_store=store):
            client[db_name].orders.insert_one({"_id": instance})
            wait_until(lambda instance=instance: ("insert", instance) in seen)
            # Its own save found by its own check: the check ran after this instance took over.
            wait_until(lambda instance=instance: checked_after_saving(instance), what=f"{instance}'s check")
    assert not [r for r in caplog.records if "also writes" in r.getMessage()]
