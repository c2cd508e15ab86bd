"""`flowwarden checkpoints rewind`: one explicit target, checked against the server, never a new
record by accident, the old and the new position printed."""

from __future__ import annotations

import pytest

from flowwarden import StreamState
from flowwarden.checkpoints import Checkpoint, MongoCheckpointStore
from flowwarden.checkpoints.contract import sample_token
from flowwarden.cli import ExitCode, main
from flowwarden.testing import EmbeddedReplicaSet
from helpers import running, wait_until

from .handlers import recording_handler

PAST = sample_token(1_700_000_000, 3)


def rewind(uri: str, db: str, *extra: str) -> int:
    return main(["checkpoints", "rewind", "orders", "--uri", uri, "--database", db, *extra])


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flowwarden: "), err
    return lines[0]


@pytest.fixture
def store(client, db_name) -> MongoCheckpointStore:
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=sample_token(1_700_000_500, 1)))
    return store


def test_a_target_is_required(capsys, mongodb_uri, db_name, store):
    before = store.load("orders")
    assert rewind(mongodb_uri, db_name) == ExitCode.USAGE
    message = error_line(capsys.readouterr().err)
    assert "--to-token" in message and "--to-time" in message and "--to-start" in message
    assert rewind(mongodb_uri, db_name, "--to-start", "--to-token", '{"_data": "82"}') == ExitCode.USAGE
    assert store.load("orders") == before


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ('{"_data": "82zz"}', "hex"),
        ('{"_data": "82"}', "KeyString timestamp"),
        ('{"_data": "0102030405060708090A"}', "KeyString timestamp"),
        ('{"_data": 123}', "string"),
        ('{"_data": "826B04B1E6", "extra": 1}', "resume token"),
    ],
)
def test_a_token_the_server_could_not_resume_from_is_refused(capsys, mongodb_uri, db_name, store, token, why):
    before = store.load("orders")
    assert rewind(mongodb_uri, db_name, "--to-token", token) == ExitCode.USAGE
    assert why in error_line(capsys.readouterr().err)
    assert store.load("orders") == before


def test_a_token_after_the_server_cluster_time_is_refused(capsys, mongodb_uri, db_name, store):
    before = store.load("orders")
    future = '{"_data": "827FFFFFFF000000012B0429296E1404"}'
    assert rewind(mongodb_uri, db_name, "--to-token", future) == ExitCode.USAGE
    assert "ahead of the server" in error_line(capsys.readouterr().err)
    assert store.load("orders") == before


def test_a_token_prints_the_old_and_the_new_position(capsys, mongodb_uri, db_name, store):
    assert rewind(mongodb_uri, db_name, "--to-token", f'{{"_data": "{PAST["_data"]}"}}') == 0
    out = capsys.readouterr().out
    assert "before: resumes after 2023-11-14T22:21:40+00:00" in out
    assert f"now:    resumes after 2023-11-14T22:13:20+00:00 (lastProcessed token {PAST['_data']})" in out
    assert store.load("orders").resume_token == PAST


def test_a_misspelled_stream_is_refused_unless_created(capsys, mongodb_uri, client, db_name, store):
    args = ["checkpoints", "rewind", "ordres", "--uri", mongodb_uri, "--database", db_name]
    assert main([*args, "--to-token", f'{{"_data": "{PAST["_data"]}"}}']) == ExitCode.USAGE
    message = error_line(capsys.readouterr().err)
    assert "'ordres'" in message and "orders" in message and "--create" in message
    assert store.load("ordres") is None
    assert main([*args, "--to-token", f'{{"_data": "{PAST["_data"]}"}}', "--create"]) == 0
    assert store.load("ordres").resume_token == PAST


def test_to_start_forgets_the_position(capsys, mongodb_uri, db_name, store):
    assert rewind(mongodb_uri, db_name, "--to-start") == 0
    assert "start_position applies" in capsys.readouterr().out
    assert store.load("orders").resume_token is None


def test_a_time_becomes_the_servers_position_for_it(capsys, mongodb_uri, client, db_name, next_server_second):
    orders = client[db_name].orders
    handler, seen = recording_handler(db_name)
    with running(mongodb_uri, [handler]):
        orders.insert_one({"_id": "before"})
        moment = next_server_second()
        orders.insert_one({"_id": "after"})
        wait_until(lambda: len(seen) == 2)
    assert rewind(mongodb_uri, db_name, "--to-time", moment.isoformat()) == 0
    assert f"now:    resumes after {moment.isoformat()}" in capsys.readouterr().out
    seen.clear()
    with running(mongodb_uri, [handler]) as connector:
        wait_until(lambda: seen == [("insert", "after")], what="the write after the time")
        assert connector.status()["orders"].state == StreamState.RUNNING


@pytest.mark.parametrize("text", ["yesterday", "2026-11-20T08:00:00", "2026-13-01T00:00:00Z"])
def test_a_time_that_is_not_a_zoned_date_time_is_refused(capsys, mongodb_uri, db_name, store, text):
    assert rewind(mongodb_uri, db_name, "--to-time", text) == ExitCode.USAGE
    assert "time zone" in error_line(capsys.readouterr().err)


def test_a_time_in_the_future_is_refused(capsys, mongodb_uri, db_name, store):
    assert rewind(mongodb_uri, db_name, "--to-time", "2099-01-01T00:00:00Z") == ExitCode.USAGE
    assert "has passed" in error_line(capsys.readouterr().err)


@pytest.mark.embedded_only
def test_a_time_the_oplog_no_longer_reaches_is_refused(capsys):
    with EmbeddedReplicaSet(oplog_max_events=5) as rs:
        import pymongo

        with pymongo.MongoClient(rs.uri) as client:
            MongoCheckpointStore(client.shop).save(Checkpoint(stream_id="orders", last_processed_token=PAST))
            client.shop.orders.insert_many([{"_id": i} for i in range(20)])
        assert rewind(rs.uri, "shop", "--to-time", "2024-01-01T00:00:00Z") == ExitCode.USAGE
        assert "oldest entry" in error_line(capsys.readouterr().err)
