"""EmbeddedReplicaSet's behaviour where a real MongoDB promises something else, or nothing a test
could wait for: these are its own rules, so they run only on the embedded server.

- the TTL monitor runs on ``ttlMonitorSleepSecs``, which the embedded server lets a test shorten;
- ``endSessions`` kills the ended sessions' cursors at once (MongoDB reaps them on its next session
  refresh, minutes later);
- resuming a collection stream with another collection's event token fails with 280, since the
  token's event is not in the stream.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pymongo
import pytest
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure


def _next_change(stream: ChangeStream, attempts: int = 100) -> dict[str, Any]:
    for _ in range(attempts):
        change = stream.try_next()
        if change is not None:
            return change
    raise AssertionError("no change arrived")


def test_ttl_monitor_deletes_expired_documents(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    old = datetime.datetime(2000, 1, 1)
    coll.insert_many([{"_id": "old", "at": old}, {"_id": "new", "at": datetime.datetime(2999, 1, 1)}])
    previous = client.admin.command("setParameter", 1, ttlMonitorSleepSecs=1)["was"]
    try:
        coll.create_index("at", expireAfterSeconds=10)
        # The TTL pass runs on the server's own schedule; wait for its visible effect.
        deadline = time.monotonic() + 20
        while coll.find_one({"_id": "old"}) is not None:
            assert time.monotonic() < deadline, "the TTL monitor never removed the expired document"
            time.sleep(0.05)
        assert coll.find_one({"_id": "new"}) is not None
    finally:
        client.admin.command("setParameter", 1, ttlMonitorSleepSecs=previous)


def test_end_sessions_kills_the_sessions_cursors_at_once(client: pymongo.MongoClient, db_name: str) -> None:
    client[db_name].c.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as session:
        cursor = client[db_name].c.find(batch_size=1, session=session)
        assert next(cursor) == {"_id": 0}
        assert cursor.cursor_id
        client.admin.command("endSessions", [session.session_id])
        with pytest.raises(OperationFailure) as gone:
            list(cursor)
    assert gone.value.code == 43


def test_a_token_from_another_collection_is_not_found(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    with db.other.watch(max_await_time_ms=100) as stream:
        db.other.insert_one({"_id": 1})
        foreign = _next_change(stream)["_id"]
    db.c.insert_one({"_id": 2})
    with pytest.raises(OperationFailure) as info:
        with db.c.watch(resume_after=foreign, max_await_time_ms=100) as resumed:
            _next_change(resumed)
    assert info.value.code == 280
    assert "the resume token was not found" in str(info.value)
