"""Oplog retention: the oplog window clients read, and ChangeStreamHistoryLost (286) when a resume
point fell out of it, both when a stream opens and when a cursor falls behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from bson import Timestamp
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure

from flowwarden.events import token_cluster_time

AWAIT_MS = 100
KEPT = 5
HISTORY_LOST = "Resume of change stream was not possible, as the resume point may no longer be in the oplog."


def next_change(stream: ChangeStream, attempts: int = 100) -> dict[str, Any]:
    for _ in range(attempts):
        change = stream.try_next()
        if change is not None:
            return change
    raise AssertionError("no change arrived")


def oplog_window(client: pymongo.MongoClient) -> tuple[Timestamp, Timestamp]:
    oplog = client.local["oplog.rs"]
    oldest = oplog.find({}, {"ts": 1}).sort("$natural", 1).limit(1).next()["ts"]
    newest = oplog.find({}, {"ts": 1}).sort("$natural", -1).limit(1).next()["ts"]
    return oldest, newest


@pytest.fixture
def small_oplog() -> Iterator[pymongo.MongoClient]:
    """A client of a replica set of its own that keeps only the newest KEPT oplog entries."""
    from flowwarden.testing import EmbeddedReplicaSet

    with EmbeddedReplicaSet(oplog_max_events=KEPT) as rs, pymongo.MongoClient(rs.uri) as client:
        yield client


@pytest.mark.usefixtures("replica_set_member")
def test_oplog_window_is_readable(client: pymongo.MongoClient, db_name: str) -> None:
    with client.start_session() as session:
        client[db_name].c.insert_one({"_id": 1}, session=session)
        written = session.operation_time
    assert written is not None
    oldest, newest = oplog_window(client)
    assert isinstance(oldest, Timestamp) and oldest <= written <= newest
    last = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()
    assert {"ts", "op", "ns", "o", "wall"} <= set(last)


@pytest.mark.embedded_only
def test_window_keeps_the_newest_entries(small_oplog: pymongo.MongoClient) -> None:
    coll = small_oplog.db.c
    coll.insert_many([{"_id": i} for i in range(20)])
    entries = list(small_oplog.local["oplog.rs"].find().sort("$natural", 1))
    assert len(entries) == KEPT
    assert [e["o"]["_id"] for e in entries] == list(range(15, 20))
    oldest, newest = oplog_window(small_oplog)
    assert (oldest, newest) == (entries[0]["ts"], entries[-1]["ts"])


@pytest.mark.embedded_only
def test_resume_after_a_lost_token_fails_at_aggregate(small_oplog: pymongo.MongoClient) -> None:
    coll = small_oplog.db.c
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 0})
        lost = next_change(stream)["_id"]
    coll.insert_many([{"_id": i} for i in range(1, 10)])
    for option in ({"resume_after": lost}, {"start_after": lost}):
        with pytest.raises(OperationFailure) as info:
            coll.watch(**option)
        assert info.value.code == 286
        assert info.value.details is not None and info.value.details["errmsg"] == HISTORY_LOST
        assert info.value.has_error_label("NonResumableChangeStreamError")
        assert not info.value.has_error_label("ResumableChangeStreamError")
    with pytest.raises(OperationFailure) as info:
        coll.watch(start_at_operation_time=token_cluster_time(lost))
    assert info.value.code == 286


@pytest.mark.embedded_only
def test_starting_at_the_oldest_kept_entry_works(small_oplog: pymongo.MongoClient) -> None:
    coll = small_oplog.db.c
    coll.insert_many([{"_id": i} for i in range(10)])
    oldest, _ = oplog_window(small_oplog)
    with coll.watch(start_at_operation_time=oldest, max_await_time_ms=AWAIT_MS) as stream:
        assert [next_change(stream)["documentKey"]["_id"] for _ in range(KEPT)] == list(range(5, 10))


@pytest.mark.embedded_only
def test_a_cursor_that_falls_behind_fails_at_get_more(small_oplog: pymongo.MongoClient) -> None:
    coll = small_oplog.db.c
    stream = coll.watch(batch_size=1, max_await_time_ms=AWAIT_MS)
    coll.insert_many([{"_id": i} for i in range(2)])
    assert next_change(stream)["documentKey"] == {"_id": 0}
    assert next_change(stream)["documentKey"] == {"_id": 1}
    coll.insert_many([{"_id": i} for i in range(2, 2 + 3 * KEPT)])
    with pytest.raises(OperationFailure) as info:
        next_change(stream)
    assert info.value.code == 286
    assert info.value.has_error_label("NonResumableChangeStreamError")
    assert not stream.alive


@pytest.mark.embedded_only
async def test_history_lost_through_the_async_client() -> None:
    from flowwarden.testing import EmbeddedReplicaSet

    with EmbeddedReplicaSet(oplog_max_events=KEPT) as rs:
        client: pymongo.AsyncMongoClient = pymongo.AsyncMongoClient(rs.uri)
        try:
            coll = client.db.c
            async with client.start_session() as session:
                await coll.insert_one({"_id": 0}, session=session)
                first = session.operation_time
            await coll.insert_many([{"_id": i} for i in range(1, 10)])
            with pytest.raises(OperationFailure) as info:
                await coll.watch(start_at_operation_time=first)
            assert info.value.code == 286
        finally:
            await client.close()
