"""The change-stream engine against an in-process fake host (no sockets, no server).

Real-client behaviour is covered by tests/contract/; these tests pin the engine's rules one by one:
namespaces, resume points, post-batch resume tokens, invalidation, images, stages, retention.
"""

from __future__ import annotations

import asyncio
from typing import Any

import bson
import pytest
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st
from token_format import compare_tokens, token_cluster_time

from flowwarden_embedded.changestream import ChangeStreamCursor, open_change_stream
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.eventbson import classic_document_event_bson
from flowwarden_embedded.oplog import Oplog, OplogOp
from flowwarden_embedded.rawstrings import encode
from flowwarden_embedded.tokens import decode_token, event_token_data, high_water_mark, ts_key


class FakeHost:
    """The two lookups a change stream makes, over plain dicts."""

    def __init__(self, max_events: int | None = None) -> None:
        self.oplog = Oplog(max_events)
        self.docs: dict[tuple[str, str, Any], dict[str, Any]] = {}

    def lookup_document(self, db: str, coll: str, document_key: dict[str, Any]) -> dict[str, Any] | None:
        return self.docs.get((db, coll, document_key.get("_id")))

    def collection_options(self, db: str, coll: str) -> dict[str, Any] | None:
        return {}

    # writes, logged as the server logs them
    def insert(self, i: Any, coll: str = "c", db: str = "db", **extra: Any) -> Timestamp:
        doc = {"_id": i, **extra}
        self.docs[(db, coll, i)] = doc
        return self.oplog.append([OplogOp("insert", db, coll, {"_id": i}, after=doc)])

    def update(
        self, i: Any, changes: dict[str, Any], coll: str = "c", db: str = "db", images: bool = False
    ) -> Timestamp:
        before = self.docs[(db, coll, i)]
        after = {**before, **changes}
        self.docs[(db, coll, i)] = after
        op = OplogOp("update", db, coll, {"_id": i}, before=before, after=after, pre_image_recorded=images)
        return self.oplog.append([op])

    def delete(self, i: Any, coll: str = "c", db: str = "db", images: bool = False) -> Timestamp:
        before = self.docs.pop((db, coll, i))
        op = OplogOp("delete", db, coll, {"_id": i}, before=before, pre_image_recorded=images)
        return self.oplog.append([op])


async def open_stream(
    host: FakeHost,
    spec: dict[str, Any] | None = None,
    *stages: dict[str, Any],
    db: str = "db",
    coll: str | None = "c",
) -> ChangeStreamCursor:
    pipeline: list[dict[str, Any]] = [{"$changeStream": spec or {}}, *stages]
    return await open_change_stream(host, db, coll, pipeline, {"aggregate": coll or 1, "pipeline": pipeline})


async def next_batch(
    cursor: ChangeStreamCursor, size: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    batch, extra = await cursor.fetch(size, 0, first=False)
    return [bson.decode(doc.raw) for doc in batch], extra["postBatchResumeToken"]


async def drain(cursor: ChangeStreamCursor) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        batch, _ = await next_batch(cursor)
        if not batch:
            return events
        events.extend(batch)


async def refused(code: int, coroutine: Any) -> CommandError:
    with pytest.raises(CommandError) as info:
        await coroutine
    assert info.value.code == code, info.value.errmsg
    return info.value


# -- opening --------------------------------------------------------------------------------------


async def test_a_new_stream_starts_after_the_newest_write() -> None:
    host = FakeHost()
    host.insert(1)
    cursor = await open_stream(host)
    first, extra = await cursor.fetch(None, None, first=True)
    assert first == [] and not cursor.exhausted
    assert token_cluster_time(extra["postBatchResumeToken"]).time >= host.oplog.cluster_time.time
    host.insert(2)
    events = await drain(cursor)
    assert [e["documentKey"] for e in events] == [{"_id": 2}]


async def test_namespaces_of_streams() -> None:
    host = FakeHost()
    ns = {
        "coll": await open_stream(host),
        "db": await open_stream(host, coll=None),
        "cluster": await open_stream(host, {"allChangesForCluster": True}, db="admin", coll=None),
    }
    assert [c.ns for c in ns.values()] == ["db.c", "db.$cmd.aggregate", "admin.$cmd.aggregate"]
    host.insert(1)
    host.insert(2, coll="other")
    host.insert(3, db="elsewhere")
    host.insert(4, coll="system.views")
    host.insert(5, db="admin", coll="x")
    host.insert(6, db="config", coll="x")
    seen = {name: [e["documentKey"]["_id"] for e in await drain(c)] for name, c in ns.items()}
    assert seen == {"coll": [1], "db": [1, 2], "cluster": [1, 2, 3]}


@pytest.mark.parametrize(
    ("db", "coll", "spec", "code", "message"),
    [
        ("db", "c", {"allChangesForCluster": True}, 72, "may only be opened on the 'admin' database"),
        ("admin", None, {}, 73, "may not be opened on the internal admin database"),
        ("local", "c", {}, 73, "internal local database"),
        ("config", "c", {}, 73, "internal config database"),
        ("db", "system.views", {}, 73, "internal db.system.views collection"),
        ("db", "c", {"bogus": 1}, 40415, "BSON field '$changeStream.bogus' is an unknown field."),
        ("db", "c", {"fullDocument": 1}, 14, "is the wrong type 'int', expected type 'string'"),
        ("db", "c", {"showExpandedEvents": 1}, 14, "expected type 'bool'"),
        ("db", "c", {"fullDocument": "always"}, 2, "Enumeration value 'always' for field"),
        ("db", "c", {"fullDocumentBeforeChange": "updateLookup"}, 2, "is not a valid value."),
        (
            "db",
            "c",
            {"resumeAfter": {"_data": "82"}, "startAfter": {"_data": "82"}},
            50865,
            "Do not specify both",
        ),
    ],
)
async def test_bad_requests_are_refused_like_mongodb(
    db: str, coll: str | None, spec: dict[str, Any], code: int, message: str
) -> None:
    error = await refused(code, open_stream(FakeHost(), spec, db=db, coll=coll))
    assert message in error.errmsg
    assert "NonResumableChangeStreamError" not in error.labels


async def test_stage_spec_must_be_a_document() -> None:
    host = FakeHost()
    error = await refused(50808, open_change_stream(host, "db", "c", [{"$changeStream": 1}], {}))
    assert error.errmsg == "$changeStream stage expects a document as argument"


async def test_token_and_start_time_together_are_refused() -> None:
    host = FakeHost()
    host.insert(1)
    cursor = await open_stream(host, {"startAtOperationTime": Timestamp(1, 1)})
    (event,), _ = await next_batch(cursor)
    error = await refused(
        40674, open_stream(host, {"resumeAfter": event["_id"], "startAtOperationTime": Timestamp(1, 1)})
    )
    assert error.errmsg == "Only one type of resume option is allowed, but multiple were found"


async def test_database_level_tokens_cannot_resume_a_collection_stream() -> None:
    host = FakeHost()
    host.insert(1)
    db_stream = await open_stream(host, {"startAtOperationTime": Timestamp(1, 1)}, coll=None)
    host.oplog.append([OplogOp("dropDatabase", "db", None)])
    events = await drain(db_stream)
    assert [e["operationType"] for e in events] == ["insert", "drop", "dropDatabase", "invalidate"]
    error = await refused(260, open_stream(host, {"startAfter": events[2]["_id"]}))
    assert "does not include a UUID" in error.errmsg


# -- batches and waiting ------------------------------------------------------------------------


async def test_first_batch_and_get_more_honour_batch_size() -> None:
    host = FakeHost()
    start = host.oplog.cluster_time
    for i in range(250):
        host.insert(i)
    cursor = await open_stream(host, {"startAtOperationTime": start})
    first, _ = await cursor.fetch(None, None, first=True)
    assert len(first) == 101  # MongoDB's default first batch
    assert len((await cursor.fetch(7, 0, first=False))[0]) == 7
    assert len((await cursor.fetch(None, 0, first=False))[0]) == 142
    cursor = await open_stream(host, {"startAtOperationTime": start})
    assert (await cursor.fetch(0, None, first=True))[0] == []
    assert len((await cursor.fetch(5, None, first=True))[0]) == 5


async def test_get_more_waits_for_new_events() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    await cursor.fetch(None, None, first=True)
    pending = asyncio.ensure_future(cursor.fetch(None, 60_000, first=False))
    await asyncio.sleep(0)
    assert not pending.done()
    host.insert(1)
    batch, _ = await asyncio.wait_for(pending, 10)
    assert [bson.decode(d.raw)["documentKey"] for d in batch] == [{"_id": 1}]


async def test_get_more_returns_empty_after_max_time() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    batch, extra = await asyncio.wait_for(cursor.fetch(None, 20, first=False), 10)
    assert batch == [] and "postBatchResumeToken" in extra


async def test_a_filtered_event_does_not_end_the_wait() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, {"$match": {"operationType": "delete"}})
    pending = asyncio.ensure_future(cursor.fetch(None, 60_000, first=False))
    await asyncio.sleep(0)
    host.insert(1)
    await asyncio.sleep(0)
    assert not pending.done()
    host.delete(1)
    batch, _ = await asyncio.wait_for(pending, 10)
    assert [bson.decode(d.raw)["operationType"] for d in batch] == ["delete"]


async def test_close_ends_a_waiting_get_more() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    pending = asyncio.ensure_future(cursor.fetch(None, 60_000, first=False))
    await asyncio.sleep(0)
    cursor.close()
    batch, _ = await asyncio.wait_for(pending, 10)
    assert batch == [] and cursor.exhausted


# -- events ---------------------------------------------------------------------------------------


async def test_event_documents_have_mongodb_fields() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    host.insert(1, v=1)
    host.update(1, {"v": 2, "w": [1]})
    host.oplog.append(
        [OplogOp("replace", "db", "c", {"_id": 1}, before={"_id": 1}, after={"_id": 1, "r": 1})]
    )
    host.delete(1)
    insert, update, replace, delete = await drain(cursor)
    assert list(insert) == [
        "_id",
        "operationType",
        "clusterTime",
        "wallTime",
        "fullDocument",
        "ns",
        "documentKey",
    ]
    assert insert["fullDocument"] == {"_id": 1, "v": 1} and insert["ns"] == {"db": "db", "coll": "c"}
    assert list(update) == [
        "_id",
        "operationType",
        "clusterTime",
        "wallTime",
        "ns",
        "documentKey",
        "updateDescription",
    ]
    assert update["updateDescription"] == {
        "updatedFields": {"v": 2, "w": [1]},
        "removedFields": [],
        "truncatedArrays": [],
    }
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "r": 1}
    assert list(delete) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey"]
    for event in (insert, update, replace, delete):
        assert token_cluster_time(event["_id"]) == event["clusterTime"]
        assert "collectionUUID" not in event


async def test_transaction_events_share_cluster_time_and_carry_session_ids() -> None:
    host = FakeHost()
    cursor = await open_stream(host, coll=None)
    lsid = {"id": Binary(b"\x05" * 16, 4)}
    ops = [OplogOp("insert", "db", c, {"_id": i}, after={"_id": i}) for i, c in enumerate(["c", "x", "c"])]
    ts = host.oplog.append(ops, lsid=lsid, txn_number=3)
    events = await drain(cursor)
    assert [e["clusterTime"] for e in events] == [ts, ts, ts]
    assert all(e["lsid"] == lsid and e["txnNumber"] == Int64(3) for e in events)
    assert [decode_token(e["_id"]).txn_op_index for e in events] == [0, 1, 2]
    assert compare_tokens(events[0]["_id"], events[1]["_id"]) == -1
    # resuming between two operations of one transaction delivers the rest of it
    resumed = await open_stream(host, {"resumeAfter": events[0]["_id"]}, coll=None)
    assert [e["documentKey"] for e in await drain(resumed)] == [{"_id": 1}, {"_id": 2}]


async def test_a_batch_may_end_inside_a_transaction() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    host.oplog.append(
        [OplogOp("insert", "db", "c", {"_id": i}, after={"_id": i}) for i in range(5)],
        lsid={"id": 1},
        txn_number=1,
    )
    first, pbrt = await next_batch(cursor, 2)
    assert pbrt == first[-1]["_id"]
    rest = await drain(cursor)
    assert [e["documentKey"]["_id"] for e in first + rest] == [0, 1, 2, 3, 4]


async def test_expanded_events_only_when_asked() -> None:
    host = FakeHost()
    classic = await open_stream(host)
    expanded = await open_stream(host, {"showExpandedEvents": True})
    host.oplog.append([OplogOp("create", "db", "c", description={"create": "c"})])
    host.insert(1)
    index = {"v": 2, "key": {"a": 1}, "name": "a_1"}
    host.oplog.append([OplogOp("createIndexes", "db", "c", description=index)])
    host.oplog.append([OplogOp("dropIndexes", "db", "c", description={"indexes": [index]})])
    host.oplog.append(
        [
            OplogOp(
                "modify",
                "db",
                "c",
                description={"validationLevel": "off", "stateBeforeChange": {"collectionOptions": {}}},
            )
        ]
    )
    host.update(1, {"a": {"0": 1}})
    assert [e["operationType"] for e in await drain(classic)] == ["insert", "update"]
    events = await drain(expanded)
    assert [e["operationType"] for e in events] == [
        "create",
        "insert",
        "createIndexes",
        "dropIndexes",
        "modify",
        "update",
    ]
    create, insert, create_index, drop_index, modify, update = events
    uuid = host.oplog.collection_uuid("db", "c")
    assert all(e["collectionUUID"] == uuid for e in events)
    assert create["operationDescription"] == {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    assert create["nsType"] == "collection"
    assert create_index["operationDescription"] == {"indexes": [index]}
    assert drop_index["operationDescription"] == {"indexes": [index]}
    assert modify["operationDescription"] == {"validationLevel": "off"}
    assert modify["stateBeforeChange"] == {"collectionOptions": {}}
    assert update["updateDescription"]["disambiguatedPaths"] == {}
    assert "operationDescription" not in insert


async def test_raw_update_description_on_request() -> None:
    host = FakeHost()
    host.insert(1, v=1)
    cursor = await open_stream(host, {"showRawUpdateDescription": True})
    host.update(1, {"v": 2})
    (event,) = await drain(cursor)
    assert event["rawUpdateDescription"] == {"$v": 2, "diff": {"u": {"v": 2}}}
    assert "updateDescription" not in event


# -- images ---------------------------------------------------------------------------------------


async def test_update_lookup_reads_the_current_document() -> None:
    host = FakeHost()
    host.insert(1, v=1)
    cursor = await open_stream(host, {"fullDocument": "updateLookup"})
    host.update(1, {"v": 2})
    host.update(1, {"v": 3})
    host.insert(2)
    host.update(2, {"v": 1})
    host.delete(2)
    events = await drain(cursor)
    # updateLookup reads the document as it is now, not as it was after the update
    assert [e.get("fullDocument") for e in events if e["operationType"] == "update"] == [
        {"_id": 1, "v": 3},
        {"_id": 1, "v": 3},
        None,
    ]
    assert list(events[0])[-1] == "fullDocument"


async def test_post_and_pre_images_when_recorded() -> None:
    host = FakeHost()
    host.insert(1, v=1)
    host.insert(2, v=1)
    cursor = await open_stream(
        host, {"fullDocument": "whenAvailable", "fullDocumentBeforeChange": "whenAvailable"}
    )
    host.update(1, {"v": 2}, images=True)
    host.update(2, {"v": 2}, images=False)
    host.delete(1, images=True)
    with_images, without, delete = await drain(cursor)
    assert with_images["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
    assert with_images["fullDocument"] == {"_id": 1, "v": 2}
    assert without["fullDocumentBeforeChange"] is None and without["fullDocument"] is None
    assert delete["fullDocumentBeforeChange"] == {"_id": 1, "v": 2}
    assert list(with_images)[-2:] == ["fullDocumentBeforeChange", "fullDocument"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"fullDocumentBeforeChange": "required"},
            "require a pre-image for all update, delete and replace events",
        ),
        ({"fullDocument": "required"}, "require a post-image for all update events"),
    ],
)
async def test_required_images_fail_when_missing(spec: dict[str, Any], message: str) -> None:
    host = FakeHost()
    host.insert(1, v=1)
    cursor = await open_stream(host, spec)
    host.update(1, {"v": 2})
    error = await refused(47, next_batch(cursor))
    assert message in error.errmsg
    assert 'operationType: "update", ns: {db: "db", coll: "c"}, clusterTime: Timestamp(' in error.errmsg
    assert error.code_name == "NoMatchingDocument"


async def test_a_match_that_ignores_images_runs_before_them() -> None:
    host = FakeHost()
    host.insert(1, v=1)
    host.insert(2, v=1)
    cursor = await open_stream(
        host, {"fullDocumentBeforeChange": "required"}, {"$match": {"documentKey._id": 2}}
    )
    host.update(1, {"v": 2}, images=False)  # would fail "required", but the filter drops it first
    host.update(2, {"v": 2}, images=True)
    (event,) = await drain(cursor)
    assert event["fullDocumentBeforeChange"] == {"_id": 2, "v": 1}


# -- resume points --------------------------------------------------------------------------------


async def test_resume_after_an_event_delivers_what_follows() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    for i in range(5):
        host.insert(i)
    events = await drain(cursor)
    resumed = await open_stream(host, {"resumeAfter": events[1]["_id"]})
    first, extra = await resumed.fetch(None, None, first=True)
    assert [bson.decode(d.raw)["documentKey"]["_id"] for d in first] == [2, 3, 4]
    assert extra["postBatchResumeToken"] == events[4]["_id"]


async def test_resume_token_must_be_found() -> None:
    host = FakeHost()
    other = await open_stream(host, coll="other")
    host.insert(1, coll="other")
    host.insert(2)
    (foreign,) = await drain(other)
    resumed = await open_stream(host, {"resumeAfter": foreign["_id"]})
    error = await refused(280, resumed.fetch(None, None, first=True))
    assert error.errmsg.startswith('cannot resume stream; the resume token was not found. {_data: "82')
    assert error.labels == ["NonResumableChangeStreamError"]


async def test_start_at_operation_time_includes_that_time() -> None:
    host = FakeHost()
    host.insert(0)
    ts = host.insert(1)
    host.insert(2)
    cursor = await open_stream(host, {"startAtOperationTime": ts})
    assert [e["documentKey"]["_id"] for e in await drain(cursor)] == [1, 2]


async def test_post_batch_resume_token_advances_on_filtered_streams() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, {"$match": {"operationType": "delete"}})
    _, initial = await next_batch(cursor)
    host.insert(1)
    host.insert(2)
    batch, pbrt = await next_batch(cursor)
    assert batch == []
    assert compare_tokens(pbrt, initial) == 1
    assert token_cluster_time(pbrt) == host.oplog.cluster_time
    assert decode_token(pbrt).is_high_water_mark
    # resuming from it delivers exactly what comes next
    host.delete(1)
    resumed = await open_stream(host, {"resumeAfter": pbrt}, {"$match": {"operationType": "delete"}})
    (event,) = await drain(resumed)
    assert event["documentKey"] == {"_id": 1}


async def test_pbrt_of_an_idle_stream_never_goes_back() -> None:
    host = FakeHost()
    host.insert(1)
    cursor = await open_stream(host)
    _, before = await next_batch(cursor)
    _, after = await next_batch(cursor)
    assert after == before
    host.insert(2)
    (event,), pbrt = await next_batch(cursor)
    assert pbrt == event["_id"] and compare_tokens(pbrt, before) == 1


async def test_resuming_from_the_high_water_mark_repeats_nothing() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, {"$match": {"documentKey._id": {"$gte": 10}}})
    host.insert(1)
    _, pbrt = await next_batch(cursor)
    host.insert(10)
    host.insert(2)
    host.insert(11)
    resumed = await open_stream(host, {"resumeAfter": pbrt}, {"$match": {"documentKey._id": {"$gte": 10}}})
    assert [e["documentKey"]["_id"] for e in await drain(resumed)] == [10, 11]


# -- invalidation ---------------------------------------------------------------------------------


async def test_drop_invalidates_a_collection_stream() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    host.insert(1)
    host.oplog.append([OplogOp("drop", "db", "c")])
    host.insert(2)  # the collection is created again; the stream is over already
    events, pbrt = await next_batch(cursor)
    assert [e["operationType"] for e in events] == ["insert", "drop", "invalidate"]
    assert list(events[2]) == ["_id", "operationType", "clusterTime", "wallTime"]
    assert events[1]["clusterTime"] == events[2]["clusterTime"]
    assert compare_tokens(events[1]["_id"], events[2]["_id"]) == -1
    assert decode_token(events[2]["_id"]).from_invalidate
    assert pbrt == events[2]["_id"] and cursor.exhausted
    assert (await cursor.fetch(None, 0, first=False))[0] == []

    # startAfter the invalidate: a new stream from there, not invalidated again
    after = await open_stream(host, {"startAfter": events[2]["_id"]})
    assert [e["documentKey"]["_id"] for e in await drain(after)] == [2]
    assert not after.exhausted
    # resumeAfter the drop event itself: the invalidate follows, then the end
    again = await open_stream(host, {"resumeAfter": events[1]["_id"]})
    assert [e["operationType"] for e in await drain(again)] == ["invalidate"]
    assert again.exhausted
    # resumeAfter an invalidate is refused
    error = await refused(260, open_stream(host, {"resumeAfter": events[2]["_id"]}))
    assert error.errmsg == (
        "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
        "invalidate notification"
    )


async def test_invalidate_after_a_full_batch_comes_in_the_next_one() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    host.insert(1)
    host.oplog.append([OplogOp("drop", "db", "c")])
    first, pbrt = await next_batch(cursor, 2)
    assert [e["operationType"] for e in first] == ["insert", "drop"] and pbrt == first[1]["_id"]
    assert not cursor.exhausted
    second, pbrt = await next_batch(cursor, 2)
    assert [e["operationType"] for e in second] == ["invalidate"] and cursor.exhausted


async def test_renames_invalidate_source_and_target_streams() -> None:
    host = FakeHost()
    source = await open_stream(host, coll="a")
    target = await open_stream(host, coll="b")
    database = await open_stream(host, coll=None)
    host.insert(1, coll="a")
    host.oplog.append(
        [
            OplogOp(
                "rename",
                "db",
                "a",
                to=("db", "b"),
                description={"to": {"db": "db", "coll": "b"}, "dropTarget": False},
            )
        ]
    )
    src_events = await drain(source)
    assert [e["operationType"] for e in src_events] == ["insert", "rename", "invalidate"]
    rename = src_events[1]
    assert rename["ns"] == {"db": "db", "coll": "a"} and rename["to"] == {"db": "db", "coll": "b"}
    assert [e["operationType"] for e in await drain(target)] == ["rename", "invalidate"]
    assert [e["operationType"] for e in await drain(database)] == ["insert", "rename"]
    assert not database.exhausted


async def test_drop_database_invalidates_database_streams_only() -> None:
    host = FakeHost()
    coll = await open_stream(host)
    database = await open_stream(host, coll=None)
    cluster = await open_stream(host, {"allChangesForCluster": True}, db="admin", coll=None)
    host.insert(1)
    host.oplog.append([OplogOp("dropDatabase", "db", None)])
    assert [e["operationType"] for e in await drain(coll)] == ["insert", "drop", "invalidate"]
    db_events = await drain(database)
    assert [e["operationType"] for e in db_events] == ["insert", "drop", "dropDatabase", "invalidate"]
    assert db_events[2]["ns"] == {"db": "db"}
    assert [e["operationType"] for e in await drain(cluster)] == ["insert", "drop", "dropDatabase"]
    assert not cluster.exhausted


async def test_a_filtered_invalidate_still_ends_the_stream() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, {"$match": {"operationType": "insert"}})
    host.oplog.append([OplogOp("drop", "db", "c")])
    batch, pbrt = await next_batch(cursor)
    assert batch == [] and cursor.exhausted and decode_token(pbrt).from_invalidate


# -- user stages ----------------------------------------------------------------------------------


async def test_stages_reshape_events() -> None:
    host = FakeHost()
    cursor = await open_stream(
        host,
        {},
        {"$match": {"fullDocument.kind": {"$regex": "^bo"}}},
        {"$addFields": {"extra.n": {"$add": ["$fullDocument.n", 1]}}},
        {"$project": {"operationType": 1, "extra": 1, "n": "$fullDocument.n"}},
        {"$set": {"tag": "x"}},
        {"$unset": "extra.unused"},
    )
    host.insert(1, kind="book", n=4)
    host.insert(2, kind="pen", n=5)
    (event,) = await drain(cursor)
    assert {k: v for k, v in event.items() if k != "_id"} == {
        "operationType": "insert",
        "extra": {"n": 5},
        "n": 4,
        "tag": "x",
    }
    assert token_cluster_time(event["_id"]).time > 0


async def test_replace_root_keeping_the_token_is_allowed() -> None:
    host = FakeHost()
    cursor = await open_stream(
        host, {}, {"$replaceRoot": {"newRoot": {"_id": "$_id", "doc": "$fullDocument"}}}
    )
    host.insert(1, v=1)
    (event,) = await drain(cursor)
    assert event["doc"] == {"_id": 1, "v": 1} and set(event) == {"_id", "doc"}


@pytest.mark.parametrize(
    "stage",
    [
        {"$project": {"_id": 0}},
        {"$unset": "_id"},
        {"$set": {"_id": "mine"}},
        {"$replaceWith": "$fullDocument"},
    ],
)
async def test_removing_or_changing_the_token_fails_when_an_event_comes(stage: dict[str, Any]) -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, stage)
    await cursor.fetch(None, None, first=True)
    host.insert(1)
    error = await refused(280, next_batch(cursor))
    assert error.errmsg.startswith(
        "Encountered an event whose _id field, which contains the resume token, was modified by the pipeline."
    )
    assert error.labels == ["NonResumableChangeStreamError"]


@pytest.mark.parametrize(
    ("stage", "code", "message"),
    [
        ({"$group": {"_id": None}}, 20, "$group is not permitted in a $changeStream pipeline"),
        ({"$lookup": {"from": "x"}}, 20, "$lookup is not permitted in a $changeStream pipeline"),
        ({"$out": "x"}, 20, "$out is not permitted in a $changeStream pipeline"),
        ({"$merge": {"into": "x"}}, 20, "$merge is not permitted in a $changeStream pipeline"),
        ({"$sort": {"a": 1}}, 20, "$sort is not permitted in a $changeStream pipeline"),
        ({"$frobnicate": {}}, 40324, "Unrecognized pipeline stage name: '$frobnicate'"),
        ({"$changeStream": {}}, 40602, "$changeStream is only valid as the first stage in a pipeline."),
        ({"$match": {}, "$project": {"a": 1}}, 40323, "must contain exactly one field"),
        ({"$match": 5}, 15959, "the match filter must be an expression in an object"),
        ({"$project": {"a": 1, "b": 0}}, 31254, "Cannot do exclusion on field b in inclusion projection"),
        ({"$changeStreamSplitLargeEvent": {}}, 7182802, "must be the last stage"),
    ],
)
async def test_forbidden_and_malformed_stages_are_refused(
    stage: dict[str, Any], code: int, message: str
) -> None:
    stages = [stage, {"$match": {}}] if "$changeStreamSplitLargeEvent" in stage else [stage]
    error = await refused(code, open_stream(FakeHost(), {}, *stages))
    assert message in error.errmsg


async def test_split_large_event_stage_is_accepted_last() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, {"$changeStreamSplitLargeEvent": {}})
    host.insert(1)
    assert len(await drain(cursor)) == 1


async def test_redact_prunes_subdocuments() -> None:
    host = FakeHost()
    cursor = await open_stream(
        host,
        {},
        {"$redact": {"$cond": [{"$eq": ["$secret", True]}, "$$PRUNE", "$$DESCEND"]}},
    )
    host.insert(1, public={"a": 1}, hidden={"secret": True, "b": 2})
    (event,) = await drain(cursor)
    assert event["fullDocument"] == {"_id": 1, "public": {"a": 1}}


# -- history --------------------------------------------------------------------------------------


async def test_resuming_before_the_oplog_window_is_history_lost() -> None:
    host = FakeHost(max_events=3)
    cursor = await open_stream(host)
    host.insert(0)
    (old,) = await drain(cursor)
    for i in range(1, 5):
        host.insert(i)
    error = await refused(286, open_stream(host, {"resumeAfter": old["_id"]}))
    assert error.errmsg == (
        "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
    )
    assert error.labels == ["NonResumableChangeStreamError"]
    await refused(286, open_stream(host, {"startAtOperationTime": old["clusterTime"]}))
    oldest = host.oplog.oplog_rs_find(1, 1)[0]["ts"]
    assert len(await drain(await open_stream(host, {"startAtOperationTime": oldest}))) == 3


async def test_a_cursor_that_falls_behind_loses_history_at_get_more() -> None:
    host = FakeHost(max_events=3)
    cursor = await open_stream(host)
    host.insert(0)
    await next_batch(cursor, 1)
    for i in range(1, 6):
        host.insert(i)
    await refused(286, next_batch(cursor))
    assert cursor.exhausted


async def test_a_cursor_that_keeps_up_never_loses_history() -> None:
    host = FakeHost(max_events=2)
    cursor = await open_stream(host)
    seen = []
    for i in range(10):
        host.insert(i)
        seen += [e["documentKey"]["_id"] for e in await drain(cursor)]
    assert seen == list(range(10))


# -- encoding ---------------------------------------------------------------------------------------

# Text includes strings that are not UTF-8, as the server decodes them (surrogateescape).
_texts = st.one_of(
    st.text(max_size=3), st.binary(max_size=3).map(lambda b: b.decode("utf-8", "surrogateescape"))
)
_field_values = st.recursive(
    st.one_of(
        st.integers(-(2**40), 2**40),
        _texts,
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=8,
)
_ids = st.one_of(st.integers(-(2**40), 2**40), _texts, st.builds(ObjectId), _field_values)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["insert", "update", "replace", "delete"]),
    _ids,
    st.dictionaries(st.sampled_from(["x", "y", "_id"]), _field_values, max_size=3),
    st.dictionaries(st.sampled_from(["x", "y", "z"]), _field_values, max_size=3),
    st.booleans(),
)
def test_prebuilt_event_bson_equals_encoding_the_event(
    kind: str, key: Any, before: dict[str, Any], after: dict[str, Any], in_transaction: bool
) -> None:
    async def check() -> None:
        host = FakeHost()
        cursor = await open_stream(host, coll=None)
        op = OplogOp(
            kind,
            "db",
            "c",
            {"_id": key},
            before={**before, "_id": key},
            after={**after, "z_id": 1, "_id": key},
        )
        if in_transaction:
            host.oplog.append([op], lsid={"id": Binary(b"\x07" * 16, 4)}, txn_number=3)
        else:
            host.oplog.append([op])
        records, _ = host.oplog.view()
        for record in records:
            assert classic_document_event_bson(record) == encode(cursor._base_event(record))

    asyncio.run(check())


async def test_rename_operation_description_names_the_target_only() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {"showExpandedEvents": True}, coll=None)
    host.insert(1, coll="a")
    desc = {"to": {"db": "db", "coll": "b"}, "dropTarget": False}
    host.oplog.append([OplogOp("rename", "db", "a", to=("db", "b"), description=desc)])
    _, rename = await drain(cursor)
    assert rename["operationDescription"] == {"to": {"db": "db", "coll": "b"}}
    assert rename["to"] == {"db": "db", "coll": "b"} and rename["ns"] == {"db": "db", "coll": "a"}


async def test_a_token_older_than_the_oplog_is_history_lost() -> None:
    # A token of an earlier server (the oplog starts when this one started): MongoDB finds the
    # resume point outside its oplog and answers 286, whatever the token's namespace.
    token = {
        "_data": event_token_data(
            ts_key(Timestamp(1_600_000_000, 1)), 0, b"\x01" * 16, "insert", {"_id": 1}, None
        )
    }
    host = FakeHost()
    host.insert(1)
    await refused(286, open_stream(host, {"resumeAfter": token}))
    # A time that old only means "from the beginning" while nothing was dropped.
    cursor = await open_stream(host, {"startAtOperationTime": Timestamp(1_600_000_000, 1)})
    assert [e["documentKey"] for e in await drain(cursor)] == [{"_id": 1}]
    cursor = await open_stream(host, {"resumeAfter": high_water_mark(Timestamp(1_600_000_000, 1))})
    assert [e["documentKey"] for e in await drain(cursor)] == [{"_id": 1}]


async def test_filter_only_streams_share_the_cached_encoding() -> None:
    host = FakeHost()
    filtered = await open_stream(host, {}, {"$match": {"operationType": "insert"}})
    plain = await open_stream(host)
    host.insert(1)
    host.delete(1)
    batch, _ = await filtered.fetch(None, 0, first=False)
    records, _ = host.oplog.view()
    assert [doc is records[0].raw for doc in batch] == [True]
    plain_batch, _ = await plain.fetch(None, 0, first=False)
    assert plain_batch[0] is batch[0]
    assert [bson.decode(d.raw)["operationType"] for d in plain_batch] == ["insert", "delete"]


# -- events over 16 MB ----------------------------------------------------------------------------

MIB16 = 16 * 1024 * 1024
INTERNAL_LIMIT = MIB16 + 16 * 1024
SPLIT_LIMIT = INTERNAL_LIMIT - 8 * 1024
SPLIT = {"$changeStreamSplitLargeEvent": {}}
IMAGES = {"fullDocument": "updateLookup", "fullDocumentBeforeChange": "whenAvailable"}


def big_update(host: FakeHost, size: int, i: int = 1) -> None:
    """An update whose event with IMAGES holds two images of a ``size``-byte string: ~2 * size."""
    host.insert(i, a="x" * size)
    host.update(i, {"b": 1}, images=True)


async def raw_batch(cursor: ChangeStreamCursor, size: int | None = None) -> tuple[list[bytes], Any]:
    batch, extra = await cursor.fetch(size, 0, first=False)
    return [bytes(doc.raw) for doc in batch], extra["postBatchResumeToken"]


async def test_an_event_over_the_internal_limit_fails_the_whole_batch() -> None:
    host = FakeHost()
    cursor = await open_stream(host, IMAGES)
    host.insert(0)
    big_update(host, 8_400_000)
    error = await refused(10334, next_batch(cursor))
    token = host.oplog.view()[0][-1].data()
    assert len(token) > 160
    size = int(error.errmsg.split()[2])
    assert INTERNAL_LIMIT < size < INTERNAL_LIMIT + 16 * 1024
    assert error.errmsg == (
        f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and 16793600(16MB) "
        f'First element: _id: {{ _data: "{token[:150]}..." }}'
    )
    assert error.code_name == "BSONObjectTooLarge" and not error.labels


async def test_events_between_the_split_and_internal_limits_pass_whole_unless_split() -> None:
    host = FakeHost()
    host.insert(1, a="")
    plain = await open_stream(host, {"fullDocument": "updateLookup"})
    split = await open_stream(host, {"fullDocument": "updateLookup"}, SPLIT)
    # updateDescription and the looked-up document each hold the new value: ~2 * 8_393_000 bytes.
    host.update(1, {"a": "y" * 8_393_000})
    (whole,), _ = await raw_batch(plain)
    assert SPLIT_LIMIT < len(whole) <= INTERNAL_LIMIT
    fragments = await drain(split)
    assert [f["splitEvent"] for f in fragments] == [{"fragment": 1, "of": 2}, {"fragment": 2, "of": 2}]
    event = bson.decode(whole)
    merged = {k: v for f in fragments for k, v in f.items() if k not in ("_id", "splitEvent")}
    assert merged == {k: v for k, v in event.items() if k != "_id"}
    assert [decode_token(f["_id"]).fragment_num for f in fragments] == [0, 1]
    assert all(decode_token(f["_id"]).event_data == event["_id"]["_data"] for f in fragments)


async def test_a_batch_holds_16_mib_of_events_but_always_its_first() -> None:
    host = FakeHost()
    cursor = await open_stream(host)
    host.insert(1, a="x" * 9_000_000)
    host.insert(2, a="x" * 9_000_000)
    first, pbrt = await next_batch(cursor)
    # The event left for the next batch is the newest write: the batch's token must not pass it.
    assert [e["documentKey"]["_id"] for e in first] == [1] and pbrt == first[0]["_id"]
    host.insert(3, a="x" * (MIB16 - 100))
    host.insert(4)
    batches = []
    while True:
        batch, pbrt = await next_batch(cursor)
        if not batch:
            break
        assert pbrt == batch[-1]["_id"]
        batches.append([e["documentKey"]["_id"] for e in batch])
    assert batches == [[2], [3], [4]]


async def test_fragments_come_in_batches_like_events() -> None:
    host = FakeHost()
    cursor = await open_stream(host, IMAGES, SPLIT)
    big_update(host, 8_400_000)
    host.insert(2)
    first, _ = await next_batch(cursor, 1)
    assert first[0]["operationType"] == "insert"
    fragment, pbrt = await next_batch(cursor, 1)
    assert fragment[0]["splitEvent"] == {"fragment": 1, "of": 2} and pbrt == fragment[0]["_id"]
    rest, pbrt = await next_batch(cursor)
    assert [e.get("splitEvent") for e in rest] == [{"fragment": 2, "of": 2}, None]
    assert rest[1]["documentKey"] == {"_id": 2} and pbrt == rest[1]["_id"]


async def test_the_invalidate_after_an_event_held_for_the_next_batch_still_follows_it() -> None:
    host = FakeHost()
    probe = await open_stream(host)
    host.insert(0, pad="")
    (empty,), _ = await raw_batch(probe)
    # An insert whose event leaves too little room in its batch for the drop's event.
    host.insert(1, pad="x" * (MIB16 - 40 - len(empty)))
    host.oplog.append([OplogOp("drop", "db", "c")])
    cursor = await open_stream(host, {"resumeAfter": bson.decode(empty)["_id"]})
    first, _ = await next_batch(cursor)
    rest, pbrt = await next_batch(cursor)
    assert [e["operationType"] for e in first] == ["insert"]
    assert [e["operationType"] for e in rest] == ["drop", "invalidate"]
    assert cursor.exhausted and pbrt == rest[-1]["_id"]


async def test_resuming_from_a_fragment_splits_the_event_again() -> None:
    host = FakeHost()
    cursor = await open_stream(host, IMAGES, SPLIT)
    big_update(host, 8_400_000)
    host.insert(2)
    insert, first, last, following = await drain(cursor)
    assert insert["operationType"] == "insert" and first["splitEvent"] == {"fragment": 1, "of": 2}
    after_first = await open_stream(host, {**IMAGES, "resumeAfter": first["_id"]}, SPLIT)
    assert await drain(after_first) == [last, following]
    after_last = await open_stream(host, {**IMAGES, "startAfter": last["_id"]}, SPLIT)
    assert await drain(after_last) == [following]
    # A stage that keeps the event under the limit cannot reproduce the fragments.
    slim = await open_stream(
        host, {**IMAGES, "resumeAfter": first["_id"]}, {"$project": {"fullDocument": 0}}, SPLIT
    )
    error = await refused(280, next_batch(slim))
    assert error.errmsg == (
        "Attempted to resume from a split event fragment, but the event in the resumed stream was "
        "not large enough to be split"
    )
    assert error.labels == ["NonResumableChangeStreamError"]
    error = await refused(280, open_stream(host, {**IMAGES, "resumeAfter": first["_id"]}))
    assert error.errmsg == (
        "To resume from a split event, the $changeStream pipeline must include a "
        "$changeStreamSplitLargeEvent stage"
    )


async def test_resuming_from_a_fragment_the_new_pipeline_no_longer_makes_fails() -> None:
    host = FakeHost()
    cursor = await open_stream(host, IMAGES, SPLIT)
    host.insert(1, a="x" * 8_400_000)
    host.update(1, {"a": "y" * 8_400_000}, images=True)  # three big fields: three fragments
    host.insert(2)
    events = await drain(cursor)
    fragments = [e for e in events if "splitEvent" in e]
    assert [f["splitEvent"]["of"] for f in fragments] == [3, 3, 3]
    fewer = {"$project": {"fullDocumentBeforeChange": 0}}
    # Two fragments without the pre-image: resuming after the second still finds its place...
    second = await open_stream(host, {**IMAGES, "resumeAfter": fragments[1]["_id"]}, fewer, SPLIT)
    assert [e["documentKey"]["_id"] for e in await drain(second)] == [2]
    # ...but a third no longer exists.
    third = await open_stream(host, {**IMAGES, "resumeAfter": fragments[2]["_id"]}, fewer, SPLIT)
    error = await refused(280, next_batch(third))
    assert error.errmsg == (
        "Attempted to resume from a split event, but the resumed stream produced a different split. "
        "Ensure that the pipeline used to resume is the same as the original"
    )


async def test_a_field_too_big_for_any_fragment_fails_the_split() -> None:
    host = FakeHost()
    cursor = await open_stream(host, {}, SPLIT)
    host.insert(1, a="x" * (SPLIT_LIMIT + 100))  # fullDocument alone is over any fragment's limit
    error = await refused(7182500, next_batch(cursor))
    limit = SPLIT_LIMIT - len(bson.encode({"_data": host.oplog.view()[0][-1].data()}))
    assert error.errmsg.startswith("Splitting change event failed: fragment size ")
    assert error.errmsg.endswith(f" is greater than maximum allowed fragment size {limit}")
