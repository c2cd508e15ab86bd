"""Change streams through an unmodified PyMongo MongoClient: events, options, stages, invalidation.

Every test here runs against EmbeddedReplicaSet by default, as a replica set and through the mongos
of a sharded one, and against the server named by FLOWWARDEN_TEST_MONGODB_URI when it is set; the
ones that need an EmbeddedReplicaSet helper are marked ``embedded_only``.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pymongo
import pytest
from bson import Int64, Timestamp
from pymongo import monitoring
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

from flowwarden.events import compare_tokens, token_cluster_time

pytestmark = pytest.mark.through_mongos

AWAIT_MS = 100


class Commands(monitoring.CommandListener):
    """Every command a client sent and every reply it got, for asserting on the wire."""

    def __init__(self) -> None:
        self.sent: list[monitoring.CommandStartedEvent] = []
        self.replies: list[monitoring.CommandSucceededEvent] = []
        self._watches: list[tuple[str, threading.Event]] = []

    def started_named(self, name: str) -> list[dict[str, Any]]:
        return [e.command for e in self.sent if e.command_name == name]

    def replies_named(self, name: str) -> list[dict[str, Any]]:
        return [e.reply for e in self.replies if e.command_name == name]

    def watch_for(self, name: str) -> threading.Event:
        """An event set when the next command called ``name`` is sent."""
        flag = threading.Event()
        self._watches.append((name, flag))
        return flag

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.sent.append(event)
        for name, flag in self._watches:
            if name == event.command_name:
                flag.set()

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self.replies.append(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
def recorded(mongodb_uri: str) -> Iterator[tuple[pymongo.MongoClient, Commands]]:
    listener = Commands()
    with pymongo.MongoClient(mongodb_uri, event_listeners=[listener], serverSelectionTimeoutMS=10_000) as c:
        yield c, listener


def next_change(stream: ChangeStream, attempts: int = 100) -> dict[str, Any]:
    """The next event, polling with short awaits (an event already written arrives at once)."""
    for _ in range(attempts):
        change = stream.try_next()
        if change is not None:
            return change
        if not stream.alive:
            break
    raise AssertionError("no change arrived")


def changes(stream: ChangeStream, count: int) -> list[dict[str, Any]]:
    return [next_change(stream) for _ in range(count)]


def op_time(client: pymongo.MongoClient, write: Any) -> Timestamp:
    """Run ``write(session)`` and return the operationTime the server reported for it."""
    with client.start_session() as session:
        write(session)
        assert session.operation_time is not None
        return session.operation_time


# -- events ---------------------------------------------------------------------------------------


def test_document_events(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].orders
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1, "qty": 1, "tags": ["a"]})
        coll.update_one({"_id": 1}, {"$set": {"qty": 2}, "$push": {"tags": "b"}})
        coll.update_one({"_id": 1}, {"$unset": {"qty": ""}})
        coll.replace_one({"_id": 1}, {"_id": 1, "replaced": True})
        coll.delete_one({"_id": 1})
        insert, update, unset, replace, delete = changes(stream, 5)
    assert insert["operationType"] == "insert"
    assert insert["fullDocument"] == {"_id": 1, "qty": 1, "tags": ["a"]}
    assert insert["ns"] == {"db": db_name, "coll": "orders"}
    assert insert["documentKey"] == {"_id": 1}
    assert isinstance(insert["clusterTime"], Timestamp) and isinstance(insert["wallTime"], dt.datetime)
    assert update["operationType"] == "update" and "fullDocument" not in update
    assert update["updateDescription"]["updatedFields"] == {"qty": 2, "tags.1": "b"}
    assert update["updateDescription"]["removedFields"] == []
    assert update["updateDescription"]["truncatedArrays"] == []
    assert unset["updateDescription"]["removedFields"] == ["qty"]
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "replaced": True}
    assert delete["operationType"] == "delete" and delete["documentKey"] == {"_id": 1}
    for event in (insert, update, unset, replace, delete):
        assert token_cluster_time(event["_id"]) == event["clusterTime"]
        assert "collectionUUID" not in event


def test_insert_many_gives_one_event_per_document(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].items
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_many([{"_id": i} for i in range(5)])
        events = changes(stream, 5)
    assert [e["documentKey"]["_id"] for e in events] == list(range(5))
    assert len({e["clusterTime"] for e in events}) == 5


def test_database_and_cluster_streams(client: pymongo.MongoClient, db_name: str) -> None:
    other_db = f"{db_name}_b"
    only_ours = [{"$match": {"ns.db": {"$in": [db_name, other_db]}}}]
    try:
        with (
            client[db_name].watch(max_await_time_ms=AWAIT_MS) as db_stream,
            client.watch(only_ours, max_await_time_ms=AWAIT_MS) as cluster_stream,
        ):
            client[db_name].a.insert_one({"_id": "a"})
            client[db_name].b.insert_one({"_id": "b"})
            client[other_db].c.insert_one({"_id": "c"})
            assert [e["ns"]["coll"] for e in changes(db_stream, 2)] == ["a", "b"]
            assert [e["documentKey"]["_id"] for e in changes(cluster_stream, 3)] == ["a", "b", "c"]
            assert db_stream.try_next() is None
    finally:
        client.drop_database(other_db)


def test_update_lookup_returns_the_current_document(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "v": 0})
    with coll.watch(full_document="updateLookup", max_await_time_ms=AWAIT_MS) as stream:
        coll.update_one({"_id": 1}, {"$set": {"v": 1}})
        event = next_change(stream)
    assert event["fullDocument"] == {"_id": 1, "v": 1}


def test_pre_and_post_images(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("with_images", changeStreamPreAndPostImages={"enabled": True})
    db.create_collection("plain")
    options = {"full_document": "whenAvailable", "full_document_before_change": "whenAvailable"}
    with (
        db.with_images.watch(max_await_time_ms=AWAIT_MS, **options) as imaged,
        db.plain.watch(max_await_time_ms=AWAIT_MS, **options) as plain,
    ):
        for coll in (db.with_images, db.plain):
            coll.insert_one({"_id": 1, "v": 1})
            coll.update_one({"_id": 1}, {"$set": {"v": 2}})
            coll.delete_one({"_id": 1})
        _, update, delete = changes(imaged, 3)
        assert update["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
        assert update["fullDocument"] == {"_id": 1, "v": 2}
        assert delete["fullDocumentBeforeChange"] == {"_id": 1, "v": 2}
        _, update, delete = changes(plain, 3)
        assert update["fullDocumentBeforeChange"] is None and update["fullDocument"] is None
        assert delete["fullDocumentBeforeChange"] is None


def test_images_enabled_later_with_coll_mod(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("c")
    db.c.insert_one({"_id": 1, "v": 1})
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    with db.c.watch(full_document_before_change="required", max_await_time_ms=AWAIT_MS) as stream:
        db.c.update_one({"_id": 1}, {"$set": {"v": 2}})
        assert next_change(stream)["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}


@pytest.mark.parametrize(
    ("option", "missing"),
    [("full_document_before_change", "pre-image"), ("full_document", "post-image")],
)
def test_required_images_fail_without_pre_images(
    client: pymongo.MongoClient, db_name: str, option: str, missing: str
) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "v": 1})
    with coll.watch(max_await_time_ms=AWAIT_MS, **{option: "required"}) as stream:
        coll.update_one({"_id": 1}, {"$set": {"v": 2}})
        with pytest.raises(OperationFailure) as info:
            next_change(stream)
    assert info.value.code == 47
    assert f"the {missing} was not found for event" in str(info.value)
    assert not info.value.has_error_label("ResumableChangeStreamError")


def test_expanded_events(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    with db.watch(show_expanded_events=True, max_await_time_ms=AWAIT_MS) as expanded:
        db.create_collection("c")
        db.c.create_index("a")
        db.c.insert_one({"_id": 1})
        db.c.drop_index("a_1")
        events = changes(expanded, 4)
    assert [e["operationType"] for e in events] == ["create", "createIndexes", "insert", "dropIndexes"]
    uuid = db.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]["info"]["uuid"]
    assert all(e["collectionUUID"] == uuid for e in events)
    assert events[1]["operationDescription"]["indexes"][0]["key"] == {"a": 1}


def test_coll_mod_without_options_is_a_modify_event(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("c")
    with db.c.watch(show_expanded_events=True, max_await_time_ms=AWAIT_MS) as expanded:
        db.command("collMod", "c")
        db.c.insert_one({"_id": 1})
        events = changes(expanded, 2)
    assert [e["operationType"] for e in events] == ["modify", "insert"]
    assert events[0]["ns"] == {"db": db_name, "coll": "c"}


@pytest.mark.parametrize("level", ["local", "available"])
def test_a_read_concern_other_than_majority_is_refused(
    client: pymongo.MongoClient, db_name: str, level: str
) -> None:
    coll = client[db_name].get_collection("c", read_concern=ReadConcern(level))
    with pytest.raises(OperationFailure) as info:
        coll.watch()
    assert info.value.code == 72
    assert "readConcern other than 'majority'" in str(info.value)
    with client[db_name].get_collection("c", read_concern=ReadConcern("majority")).watch() as stream:
        assert stream.alive


@pytest.mark.parametrize(("code", "labelled"), [(6, True), (234, True), (9, False)])
def test_a_get_more_failed_after_checkout_is_labelled_as_the_server_labels_it(
    client: pymongo.MongoClient,
    db_name: str,
    fail_get_more: Callable[..., Any],
    code: int,
    labelled: bool,
) -> None:
    """failGetMoreAfterCursorCheckout fails inside the getMore, so the server labels a resumable
    error on a change stream's cursor itself (HostUnreachable, RetryChangeStream); FailedToParse
    carries no label at all."""
    db = client[db_name]
    db.create_collection("c")
    opened = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
    fail_get_more("alwaysOn", code)
    with pytest.raises(OperationFailure) as info:
        db.command("getMore", opened["cursor"]["id"], collection="c")
    assert info.value.code == code
    assert info.value.has_error_label("ResumableChangeStreamError") is labelled
    assert ("errorLabels" in info.value.details) is labelled


def test_a_change_stream_resumes_after_a_resumable_get_more_failure(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str, fail_get_more: Callable[..., Any]
) -> None:
    client, commands = recorded
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        fail_get_more({"times": 1}, 6)
        assert next_change(stream)["documentKey"] == {"_id": 1}
    assert len(commands.started_named("aggregate")) == 2  # opened, then resumed


def test_a_plain_fail_command_on_get_more_is_not_resumed(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str, fail_command: Callable[..., Any]
) -> None:
    """failCommand answers before the getMore runs, with only the labels it was given."""
    client, commands = recorded
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        fail_command({"times": 1}, failCommands=["getMore"], errorCode=6)
        with pytest.raises(OperationFailure) as info:
            next_change(stream)
    assert info.value.code == 6 and not info.value.has_error_label("ResumableChangeStreamError")
    assert len(commands.started_named("aggregate")) == 1


def test_classic_streams_skip_ddl_events(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    with db.watch(max_await_time_ms=AWAIT_MS) as stream:
        db.create_collection("c")
        db.c.create_index("a")
        db.c.insert_one({"_id": 1})
        assert next_change(stream)["operationType"] == "insert"


# -- stages ---------------------------------------------------------------------------------------


def test_stages_filter_and_reshape(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    pipeline = [
        {"$match": {"operationType": "insert", "fullDocument.kind": "book"}},
        {"$project": {"operationType": 1, "title": "$fullDocument.title"}},
    ]
    with coll.watch(pipeline, max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_many(
            [{"kind": "pen", "title": "p"}, {"kind": "book", "title": "b1"}, {"kind": "book", "title": "b2"}]
        )
        events = changes(stream, 2)
    assert [{k: v for k, v in e.items() if k != "_id"} for e in events] == [
        {"operationType": "insert", "title": "b1"},
        {"operationType": "insert", "title": "b2"},
    ]


def test_expressions_reshape_events_field_by_field(client: pymongo.MongoClient, db_name: str) -> None:
    """The expressions that rewrite an update description key by key: $type (missing included),
    $mergeObjects, $not of a one-element list, $regexMatch of a missing input (false),
    $objectToArray and $arrayToObject keeping dotted keys, $let, $switch, $$REMOVE."""
    coll = client[db_name].c
    updated = "$updateDescription.updatedFields"
    pairs = {"$objectToArray": updated}
    secret = {"$regexMatch": {"input": "$$entry.k", "regex": r"^secret(?:\.|$)"}}
    public = {"$filter": {"input": pairs, "as": "entry", "cond": {"$not": [secret]}}}
    pipeline = [
        {
            "$set": {
                "kinds": {"description": {"$type": "$updateDescription"}, "missing": {"$type": "$nope"}},
                "noCollection": {"$regexMatch": {"input": "$nope", "regex": "x"}},
                "updateDescription": {
                    "$cond": [
                        {"$eq": [{"$type": "$updateDescription"}, "object"]},
                        {
                            "$mergeObjects": [
                                "$updateDescription",
                                {
                                    "updatedFields": {"$arrayToObject": public},
                                    "none": "$$REMOVE",
                                },
                            ]
                        },
                        "$$REMOVE",
                    ]
                },
                "shape": {
                    "$let": {
                        "vars": {"where": "$ns"},
                        "in": {
                            "$switch": {
                                "branches": [{"case": {"$isArray": "$$where"}, "then": "array"}],
                                "default": {"$type": "$$where"},
                            }
                        },
                    }
                },
            }
        }
    ]
    with coll.watch(pipeline, max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1, "a": {"b": 1}, "secret": {"x": 1}})
        coll.update_one({"_id": 1}, {"$set": {"a.b": 2, "secret.x": 2, "secretive": 3}})
        insert, update = changes(stream, 2)
    assert "updateDescription" not in insert
    assert insert["kinds"] == {"description": "missing", "missing": "missing"}
    assert insert["noCollection"] is False and update["noCollection"] is False
    assert insert["shape"] == "object" and update["shape"] == "object"
    assert update["kinds"]["description"] == "object"
    description = update["updateDescription"]
    assert description["updatedFields"] == {"a.b": 2, "secretive": 3}
    assert description["removedFields"] == [] and "none" not in description


def test_projecting_only_the_id_leaves_only_the_token(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    with coll.watch([{"$project": {"_id": 1}}], max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1, "big": "x" * 100})
        (event,) = changes(stream, 1)
    assert list(event) == ["_id"] and set(event["_id"]) == {"_data"}


@pytest.mark.parametrize("stage", ["$group", "$lookup", "$out", "$merge", "$sort", "$limit"])
def test_forbidden_stages_are_refused(client: pymongo.MongoClient, db_name: str, stage: str) -> None:
    spec: Any = {
        "$group": {"_id": None},
        "$lookup": {"from": "x", "localField": "a", "foreignField": "b", "as": "c"},
        "$out": "x",
        "$merge": {"into": "x"},
        "$sort": {"a": 1},
        "$limit": 1,
    }[stage]
    with pytest.raises(OperationFailure) as info:
        client[db_name].c.watch([{stage: spec}])
    assert info.value.code == 20
    assert f"{stage} is not permitted in a $changeStream pipeline" in str(info.value)


def test_removing_the_token_fails_without_resuming(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str
) -> None:
    client, commands = recorded
    coll = client[db_name].c
    stream = coll.watch([{"$project": {"_id": 0}}], max_await_time_ms=AWAIT_MS)
    coll.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as info:
        next_change(stream)
    assert info.value.code == 280
    assert info.value.has_error_label("NonResumableChangeStreamError")
    assert "was modified by the pipeline" in str(info.value)
    assert not stream.alive
    assert len(commands.started_named("aggregate")) == 1


# -- cursors --------------------------------------------------------------------------------------


def test_batch_sizes_and_post_batch_resume_tokens(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str
) -> None:
    client, commands = recorded
    coll = client[db_name].c
    coll.insert_one({"_id": "first"})
    start = op_time(client, lambda s: coll.insert_one({"_id": 0}, session=s))
    coll.insert_many([{"_id": i} for i in range(1, 10)])
    with coll.watch(batch_size=4, start_at_operation_time=start, max_await_time_ms=AWAIT_MS) as stream:
        events = changes(stream, 10)
    assert [e["documentKey"]["_id"] for e in events] == list(range(10))
    (aggregate,) = commands.replies_named("aggregate")
    assert len(aggregate["cursor"]["firstBatch"]) == 4
    get_mores = commands.replies_named("getMore")
    assert [len(r["cursor"]["nextBatch"]) for r in get_mores[:2]] == [4, 2]
    for reply in [aggregate, *get_mores]:
        batch = reply["cursor"].get("firstBatch", reply["cursor"].get("nextBatch"))
        if batch:
            assert reply["cursor"]["postBatchResumeToken"] == batch[-1]["_id"]


def test_idle_get_more_waits_then_answers_empty(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str
) -> None:
    client, commands = recorded
    with client[db_name].c.watch(max_await_time_ms=50) as stream:
        assert stream.try_next() is None
        assert stream.resume_token is not None
    (get_more,) = commands.started_named("getMore")
    assert get_more["maxTimeMS"] == 50


def test_post_batch_resume_token_advances_on_filtered_streams(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].c
    with coll.watch([{"$match": {"operationType": "delete"}}], max_await_time_ms=AWAIT_MS) as stream:
        assert stream.try_next() is None
        idle_token = stream.resume_token
        written = op_time(client, lambda s: coll.insert_many([{"_id": 1}, {"_id": 2}], session=s))
        for _ in range(50):
            assert stream.try_next() is None
            if token_cluster_time(stream.resume_token) >= written:
                break
        filtered_token = stream.resume_token
    assert compare_tokens(filtered_token, idle_token) == 1
    assert token_cluster_time(filtered_token) >= written
    # the advanced token is a safe resume point: nothing before it comes back, what follows does
    coll.delete_one({"_id": 2})
    with coll.watch([{"$match": {"operationType": "delete"}}], resume_after=filtered_token) as resumed:
        assert next_change(resumed)["documentKey"] == {"_id": 2}


def test_start_at_operation_time(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 0})
    start = op_time(client, lambda s: coll.insert_one({"_id": 1}, session=s))
    coll.insert_one({"_id": 2})
    with coll.watch(start_at_operation_time=start, max_await_time_ms=AWAIT_MS) as stream:
        assert [e["documentKey"]["_id"] for e in changes(stream, 2)] == [1, 2]


def test_killed_cursor_is_resumed_by_the_driver(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str
) -> None:
    client, commands = recorded
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        assert next_change(stream)["documentKey"] == {"_id": 1}
        client[db_name].command("killCursors", "c", cursors=[stream._cursor.cursor_id])
        coll.insert_one({"_id": 2})
        assert next_change(stream)["documentKey"] == {"_id": 2}
    second = commands.started_named("aggregate")[1]["pipeline"][0]["$changeStream"]
    assert "resumeAfter" in second


@pytest.mark.embedded_only
def test_resume_after_dropped_connections(
    recorded: tuple[pymongo.MongoClient, Commands], db_name: str, rs: Any
) -> None:
    client, commands = recorded
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=10_000) as stream:
        coll.insert_one({"_id": 1})
        assert stream.next()["documentKey"] == {"_id": 1}
        # The connections drop while the stream's getMore waits on one of them: the driver sees a
        # network error and resumes with the token of the last event it returned.
        waiting = commands.watch_for("getMore")
        received: list[dict[str, Any]] = []
        reader = threading.Thread(target=lambda: received.append(stream.next()))
        reader.start()
        assert waiting.wait(10)
        rs.drop_connections()
        coll.insert_one({"_id": 2})
        reader.join(30)
    assert [e["documentKey"] for e in received] == [{"_id": 2}]
    resumed = commands.started_named("aggregate")[1:]
    assert resumed and "resumeAfter" in resumed[0]["pipeline"][0]["$changeStream"]


# -- transactions ---------------------------------------------------------------------------------


def test_transaction_events_appear_on_commit(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("a")
    db.create_collection("b")
    with db.watch(max_await_time_ms=AWAIT_MS) as stream, client.start_session() as session:
        with session.start_transaction():
            db.a.insert_one({"_id": 1}, session=session)
            db.b.insert_one({"_id": 2}, session=session)
            db.a.update_one({"_id": 1}, {"$set": {"v": 1}}, session=session)
            assert stream.try_next() is None
        events = changes(stream, 3)
        lsid = session.session_id
    assert [e["operationType"] for e in events] == ["insert", "insert", "update"]
    assert len({e["clusterTime"] for e in events}) == 1
    assert all(e["lsid"] == lsid and e["txnNumber"] == Int64(1) for e in events)
    assert compare_tokens(events[0]["_id"], events[1]["_id"]) == -1
    assert compare_tokens(events[1]["_id"], events[2]["_id"]) == -1


def test_aborted_transactions_leave_no_events(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("a")
    with db.a.watch(max_await_time_ms=AWAIT_MS) as stream, client.start_session() as session:
        session.start_transaction()
        db.a.insert_one({"_id": 1}, session=session)
        session.abort_transaction()
        db.a.insert_one({"_id": 2})
        assert next_change(stream)["documentKey"] == {"_id": 2}


# -- invalidation ---------------------------------------------------------------------------------


def test_drop_invalidates_and_start_after_goes_on(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        coll.drop()
        insert, drop, invalidate = changes(stream, 3)
        assert not stream.alive
    assert (insert["operationType"], drop["operationType"], invalidate["operationType"]) == (
        "insert",
        "drop",
        "invalidate",
    )
    assert drop["ns"] == {"db": db_name, "coll": "c"}
    assert compare_tokens(drop["_id"], invalidate["_id"]) == -1
    coll.insert_one({"_id": 2})
    with coll.watch(start_after=invalidate["_id"], max_await_time_ms=AWAIT_MS) as again:
        assert next_change(again)["documentKey"] == {"_id": 2}
        assert again.alive
    with pytest.raises(OperationFailure) as info:
        coll.watch(resume_after=invalidate["_id"])
    assert info.value.code == 260
    assert "not allowed from an invalidate notification" in str(info.value)


def test_rename_invalidates(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.a.insert_one({"_id": 1})
    with db.a.watch(max_await_time_ms=AWAIT_MS) as stream, db.watch(max_await_time_ms=AWAIT_MS) as whole:
        db.a.rename("b")
        rename, invalidate = changes(stream, 2)
        assert rename["operationType"] == "rename" and rename["to"] == {"db": db_name, "coll": "b"}
        assert invalidate["operationType"] == "invalidate" and not stream.alive
        assert next_change(whole)["operationType"] == "rename"
        assert whole.alive


def test_drop_database_invalidates_a_database_stream(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.c.insert_one({"_id": 1})
    with db.watch(max_await_time_ms=AWAIT_MS) as stream:
        client.drop_database(db_name)
        events = changes(stream, 3)
    assert [e["operationType"] for e in events] == ["drop", "dropDatabase", "invalidate"]
    assert events[1]["ns"] == {"db": db_name}
