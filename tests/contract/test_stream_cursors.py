"""Change-stream cursors as the server carries them: aggregate, getMore, killCursors, and the
driver's automatic resume when a fail point fails a getMore or closes its connection.

The resumes after a killed cursor and after dropped connections are in test_change_streams.py,
where the resuming aggregate itself is checked.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable

import pymongo
import pytest
from bson import Int64
from pymongo.errors import OperationFailure
from wire_helpers import command, connect, op_msg, receive

FailCommand = Callable[..., dict]
"""The ``fail_command`` fixture (conftest.py): it switches the fail point off after each test."""


def _next_change(stream: pymongo.change_stream.ChangeStream, attempts: int = 50) -> dict:
    for _ in range(attempts):
        change = stream.try_next()
        if change is not None:
            return change
    raise AssertionError("no change arrived")


def test_aggregate_opens_a_cursor_and_get_more_serves_it(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("c")
    opened = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
    cursor = opened["cursor"]
    assert isinstance(cursor["id"], Int64) and cursor["id"] != 0
    assert cursor["ns"] == f"{db_name}.c"
    assert cursor["firstBatch"] == []
    assert "_data" in cursor["postBatchResumeToken"]
    db.c.insert_many([{"_id": i} for i in range(3)])
    batches = []
    while sum(len(b) for b in batches) < 3:
        more = db.command("getMore", cursor["id"], collection="c", batchSize=2, maxTimeMS=500)
        assert more["cursor"]["id"] == cursor["id"]
        assert "_data" in more["cursor"]["postBatchResumeToken"]
        assert len(more["cursor"]["nextBatch"]) <= 2
        batches.append(more["cursor"]["nextBatch"])
    assert [e["documentKey"]["_id"] for b in batches for e in b] == [0, 1, 2]
    with pytest.raises(OperationFailure) as wrong_ns:
        db.command("getMore", cursor["id"], collection="other")
    assert wrong_ns.value.code == 13
    killed = db.command("killCursors", "c", cursors=[cursor["id"]])
    assert killed["cursorsKilled"] == [cursor["id"]]
    with pytest.raises(OperationFailure) as gone:
        db.command("getMore", cursor["id"], collection="c")
    assert gone.value.code == 43


def test_database_stream_cursor_namespace(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    opened = db.command("aggregate", 1, pipeline=[{"$changeStream": {}}], cursor={})
    assert opened["cursor"]["ns"] == f"{db_name}.$cmd.aggregate"
    db.c.insert_one({"_id": 1})
    more = db.command("getMore", opened["cursor"]["id"], collection="$cmd.aggregate", maxTimeMS=500)
    deadline = time.monotonic() + 30
    while not more["cursor"]["nextBatch"]:
        assert time.monotonic() < deadline, "the database stream's getMores returned no event in 30 s"
        more = db.command("getMore", opened["cursor"]["id"], collection="$cmd.aggregate", maxTimeMS=500)
    assert more["cursor"]["nextBatch"][0]["ns"] == {"db": db_name, "coll": "c"}
    db.command("killCursors", "$cmd.aggregate", cursors=[opened["cursor"]["id"]])


def test_resume_after_fail_point_closes_the_connection(
    client: pymongo.MongoClient, db_name: str, fail_command: FailCommand
) -> None:
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=100) as stream:
        coll.insert_one({"_id": 1})
        assert _next_change(stream)["documentKey"] == {"_id": 1}
        fail_command({"times": 1}, failCommands=["getMore"], closeConnection=True)
        coll.insert_one({"_id": 2})
        assert _next_change(stream)["documentKey"] == {"_id": 2}


def test_resumable_error_code_from_a_fail_point(
    client: pymongo.MongoClient, db_name: str, fail_command: FailCommand
) -> None:
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=100) as stream:
        coll.insert_one({"_id": 1})
        assert _next_change(stream)["documentKey"] == {"_id": 1}
        # 43 is resumable by code alone; the fail point adds no label and the driver resumes.
        fail_command({"times": 1}, failCommands=["getMore"], errorCode=43)
        coll.insert_one({"_id": 2})
        assert _next_change(stream)["documentKey"] == {"_id": 2}


@pytest.mark.embedded_only
def test_get_more_interrupted_by_a_dropped_connection_kills_its_cursor(
    mongodb_uri: str, db_name: str, client: pymongo.MongoClient, rs
) -> None:
    client[db_name].create_collection("c")
    with connect(mongodb_uri) as sock:
        opened = command(
            sock, {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}, "$db": db_name}
        )
        cursor_id = opened["cursor"]["id"]
        with connect(mongodb_uri) as waiting:
            _, message = op_msg(
                {"getMore": cursor_id, "collection": "c", "maxTimeMS": 60_000, "$db": db_name}
            )
            waiting.sendall(message)
            time.sleep(0.05)  # a head start, so the probe below rarely races it for the cursor
            # A probe getMore is refused with CursorInUse once the long one is awaiting events. If
            # the probe took the cursor first, the long one was refused instead: send it again.
            for _ in range(500):
                probe = command(
                    sock, {"getMore": cursor_id, "collection": "c", "maxTimeMS": 1, "$db": db_name}
                )
                if probe.get("code") == 292:
                    break
                if select.select([waiting], [], [], 0)[0]:
                    assert receive(waiting).doc.get("code") == 292
                    waiting.sendall(message)
                    time.sleep(0.05)
            else:
                raise AssertionError("the getMore never started waiting")
            rs.drop_connections()
    with connect(mongodb_uri) as sock:
        gone = command(sock, {"getMore": cursor_id, "collection": "c", "$db": db_name})
    assert gone["ok"] == 0 and gone["code"] == 43
