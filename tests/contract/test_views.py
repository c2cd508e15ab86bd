"""Views: how they are listed, read, refused for writes, changed, dropped and shown to change streams."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure
from test_change_streams import AWAIT_MS, changes

# A view over `src` ({_id: i, v: i, tag}) that keeps v >= 2 and adds a computed field.
BIG = [{"$match": {"v": {"$gte": 2}}}, {"$addFields": {"double": {"$multiply": ["$v", 2]}}}]


@pytest.fixture
def db(client: pymongo.MongoClient, db_name: str) -> pymongo.database.Database:
    database = client[db_name]
    database.src.insert_many([{"_id": i, "v": i, "tag": "odd" if i % 2 else "even"} for i in range(6)])
    database.create_collection("big", viewOn="src", pipeline=BIG)
    return database


def _listed(db: pymongo.database.Database, name: str) -> dict[str, Any]:
    [entry] = db.list_collections(filter={"name": name})
    return entry


def test_a_view_is_listed_with_its_definition(db: pymongo.database.Database) -> None:
    entry = _listed(db, "big")
    assert entry["type"] == "view"
    assert entry["options"] == {"viewOn": "src", "pipeline": BIG}
    assert entry["info"]["readOnly"] is True
    assert db.list_collection_names(filter={"type": "view"}) == ["big"]
    assert _listed(db, "src")["type"] == "collection"


def test_reads_apply_the_view_pipeline_before_their_own_options(db: pymongo.database.Database) -> None:
    view = db.big
    # The filter reads a field the view computes; sort, skip, limit and projection come after it.
    found = view.find({"double": {"$gte": 6}}, {"double": 1}, sort=[("v", -1)], skip=1, limit=1)
    assert list(found) == [{"_id": 4, "double": 8}]
    # A lookup by _id goes through the view too: document 1 is filtered out by it.
    assert view.find_one({"_id": 1}) is None
    assert view.find_one({"_id": 2}) == {"_id": 2, "v": 2, "tag": "even", "double": 4}
    assert view.count_documents({"tag": "odd"}) == 2
    assert view.estimated_document_count() == 4
    assert sorted(view.distinct("tag")) == ["even", "odd"]
    assert view.distinct("v", {"double": {"$gt": 8}}) == [5]
    grouped = view.aggregate([{"$group": {"_id": "$tag", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}])
    assert list(grouped) == [{"_id": "even", "n": 2}, {"_id": "odd", "n": 2}]


def test_a_view_on_a_view_runs_both_pipelines(db: pymongo.database.Database) -> None:
    db.create_collection(
        "odd_big", viewOn="big", pipeline=[{"$match": {"tag": "odd"}}, {"$project": {"v": 1}}]
    )
    assert _listed(db, "odd_big")["options"]["viewOn"] == "big"
    assert list(db.odd_big.find(sort=[("_id", 1)])) == [{"_id": 3, "v": 3}, {"_id": 5, "v": 5}]
    # The source's own writes show through both views at once.
    db.src.insert_one({"_id": 7, "v": 7, "tag": "odd"})
    assert db.odd_big.count_documents({}) == 3


@pytest.mark.parametrize(
    "write",
    [
        lambda view: view.insert_one({"v": 9}),
        lambda view: view.update_one({"_id": 2}, {"$set": {"v": 9}}),
        lambda view: view.update_many({}, {"$set": {"v": 9}}, upsert=True),
        lambda view: view.replace_one({"_id": 2}, {"v": 9}),
        lambda view: view.delete_one({"_id": 2}),
        lambda view: view.delete_many({}),
        lambda view: view.find_one_and_update({"_id": 2}, {"$set": {"v": 9}}),
        lambda view: view.find_one_and_delete({"_id": 2}),
    ],
    ids=[
        "insert_one",
        "update_one",
        "upsert",
        "replace_one",
        "delete_one",
        "delete_many",
        "find_one_and_update",
        "find_one_and_delete",
    ],
)
def test_writes_to_a_view_are_refused(db: pymongo.database.Database, write: Any) -> None:
    with pytest.raises(OperationFailure) as info:
        write(db.big)
    assert info.value.code == 166
    assert f"Namespace {db.name}.big is a view, not a collection" in str(info.value)
    assert _listed(db, "big")["type"] == "view"
    assert db.src.count_documents({}) == 6
    assert db.big.count_documents({}) == 4


def test_index_commands_and_change_streams_are_refused_on_a_view(db: pymongo.database.Database) -> None:
    for refused in (
        lambda: db.big.create_index("v"),
        lambda: db.big.index_information(),
        lambda: db.big.watch(max_await_time_ms=AWAIT_MS),
    ):
        with pytest.raises(OperationFailure) as info:
            refused()
        assert info.value.code == 166


def test_a_name_is_a_view_or_a_collection_never_both(db: pymongo.database.Database) -> None:
    # The create command itself: PyMongo's create_collection refuses an existing name on its own.
    with pytest.raises(OperationFailure) as on_collection:
        db.command("create", "src", viewOn="elsewhere", pipeline=[])
    assert on_collection.value.code == 48
    with pytest.raises(OperationFailure) as on_view:
        db.command("create", "big")
    assert on_view.value.code == 48
    assert _listed(db, "big")["options"] == {"viewOn": "src", "pipeline": BIG}
    assert _listed(db, "src")["type"] == "collection"


def test_view_definitions_are_checked_when_created(db: pymongo.database.Database) -> None:
    for name, code in (("system.views", 73), ("system.special", 73), ("dollar$", 73)):
        with pytest.raises(OperationFailure) as bad_name:
            db.command("create", name, viewOn="src")
        assert bad_name.value.code == code, name
    with pytest.raises(OperationFailure) as writing_stage:
        db.command("create", "dumps", viewOn="src", pipeline=[{"$out": "elsewhere"}])
    assert writing_stage.value.code == 167
    with pytest.raises(OperationFailure):
        db.command("create", "nowhere", pipeline=[])
    # Neither the source nor a pipeline is required to exist or be given.
    db.command("create", "on_nothing", viewOn="missing")
    assert _listed(db, "on_nothing")["options"] == {"viewOn": "missing", "pipeline": []}
    assert db.on_nothing.find_one() is None
    assert sorted(db.list_collection_names(filter={"type": "view"})) == ["big", "on_nothing"]


def test_coll_mod_changes_a_view_and_drop_removes_it(db: pymongo.database.Database) -> None:
    db.command("collMod", "big", viewOn="src", pipeline=[{"$match": {"tag": "odd"}}])
    assert _listed(db, "big")["options"] == {"viewOn": "src", "pipeline": [{"$match": {"tag": "odd"}}]}
    assert [d["_id"] for d in db.big.find(sort=[("_id", 1)])] == [1, 3, 5]
    db.big.drop()
    assert "big" not in db.list_collection_names()
    assert db.big.find_one() is None
    assert db.src.count_documents({}) == 6


def test_view_ddl_events_reach_expanded_database_streams(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.src.insert_one({"_id": 0, "v": 0})
    pipeline = [{"$match": {"v": {"$gte": 2}}}]
    with (
        db.watch(show_expanded_events=True, max_await_time_ms=AWAIT_MS) as expanded,
        db.watch(max_await_time_ms=AWAIT_MS) as classic,
    ):
        db.create_collection("big", viewOn="src", pipeline=pipeline)
        db.command("collMod", "big", viewOn="src", pipeline=[{"$match": {"v": 3}}])
        db.big.drop()
        db.src.insert_one({"_id": 1, "v": 1})
        create, modify, drop, insert = changes(expanded, 4)
        # Without showExpandedEvents a view's definition changes are not events at all.
        [plain_insert] = changes(classic, 1)
    assert [e["operationType"] for e in (create, modify, drop, insert)] == [
        "create",
        "modify",
        "drop",
        "insert",
    ]
    for event in (create, modify, drop):
        assert event["ns"] == {"db": db_name, "coll": "big"}
        # Views have no UUID, so their events carry none; they are never part of a transaction.
        assert "collectionUUID" not in event and "lsid" not in event
        assert "documentKey" not in event
    assert create["operationDescription"] == {"viewOn": "src", "pipeline": pipeline}
    # nsType is reported from MongoDB 8.0.5 on; a server that reports it says "view".
    assert create.get("nsType", "view") == "view"
    assert modify["operationDescription"] == {"viewOn": "src", "pipeline": [{"$match": {"v": 3}}]}
    assert "operationDescription" not in drop
    assert insert["documentKey"] == {"_id": 1}
    assert plain_insert["operationType"] == "insert" and plain_insert["documentKey"] == {"_id": 1}
