"""Resume tokens as clients see them: shape, order, cluster time, and resuming from every one,
from a replica set and through a mongos."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pymongo
import pytest
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure

from flowwarden.events import compare_tokens, token_cluster_time

pytestmark = pytest.mark.through_mongos

AWAIT_MS = 100
HEX = re.compile(r"\A[0-9A-F]+\Z")


def next_change(stream: ChangeStream, attempts: int = 100) -> dict[str, Any]:
    for _ in range(attempts):
        change = stream.try_next()
        if change is not None:
            return change
    raise AssertionError("no change arrived")


def test_tokens_are_uppercase_hex_starting_with_the_cluster_time(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        event = next_change(stream)
        post_batch = stream.resume_token
    for token in (event["_id"], post_batch):
        assert set(token) <= {"_data", "_typeBits"}
        assert HEX.match(token["_data"]) and token["_data"].startswith("82")
    assert token_cluster_time(event["_id"]) == event["clusterTime"]


def test_tokens_increase_in_event_order(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("c")
    with db.c.watch(max_await_time_ms=AWAIT_MS) as stream:
        db.c.insert_many([{"_id": i} for i in range(3)])
        with client.start_session() as session, session.start_transaction():
            db.c.insert_many([{"_id": i} for i in range(3, 6)], session=session)
        db.c.delete_many({})
        events = [next_change(stream) for _ in range(12)]
    tokens = [e["_id"] for e in events]
    assert all(compare_tokens(a, b) == -1 for a, b in itertools.pairwise(tokens))
    times = [token_cluster_time(t) for t in tokens]
    assert times == sorted(times)
    assert times[3] == times[4] == times[5]  # one transaction, one cluster time


def test_resuming_after_each_token_gives_exactly_the_rest(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("c")
    with db.c.watch(max_await_time_ms=AWAIT_MS) as stream:
        db.c.insert_one({"_id": 0})
        with client.start_session() as session, session.start_transaction():
            db.c.insert_many([{"_id": 1}, {"_id": 2}], session=session)
        db.c.insert_one({"_id": 3})
        events = [next_change(stream) for _ in range(4)]
    for position, event in enumerate(events[:-1]):
        with db.c.watch(resume_after=event["_id"], max_await_time_ms=AWAIT_MS) as resumed:
            rest = [next_change(resumed)["documentKey"]["_id"] for _ in range(3 - position)]
        assert rest == list(range(position + 1, 4))
    with db.c.watch(start_after=events[0]["_id"], max_await_time_ms=AWAIT_MS) as started:
        assert next_change(started)["documentKey"] == {"_id": 1}


def test_post_batch_token_sorts_after_every_returned_event(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_many([{"_id": i} for i in range(3)])
        events = [next_change(stream) for _ in range(3)]
        assert stream.try_next() is None
        idle = stream.resume_token
    assert compare_tokens(idle, events[-1]["_id"]) >= 0
    coll.insert_one({"_id": 3})
    with coll.watch(resume_after=idle, max_await_time_ms=AWAIT_MS) as resumed:
        assert next_change(resumed)["documentKey"] == {"_id": 3}


def test_first_batch_token_of_a_new_stream_is_a_safe_start(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": "before"})
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        start = stream.resume_token
    assert start is not None
    coll.insert_one({"_id": "after"})
    with coll.watch(resume_after=start, max_await_time_ms=AWAIT_MS) as resumed:
        assert next_change(resumed)["documentKey"] == {"_id": "after"}


@pytest.mark.parametrize("token", [{"_data": "not hex"}, {"_data": 12}, {"other": "x"}])
def test_malformed_tokens_are_refused(
    client: pymongo.MongoClient, db_name: str, token: dict[str, Any]
) -> None:
    with pytest.raises(OperationFailure):
        client[db_name].c.watch(resume_after=token)
