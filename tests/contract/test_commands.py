"""Administrative and namespace commands: reply shapes and error codes as MongoDB gives them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pymongo
import pytest
from bson import Binary, Decimal128, Int64
from pymongo.errors import OperationFailure


def test_ping_and_unknown_command(client: pymongo.MongoClient) -> None:
    assert client.admin.command("ping")["ok"] == 1.0
    with pytest.raises(OperationFailure) as info:
        client.admin.command("definitelyNotACommand")
    assert info.value.code == 59
    assert info.value.details["codeName"] == "CommandNotFound"
    assert info.value.details["errmsg"] == "no such command: 'definitelyNotACommand'"


async def test_ping_and_unknown_command_async(async_client: pymongo.AsyncMongoClient) -> None:
    assert (await async_client.admin.command("ping"))["ok"] == 1.0
    with pytest.raises(OperationFailure) as info:
        await async_client.admin.command("definitelyNotACommand")
    assert info.value.code == 59


def test_get_cmd_line_opts_server_status_and_parameters(client: pymongo.MongoClient) -> None:
    opts = client.admin.command("getCmdLineOpts")
    assert isinstance(opts["argv"], list) and "parsed" in opts
    status = client.admin.command("serverStatus")
    for field in ("host", "version", "process", "uptime", "localTime", "connections", "opcounters"):
        assert field in status
    assert status["connections"]["current"] >= 1
    params = client.admin.command({"getParameter": 1, "enableTestCommands": 1})
    assert params["enableTestCommands"] in (True, 1)
    with pytest.raises(OperationFailure) as info:
        client.admin.command({"getParameter": 1, "noSuchParameterAnywhere": 1})
    assert info.value.code == 72


async def test_server_status_async(async_client: pymongo.AsyncMongoClient) -> None:
    status = await async_client.admin.command("serverStatus")
    assert status["process"].startswith("mongo")
    params = await async_client.admin.command({"getParameter": 1, "enableTestCommands": 1})
    assert params["enableTestCommands"] in (True, 1)


def test_list_databases_and_collections(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("plain")
    db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    assert db_name in client.list_database_names()
    reply = client.admin.command("listDatabases")
    entry = next(d for d in reply["databases"] if d["name"] == db_name)
    assert "sizeOnDisk" in entry and entry["empty"] is False
    assert "totalSize" in reply

    infos = {c["name"]: c for c in db.list_collections()}
    assert set(infos) == {"plain", "imaged"}
    assert infos["plain"]["type"] == "collection"
    assert infos["plain"]["options"] == {}
    uuid = infos["plain"]["info"]["uuid"]
    assert isinstance(uuid, Binary) and uuid.subtype == 4 and len(uuid) == 16
    assert infos["plain"]["info"]["uuid"] != infos["imaged"]["info"]["uuid"]
    assert infos["imaged"]["options"] == {"changeStreamPreAndPostImages": {"enabled": True}}
    assert infos["plain"]["idIndex"]["key"] == {"_id": 1}

    names_only = list(db.list_collections(nameOnly=True))
    assert sorted(c["name"] for c in names_only) == ["imaged", "plain"]
    assert all(set(c) <= {"name", "type"} for c in names_only)
    assert [c["name"] for c in db.list_collections(filter={"name": "plain"})] == ["plain"]
    raw = db.command("listCollections", cursor={})
    assert raw["cursor"]["id"] == 0
    assert raw["cursor"]["ns"] == f"{db_name}.$cmd.listCollections"


async def test_list_collections_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    db = async_client[db_name]
    await db.create_collection("a")
    await db.b.insert_one({"x": 1})
    assert sorted(await db.list_collection_names()) == ["a", "b"]
    assert db_name in await async_client.list_database_names()


def test_create_existing_collection(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.command("create", "c")
    # Same options again is accepted; different options are NamespaceExists.
    db.command("create", "c")
    with pytest.raises(OperationFailure) as info:
        db.command("create", "c", changeStreamPreAndPostImages={"enabled": True})
    assert info.value.code == 48
    assert info.value.details["codeName"] == "NamespaceExists"


def test_drop_and_drop_database(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(7, "dropping a collection that does not exist succeeds")
    db = client[db_name]
    assert db.command("drop", "never_created")["ok"] == 1.0
    db.c.insert_many([{"a": 1}, {"a": 2}])
    db.c.create_index("a")
    reply = db.command("drop", "c")
    assert reply["nIndexesWas"] == 2
    assert reply["ns"] == f"{db_name}.c"
    assert db.list_collection_names() == []
    db.d.insert_one({})
    client.drop_database(db_name)
    assert db_name not in client.list_database_names()
    assert db.d.count_documents({}) == 0


async def test_drop_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    db = async_client[db_name]
    await db.c.insert_one({"a": 1})
    await db.c.drop()
    assert await db.list_collection_names() == []
    await async_client.drop_database(db_name)


def test_rename_collection(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.src.insert_many([{"_id": 1}, {"_id": 2}])
    db.src.create_index("x", unique=True, sparse=True)
    db.src.rename("dst")
    assert db.list_collection_names() == ["dst"]
    assert db.dst.count_documents({}) == 2
    assert "x_1" in db.dst.index_information()

    with pytest.raises(OperationFailure) as missing:
        db.nothing_here.rename("other")
    assert missing.value.code == 26
    db.other.insert_one({"_id": "o"})
    with pytest.raises(OperationFailure) as exists:
        db.dst.rename("other")
    assert exists.value.code == 48
    db.dst.rename("other", dropTarget=True)
    assert sorted(d["_id"] for d in db.other.find()) == [1, 2]
    with pytest.raises(OperationFailure) as not_admin:
        db.command("renameCollection", f"{db_name}.other", to=f"{db_name}.x")
    assert not_admin.value.code == 13


async def test_rename_collection_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    db = async_client[db_name]
    await db.src.insert_one({"_id": 1})
    await db.src.rename("dst")
    assert await db.list_collection_names() == ["dst"]


def test_coll_mod_pre_and_post_images(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("c")
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    options = next(db.list_collections(filter={"name": "c"}))["options"]
    assert options["changeStreamPreAndPostImages"] == {"enabled": True}
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": False})
    options = next(db.list_collections(filter={"name": "c"}))["options"]
    assert options.get("changeStreamPreAndPostImages", {"enabled": False}) == {"enabled": False}
    with pytest.raises(OperationFailure) as info:
        db.command("collMod", "missing_coll", changeStreamPreAndPostImages={"enabled": True})
    assert info.value.code == 26


async def test_coll_mod_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    db = async_client[db_name]
    await db.create_collection("c")
    await db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    infos = await (await db.list_collections(filter={"name": "c"})).to_list()
    assert infos[0]["options"]["changeStreamPreAndPostImages"] == {"enabled": True}


def test_count_distinct_and_aggregate(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_many(
        [{"k": "a", "v": 1, "tags": ["x", "y"]}, {"k": "b", "v": 2, "tags": ["y"]}, {"k": "a", "v": 3}]
    )
    assert client[db_name].command("count", "c")["n"] == 3
    assert client[db_name].command("count", "c", query={"k": "a"})["n"] == 2
    assert client[db_name].command("count", "missing")["n"] == 0
    assert coll.count_documents({"v": {"$gt": 1}}) == 2
    assert coll.estimated_document_count() == 3
    assert sorted(coll.distinct("k")) == ["a", "b"]
    assert sorted(coll.distinct("tags")) == ["x", "y"]
    assert coll.distinct("k", {"v": 2}) == ["b"]
    grouped = list(
        coll.aggregate([{"$group": {"_id": "$k", "total": {"$sum": "$v"}}}, {"$sort": {"_id": 1}}])
    )
    assert grouped == [{"_id": "a", "total": 4}, {"_id": "b", "total": 2}]
    matched = list(
        coll.aggregate([{"$match": {"k": "a"}}, {"$project": {"_id": 0, "v": 1}}, {"$sort": {"v": -1}}])
    )
    assert matched == [{"v": 3}, {"v": 1}]


async def test_count_distinct_and_aggregate_async(
    async_client: pymongo.AsyncMongoClient, db_name: str
) -> None:
    coll = async_client[db_name].c
    await coll.insert_many([{"k": i % 3} for i in range(9)])
    assert await coll.count_documents({"k": 0}) == 3
    assert sorted(await coll.distinct("k")) == [0, 1, 2]
    cursor = await coll.aggregate([{"$group": {"_id": "$k", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}])
    assert await cursor.to_list() == [{"_id": 0, "n": 3}, {"_id": 1, "n": 3}, {"_id": 2, "n": 3}]


def test_aggregate_lookup_reads_the_other_collection(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.orders.insert_many([{"_id": 1, "item": "a"}, {"_id": 2, "item": "b"}])
    db.items.insert_many([{"_id": "a", "price": 3}, {"_id": "b", "price": 5}])
    joined = list(
        db.orders.aggregate(
            [
                {"$lookup": {"from": "items", "localField": "item", "foreignField": "_id", "as": "it"}},
                {"$project": {"price": {"$arrayElemAt": ["$it.price", 0]}}},
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert joined == [{"_id": 1, "price": 3}, {"_id": 2, "price": 5}]


@pytest.mark.parametrize(
    ("value", "key"),
    [
        # MongoDB's documented example, and hashes mongod gives for null and for 1.
        ("string to hash", 763543691661428748),
        (None, 2338878944348059895),
        (1, 5902408780260971510),
    ],
)
def test_hashed_index_keys_are_mongodbs(
    client: pymongo.MongoClient,
    db_name: str,
    value: Any,
    key: int,
    requires_mongodb: Callable[[int, str], None],
) -> None:
    requires_mongodb(7, "$toHashedIndexKey")
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "v": value})
    (row,) = coll.aggregate([{"$project": {"_id": 0, "h": {"$toHashedIndexKey": "$v"}}}])
    assert row == {"h": key}


def test_hashed_index_keys_squash_numbers_to_64_bit_integers(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(7, "$toHashedIndexKey")
    coll = client[db_name].c
    coll.insert_many(
        [
            {"_id": 1, "v": 2},
            {"_id": 2, "v": Int64(2)},
            {"_id": 3, "v": 2.9},
            {"_id": 4, "v": Decimal128("2.5")},
            {"_id": 5, "v": "2"},
            {"_id": 6, "v": {"a": [1, {"b": None}]}},
            {"_id": 7},
        ]
    )
    keys = {
        row["_id"]: row["h"]
        for row in coll.aggregate([{"$project": {"h": {"$toHashedIndexKey": "$v"}}}, {"$sort": {"_id": 1}}])
    }
    assert keys[1] == keys[2] == keys[3] == keys[4]
    assert len({keys[1], keys[5], keys[6]}) == 3
    assert keys[7] == 2338878944348059895  # a missing value hashes as null
    # The same keys from the expression in a filter.
    matched = coll.find({"$expr": {"$eq": [{"$toHashedIndexKey": "$v"}, keys[6]]}}, {"_id": 1})
    assert [row["_id"] for row in matched] == [6]


def test_mod_of_integers_is_exact_and_keeps_the_dividends_sign(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "big": Int64(2**62 + 3), "negative": -7, "half": 7.5})
    (row,) = coll.aggregate(
        [
            {
                "$project": {
                    "_id": 0,
                    "big": {"$mod": ["$big", 2]},
                    "negative": {"$mod": ["$negative", 3]},
                    "half": {"$mod": ["$half", 2]},
                }
            }
        ]
    )
    assert row == {"big": 1, "negative": -1, "half": 1.5}
    assert isinstance(row["big"], Int64)  # a long operand gives a long


def test_sample_draws_distinct_documents_up_to_its_size(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_many([{"_id": i} for i in range(20)])
    drawn = [doc["_id"] for doc in coll.aggregate([{"$sample": {"size": 5}}])]
    assert len(drawn) == 5 and len(set(drawn)) == 5 and set(drawn) <= set(range(20))
    assert sorted(doc["_id"] for doc in coll.aggregate([{"$sample": {"size": 500}}])) == list(range(20))
    # A double's fraction is dropped, as for any size the server reads as a 64-bit integer.
    assert len(list(coll.aggregate([{"$sample": {"size": 2.9}}]))) == 2
    assert list(client[db_name].missing.aggregate([{"$sample": {"size": 3}}])) == []


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (5, 28745, "the $sample stage specification must be an object"),
        ({}, 28749, "$sample stage must specify a size"),
        ({"size": "3"}, 28746, "size argument to $sample must be a number"),
        ({"size": True}, 28746, "size argument to $sample must be a number"),
        ({"size": -1}, 28747, "size argument to $sample must not be negative"),
        ({"size": 3, "seed": 1}, 28748, "unrecognized option to $sample: seed"),
    ],
)
def test_sample_refuses_bad_specs_with_mongodbs_errors(
    client: pymongo.MongoClient, db_name: str, spec: Any, code: int, message: str
) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as info:
        list(coll.aggregate([{"$sample": spec}]))
    assert info.value.code == code
    assert info.value.details["errmsg"] == message


def test_aggregate_requires_cursor_option(client: pymongo.MongoClient, db_name: str) -> None:
    with pytest.raises(OperationFailure) as info:
        client[db_name].command("aggregate", "c", pipeline=[])
    assert info.value.code == 9


def test_end_sessions_is_accepted(client: pymongo.MongoClient) -> None:
    session = client.start_session()
    client.admin.command("ping", session=session)
    assert client.admin.command("endSessions", [session.session_id])["ok"] == 1.0
    session.end_session()
