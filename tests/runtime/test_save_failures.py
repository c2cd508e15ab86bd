"""A stream whose checkpoint store fails or does not answer is not ready, and says why: in its
status, on /readyz (read over HTTP), in the metrics and the progress line; once a save gets through
it is ready again, and every event was handled once."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

import pymongo
import pytest

from flowwarden import Connector, StreamState
from flowwarden.checkpoints import MongoCheckpointStore
from flowwarden.runtime import save_health
from flowwarden.testing import EmbeddedReplicaSet
from helpers import wait_until

from .conftest import FailCommand
from .handlers import recording_handler
from .test_metrics import get, samples, value

_LONGER_THAN_THE_TEST = 600.0


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    # The product waits SAVE_GRACE_SECONDS (10 s) before it calls a stream unable to save.
    monkeypatch.setattr(save_health, "SAVE_GRACE_SECONDS", 0.5)


def readyz(connector: Connector) -> tuple[int, dict]:
    status, body = get(connector, "/readyz")
    return status, json.loads(body)


def stream_saves_again(connector: Connector) -> bool:
    status = connector.status()["orders"]
    return (
        readyz(connector)[0] == 200
        and status.cannot_save_since is None
        and status.save_failures_in_row == 0
        and status.last_save_error is None
    )


@pytest.mark.embedded_only
def test_a_checkpoint_store_that_does_not_answer_makes_the_stream_not_ready_until_it_does(
    mongodb_uri, client, db_name, caplog
):
    caplog.set_level(logging.INFO, logger="flowwarden")
    handler, seen = recording_handler(db_name, save_every_n=1, save_interval_seconds=0.2)
    orders = client[db_name].orders
    # The checkpoints live on a deployment of their own, which goes away while events come in.
    with EmbeddedReplicaSet() as store_rs, pymongo.MongoClient(store_rs.uri) as store_client:
        store = MongoCheckpointStore(store_client[db_name])
        connector = Connector(
            mongodb_uri, [handler], checkpoint_store=store, metrics_port=0, progress_interval=0.2
        )
        connector.start()
        try:
            orders.insert_one({"_id": 0})
            wait_until(
                lambda: (stored := store.load("orders")) is not None and stored.events_processed == 1,
                what="event 0 saved",
            )
            assert readyz(connector) == (200, {"ready": True, "not_ready": {}})

            store_rs.outage(_LONGER_THAN_THE_TEST)
            orders.insert_many([{"_id": i} for i in range(1, 4)])
            body = wait_until(
                lambda: (reply := readyz(connector))[0] == 503 and reply[1], what="/readyz to fail"
            )
            problem = body["not_ready"]["orders"]
            assert body["ready"] is False and list(body["not_ready"]) == ["orders"]
            assert problem.startswith("RUNNING: cannot save its checkpoint since ")
            assert problem.endswith("the checkpoint store has not answered")
            status = connector.status()["orders"]
            assert status.state == StreamState.RUNNING
            assert status.cannot_save_since is not None
            assert status.cannot_save_since <= datetime.now(timezone.utc)
            assert status.save_failures_in_row == 0 and status.last_save_error is None
            # With save_every_n=1 the stream waits for the save of event 1 before handling more.
            assert [key for _, key in seen] == [0, 1]
            found = samples(connector)
            assert value(found, "flowwarden_checkpoint_save_failing_seconds", stream="orders") > 0
            assert value(found, "flowwarden_checkpoint_save_failures_in_row", stream="orders") == 0
            wait_until(
                lambda: any(
                    r.levelno == logging.WARNING and "cannot save its checkpoint since" in r.getMessage()
                    for r in caplog.records
                ),
                what="a progress line saying the stream cannot save",
            )

            store_rs.outage(0)
            wait_until(lambda: stream_saves_again(connector), what="/readyz and the status to recover")
            wait_until(lambda: len(seen) == 4, what="the events that waited")
            found = samples(connector)
            assert value(found, "flowwarden_checkpoint_save_failing_seconds", stream="orders") == 0
            wait_until(
                lambda: store.load("orders").events_processed == 4, what="the last event's position saved"
            )
        finally:
            connector.stop()
    assert seen == [("insert", i) for i in range(4)]  # each event once, in order


def test_failing_checkpoint_writes_show_in_status_and_readyz_until_a_save_succeeds(
    mongodb_uri, client, db_name, fail_command: FailCommand
):
    # save_interval_seconds=0: only the events' own saves write, so each failure is one event's.
    handler, seen = recording_handler(db_name, save_every_n=1, save_interval_seconds=0)
    orders = client[db_name].orders
    connector = Connector(mongodb_uri, [handler], metrics_port=0)
    connector.start()
    try:
        orders.insert_one({"_id": 0})
        wait_until(lambda: connector.status()["orders"].events_processed == 1, what="event 0")
        assert readyz(connector)[0] == 200

        # A majority write concern the replica set cannot satisfy (its secondaries are down).
        fail_command(
            ["update"],
            mode="alwaysOn",
            namespace=f"{db_name}._fw_checkpoints",
            writeConcernError={
                "code": 64,
                "codeName": "WriteConcernFailed",
                "errmsg": "waiting for replication timed out",
                "errInfo": {"wtimeout": True},
            },
        )
        orders.insert_many([{"_id": i} for i in range(1, 4)])
        wait_until(lambda: connector.status()["orders"].save_failures_in_row == 3, what="3 failed saves")
        body = wait_until(lambda: (reply := readyz(connector))[0] == 503 and reply[1], what="/readyz to fail")
        problem = body["not_ready"]["orders"]
        assert problem.startswith("RUNNING: cannot save its checkpoint since ")
        assert "3 failed saves in a row, the last: CheckpointError: stream 'orders'" in problem
        assert "waiting for replication timed out" in problem
        status = connector.status()["orders"]
        assert status.state == StreamState.RUNNING
        assert status.last_save_error is not None and status.last_save_error in problem
        assert "\n" not in status.last_save_error
        assert status.cannot_save_since is not None
        found = samples(connector)
        assert value(found, "flowwarden_checkpoint_save_failures_in_row", stream="orders") == 3
        assert value(found, "flowwarden_checkpoint_save_failures_total", stream="orders") == 3
        assert value(found, "flowwarden_checkpoint_save_failing_seconds", stream="orders") > 0
        assert fail_command.off() == 3  # the three saves, and nothing else of the stream

        orders.insert_one({"_id": 4})  # its save is the first to get through
        wait_until(lambda: stream_saves_again(connector), what="/readyz and the status to recover")
        assert readyz(connector) == (200, {"ready": True, "not_ready": {}})
        found = samples(connector)
        assert value(found, "flowwarden_checkpoint_save_failures_in_row", stream="orders") == 0
        assert value(found, "flowwarden_checkpoint_save_failing_seconds", stream="orders") == 0
    finally:
        connector.stop()
    assert seen == [("insert", i) for i in range(5)]  # each event once, in order
