"""Indexes: unique enforcement with MongoDB's duplicate-key errors, TTL, list and drop."""

from __future__ import annotations

import datetime

import pymongo
import pytest
from pymongo import IndexModel
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError


def _dup_message(db_name: str, index: str, key: str) -> str:
    return f"E11000 duplicate key error collection: {db_name}.c index: {index} dup key: {key}"


def test_unique_index_rejects_duplicates_with_mongodb_error_shape(
    client: pymongo.MongoClient, db_name: str
) -> None:
    db = client[db_name]
    assert db.c.create_index("email", unique=True) == "email_1"
    db.c.insert_one({"_id": 1, "email": "a@x"})
    reply = db.command("insert", "c", documents=[{"_id": 2, "email": "a@x"}])
    assert reply["n"] == 0
    [error] = reply["writeErrors"]
    assert error["index"] == 0
    assert error["code"] == 11000
    assert error["keyPattern"] == {"email": 1}
    assert error["keyValue"] == {"email": "a@x"}
    assert error["errmsg"] == _dup_message(db_name, "email_1", '{ email: "a@x" }')
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"email": "a@x"})
    # Updates that would collide fail too, and leave the document as it was.
    db.c.insert_one({"_id": 3, "email": "b@x"})
    with pytest.raises(DuplicateKeyError) as info:
        db.c.update_one({"_id": 3}, {"$set": {"email": "a@x"}})
    assert info.value.details["keyValue"] == {"email": "a@x"}
    assert db.c.find_one({"_id": 3})["email"] == "b@x"
    with pytest.raises(DuplicateKeyError):
        db.c.find_one_and_update({"_id": 3}, {"$set": {"email": "a@x"}})
    with pytest.raises(DuplicateKeyError):
        db.c.update_one({"_id": 9}, {"$set": {"email": "a@x"}}, upsert=True)
    # Freed keys can be reused.
    db.c.delete_one({"_id": 1})
    db.c.update_one({"_id": 3}, {"$set": {"email": "a@x"}})
    assert db.c.count_documents({"email": "a@x"}) == 1


async def test_unique_index_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.create_index([("a", 1), ("b", -1)], unique=True)
    await coll.insert_many([{"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 1}])
    with pytest.raises(DuplicateKeyError) as info:
        await coll.insert_one({"a": 1, "b": 2})
    assert info.value.details["keyPattern"] == {"a": 1, "b": -1}
    assert info.value.details["keyValue"] == {"a": 1, "b": 2}
    assert info.value.details["errmsg"] == _dup_message(db_name, "a_1_b_-1", "{ a: 1, b: 2 }")


def test_unique_semantics_null_sparse_numbers_arrays(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.create_index("k", unique=True)
    coll.insert_one({"_id": 1})
    # A missing field indexes as null: a second document without it collides.
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 2})
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 2, "k": None})
    coll.insert_one({"_id": 3, "k": 1})
    # 1 and 1.0 are the same key; true is not 1.
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 4, "k": 1.0})
    coll.insert_one({"_id": 5, "k": True})
    # Array elements are keys of their own.
    coll.insert_one({"_id": 6, "k": [7, 8]})
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 7, "k": 8})

    sparse = client[db_name].s
    sparse.create_index("k", unique=True, sparse=True)
    sparse.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3, "k": "x"}])
    with pytest.raises(DuplicateKeyError):
        sparse.insert_one({"_id": 4, "k": "x"})

    partial = client[db_name].p
    partial.create_index("k", unique=True, partialFilterExpression={"live": True})
    partial.insert_many([{"k": 1, "live": False}, {"k": 1, "live": False}, {"k": 1, "live": True}])
    with pytest.raises(DuplicateKeyError):
        partial.insert_one({"k": 1, "live": True})


def test_unique_index_build_fails_on_existing_duplicates(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_many([{"v": 1}, {"v": 1}])
    with pytest.raises(OperationFailure) as info:
        coll.create_index("v", unique=True)
    assert info.value.code == 11000
    assert "E11000 duplicate key error collection" in info.value.details["errmsg"]
    assert [ix["name"] for ix in coll.list_indexes()] == ["_id_"]


def test_list_and_drop_indexes(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    names = db.c.create_indexes(
        [
            IndexModel([("a", 1)]),
            IndexModel([("b", -1)], name="by_b"),
            IndexModel([("t", 1)], expireAfterSeconds=3600),
        ]
    )
    assert names == ["a_1", "by_b", "t_1"]
    listed = {ix["name"]: ix for ix in db.c.list_indexes()}
    assert set(listed) == {"_id_", "a_1", "by_b", "t_1"}
    assert listed["_id_"]["key"] == {"_id": 1} and listed["_id_"]["v"] == 2
    assert listed["by_b"]["key"] == {"b": -1}
    assert listed["t_1"]["expireAfterSeconds"] == 3600
    raw = db.command("createIndexes", "c", indexes=[{"key": {"a": 1}, "name": "a_1"}])
    assert raw["numIndexesBefore"] == raw["numIndexesAfter"] == 4
    assert raw["note"] == "all indexes already exist"
    created = db.command("createIndexes", "fresh", indexes=[{"key": {"z": 1}, "name": "z_1"}])
    assert created["createdCollectionAutomatically"] is True
    assert (created["numIndexesBefore"], created["numIndexesAfter"]) == (1, 2)

    db.c.drop_index("by_b")
    db.c.drop_index([("a", 1)])
    assert sorted(ix["name"] for ix in db.c.list_indexes()) == ["_id_", "t_1"]
    with pytest.raises(OperationFailure) as missing:
        db.c.drop_index("nope")
    assert missing.value.code == 27
    with pytest.raises(OperationFailure) as id_index:
        db.c.drop_index("_id_")
    assert id_index.value.code == 72
    db.c.drop_indexes()
    assert [ix["name"] for ix in db.c.list_indexes()] == ["_id_"]
    with pytest.raises(OperationFailure) as no_ns:
        db.command("listIndexes", "never_made")
    assert no_ns.value.code == 26


async def test_list_and_drop_indexes_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.create_index("x", unique=True)
    names = [ix["name"] async for ix in await coll.list_indexes()]
    assert names == ["_id_", "x_1"]
    await coll.drop_index("x_1")
    info = await coll.index_information()
    assert list(info) == ["_id_"]


def test_index_conflicts(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.c.create_index("a", name="first")
    with pytest.raises(OperationFailure) as same_key:
        db.c.create_index("a", name="second")
    assert same_key.value.code == 85
    with pytest.raises(OperationFailure) as same_name:
        db.c.create_index("b", name="first")
    assert same_name.value.code == 86


def test_ttl_index_is_accepted_and_kept(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.create_index("created", expireAfterSeconds=60)
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    coll.insert_one({"created": now})
    info = coll.index_information()["created_1"]
    assert info["expireAfterSeconds"] == 60
    client[db_name].command("collMod", "c", index={"keyPattern": {"created": 1}, "expireAfterSeconds": 120})
    assert coll.index_information()["created_1"]["expireAfterSeconds"] == 120
    assert coll.count_documents({}) == 1


def test_index_on_write_error_in_update_statement(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.c.create_index("u", unique=True)
    db.c.insert_many([{"_id": 1, "u": 1}, {"_id": 2, "u": 2}])
    reply = db.command(
        "update",
        "c",
        updates=[{"q": {"_id": 2}, "u": {"$set": {"u": 1}}}, {"q": {"_id": 2}, "u": {"$set": {"x": 1}}}],
        ordered=False,
    )
    assert reply["n"] == 1 and reply["nModified"] == 1
    assert reply["writeErrors"][0]["index"] == 0 and reply["writeErrors"][0]["code"] == 11000
    with pytest.raises(WriteError):
        db.c.replace_one({"_id": 2}, {"u": 1})
