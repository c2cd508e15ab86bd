"""Documents: insert, update, delete, findAndModify, find and its cursors, with MongoDB's replies,
from a replica set and through a mongos."""

from __future__ import annotations

import datetime

import bson
import pymongo
import pytest
from bson import Int64, ObjectId
from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, CursorNotFound, DuplicateKeyError, OperationFailure, WriteError

pytestmark = pytest.mark.through_mongos


def test_insert_assigns_id_first_and_round_trips_types(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    when = datetime.datetime(2024, 5, 1, 12, 30, 15, 123000)
    doc = {"b": 1, "nested": {"x": [1, 2.5, "s", None, True]}, "when": when, "big": Int64(2**40)}
    inserted = coll.insert_one(doc).inserted_id
    assert isinstance(inserted, ObjectId)
    stored = coll.find_one({"_id": inserted})
    assert list(stored) == ["_id", "b", "nested", "when", "big"]
    assert stored["nested"] == {"x": [1, 2.5, "s", None, True]} and stored["when"] == when
    assert stored["big"] == 2**40
    # A document whose _id is not first is stored with _id first.
    client[db_name].command("insert", "c", documents=[{"z": 1, "_id": "late"}])
    assert list(coll.find_one({"_id": "late"})) == ["_id", "z"]


def test_dates_outside_pythons_range_are_stored_as_sent(client: pymongo.MongoClient, db_name: str) -> None:
    # BSON dates are any int64 of milliseconds; year 292278994 is one MongoDB stores.
    far = bson.DatetimeMS(2**62)
    coll = client[db_name]["dates"]
    coll.insert_one({"_id": 1, "at": far})
    auto = bson.CodecOptions(datetime_conversion=bson.DatetimeConversion.DATETIME_AUTO)
    assert coll.with_options(codec_options=auto).find_one({"_id": 1}) == {"_id": 1, "at": far}


def test_insert_reply_shape_and_ordered_batches(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    reply = db.command("insert", "c", documents=[{"_id": 1}, {"_id": 2}])
    assert reply["n"] == 2 and reply["ok"] == 1.0 and "writeErrors" not in reply
    ordered = db.command("insert", "c", documents=[{"_id": 3}, {"_id": 1}, {"_id": 4}])
    assert ordered["n"] == 1
    [error] = ordered["writeErrors"]
    assert error["index"] == 1 and error["code"] == 11000
    assert (
        error["errmsg"]
        == f"E11000 duplicate key error collection: {db_name}.c index: _id_ dup key: {{ _id: 1 }}"
    )
    assert error["keyPattern"] == {"_id": 1} and error["keyValue"] == {"_id": 1}
    unordered = db.command(
        "insert", "c", documents=[{"_id": 5}, {"_id": 2}, {"_id": 6}, {"_id": 5}], ordered=False
    )
    assert unordered["n"] == 2
    assert [e["index"] for e in unordered["writeErrors"]] == [1, 3]
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2, 3, 5, 6]


def test_insert_many_raises_bulk_write_error(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": "dup"})
    with pytest.raises(BulkWriteError) as info:
        coll.insert_many([{"_id": "a"}, {"_id": "dup"}, {"_id": "b"}], ordered=False)
    details = info.value.details
    assert details["nInserted"] == 2
    assert details["writeErrors"][0]["index"] == 1
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": "dup"})


async def test_insert_and_duplicates_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    result = await coll.insert_many([{"_id": i} for i in range(5)])
    assert result.inserted_ids == [0, 1, 2, 3, 4]
    with pytest.raises(DuplicateKeyError) as info:
        await coll.insert_one({"_id": 3})
    assert info.value.code == 11000
    assert await coll.count_documents({}) == 5


def test_update_operators(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "n": 5, "drop": True, "arr": [1, 2], "old": "x", "m": 3, "lo": 5, "hi": 5})
    result = coll.update_one(
        {"_id": 1},
        {
            "$set": {"s": "v", "deep.er": 1},
            "$inc": {"n": 2},
            "$unset": {"drop": ""},
            "$push": {"arr": 3},
            "$addToSet": {"set": "a"},
            "$rename": {"old": "new"},
            "$mul": {"m": 4},
            "$min": {"lo": 2},
            "$max": {"hi": 9},
            "$currentDate": {"at": True},
        },
    )
    assert (result.matched_count, result.modified_count) == (1, 1)
    doc = coll.find_one({"_id": 1})
    assert doc["s"] == "v" and doc["deep"] == {"er": 1} and doc["n"] == 7
    assert "drop" not in doc and doc["arr"] == [1, 2, 3] and doc["set"] == ["a"]
    assert doc["new"] == "x" and "old" not in doc
    assert doc["m"] == 12 and doc["lo"] == 2 and doc["hi"] == 9
    assert isinstance(doc["at"], datetime.datetime)
    # An update that changes nothing matches but modifies nothing.
    same = coll.update_one({"_id": 1}, {"$set": {"s": "v"}})
    assert (same.matched_count, same.modified_count) == (1, 0)


def test_update_reply_shape_upsert_and_multi(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.c.insert_many([{"_id": i, "g": "a" if i < 3 else "b"} for i in range(5)])
    multi = db.command("update", "c", updates=[{"q": {"g": "a"}, "u": {"$set": {"seen": 1}}, "multi": True}])
    assert multi["n"] == 3 and multi["nModified"] == 3 and "upserted" not in multi
    upsert = db.command(
        "update",
        "c",
        updates=[
            {"q": {"_id": 10, "g": "c"}, "u": {"$set": {"new": True}}, "upsert": True},
            {"q": {"g": "b"}, "u": {"$set": {"seen": 2}}},
        ],
    )
    assert upsert["n"] == 2 and upsert["nModified"] == 1
    assert upsert["upserted"] == [{"index": 0, "_id": 10}]
    assert db.c.find_one({"_id": 10}) == {"_id": 10, "g": "c", "new": True}
    result = db.c.update_one({"g": "zzz"}, {"$setOnInsert": {"made": 1}, "$set": {"x": 1}}, upsert=True)
    made = db.c.find_one({"_id": result.upserted_id})
    assert made["g"] == "zzz" and made["made"] == 1 and made["x"] == 1
    assert next(iter(made)) == "_id"


def test_update_errors_are_write_errors(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "a": 1})
    with pytest.raises(WriteError) as immutable:
        coll.update_one({"_id": 1}, {"$set": {"_id": 2}})
    assert immutable.value.code == 66
    reply = client[db_name].command("update", "c", updates=[{"q": {}, "u": {"$frobnicate": {"a": 1}}}])
    assert reply["n"] == 0 and reply["writeErrors"][0]["code"] == 9
    assert coll.find_one({"_id": 1}) == {"_id": 1, "a": 1}


def test_replace_and_array_filters(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "grades": [80, 95, 70], "items": [{"q": 1}, {"q": 5}]})
    coll.update_one({"_id": 1}, {"$set": {"grades.$[g]": 100}}, array_filters=[{"g": {"$gte": 90}}])
    coll.update_one({"_id": 1}, {"$inc": {"items.$[].q": 10}})
    coll.update_one({"_id": 1}, {"$set": {"items.$[it].big": True}}, array_filters=[{"it.q": {"$gt": 12}}])
    doc = coll.find_one({"_id": 1})
    assert doc["grades"] == [80, 100, 70]
    assert doc["items"] == [{"q": 11}, {"q": 15, "big": True}]
    replaced = coll.replace_one({"_id": 1}, {"only": "this"})
    assert replaced.modified_count == 1
    assert coll.find_one({"_id": 1}) == {"_id": 1, "only": "this"}
    coll.replace_one({"_id": 2}, {"fresh": 1}, upsert=True)
    assert coll.find_one({"_id": 2}) == {"_id": 2, "fresh": 1}


async def test_updates_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.insert_many([{"_id": i, "v": i} for i in range(4)])
    many = await coll.update_many({"v": {"$gte": 2}}, {"$inc": {"v": 10}})
    assert (many.matched_count, many.modified_count) == (2, 2)
    upserted = await coll.update_one({"_id": 99}, {"$set": {"v": 0}}, upsert=True)
    assert upserted.upserted_id == 99
    assert sorted(d["v"] for d in await coll.find().to_list()) == [0, 0, 1, 12, 13]


def test_delete(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.c.insert_many([{"_id": i, "odd": i % 2} for i in range(6)])
    assert db.c.delete_one({"odd": 1}).deleted_count == 1
    assert db.c.delete_many({"odd": 1}).deleted_count == 2
    reply = db.command(
        "delete", "c", deletes=[{"q": {"_id": 0}, "limit": 1}, {"q": {"_id": 404}, "limit": 1}]
    )
    assert reply["n"] == 1 and reply["ok"] == 1.0
    assert db.missing.delete_many({}).deleted_count == 0
    assert sorted(d["_id"] for d in db.c.find()) == [2, 4]


async def test_delete_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.insert_many([{"k": 1}, {"k": 1}, {"k": 2}])
    assert (await coll.delete_many({"k": 1})).deleted_count == 2
    assert await coll.count_documents({}) == 1


def test_find_and_modify(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_many([{"_id": 1, "n": 1, "rank": 2}, {"_id": 2, "n": 1, "rank": 1}])
    before = coll.find_one_and_update({"n": 1}, {"$inc": {"n": 1}}, sort=[("rank", 1)])
    assert before == {"_id": 2, "n": 1, "rank": 1}
    after = coll.find_one_and_update(
        {"_id": 1}, {"$set": {"x": 1}}, projection={"x": 1}, return_document=ReturnDocument.AFTER
    )
    assert after == {"_id": 1, "x": 1}
    assert coll.find_one_and_update({"_id": 404}, {"$set": {"x": 1}}) is None
    upserted = coll.find_one_and_update(
        {"_id": 3}, {"$set": {"n": 9}}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert upserted == {"_id": 3, "n": 9}
    replaced = coll.find_one_and_replace({"_id": 3}, {"r": 1}, return_document=ReturnDocument.AFTER)
    assert replaced == {"_id": 3, "r": 1}
    removed = coll.find_one_and_delete({"_id": 3})
    assert removed == {"_id": 3, "r": 1}
    raw = client[db_name].command(
        "findAndModify", "c", query={"_id": 50}, update={"$set": {"a": 1}}, upsert=True
    )
    assert raw["lastErrorObject"] == {"n": 1, "updatedExisting": False, "upserted": 50}
    assert raw["value"] is None
    raw = client[db_name].command("findAndModify", "c", query={"_id": 50}, remove=True)
    assert raw["lastErrorObject"] == {"n": 1} and raw["value"] == {"_id": 50, "a": 1}
    with pytest.raises(OperationFailure) as both:
        client[db_name].command("findAndModify", "c", query={}, remove=True, update={"$set": {"a": 1}})
    assert both.value.code == 9


async def test_find_and_modify_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.insert_one({"_id": "counter", "seq": 0})
    for expected in (1, 2, 3):
        doc = await coll.find_one_and_update(
            {"_id": "counter"}, {"$inc": {"seq": 1}}, return_document=ReturnDocument.AFTER
        )
        assert doc["seq"] == expected


# MongoDB's limits: a stored document is at most 16 MiB of BSON; an object in a request may be
# 16 KiB larger (room for the command around a largest document); a message is at most 48 MB.
MAX_BSON = 16 * 1024 * 1024
MAX_REQUEST_OBJECT = MAX_BSON + 16 * 1024


def _sized(doc: dict, size: int) -> dict:
    """``doc`` plus a ``pad`` string that makes its BSON exactly ``size`` bytes."""
    return {**doc, "pad": "x" * (size - len(bson.encode({**doc, "pad": ""})))}


def test_insert_refuses_a_document_over_16_mib(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one(_sized({"_id": "fits"}, MAX_BSON))
    over = _sized({"_id": "over"}, MAX_BSON + 1)
    with pytest.raises(WriteError) as info:
        coll.insert_one(over)
    assert info.value.code == 2
    assert info.value.details["errmsg"] == (
        "object to insert too large. size in bytes: 16777217, max size: 16777216"
    )
    # An ordered batch stops at the document, as at any write error.
    with pytest.raises(BulkWriteError) as batch:
        coll.insert_many([{"_id": 1}, over, {"_id": 2}])
    details = batch.value.details
    assert details["nInserted"] == 1
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 2)]
    assert sorted(str(d["_id"]) for d in coll.find({}, {"_id": 1})) == ["1", "fits"]


def test_request_object_over_the_request_limit_fails_the_whole_command(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].c
    # The driver sends an acknowledged batch whatever its documents' sizes and lets the server judge.
    with pytest.raises(OperationFailure) as info:
        coll.insert_many([{"_id": 1}, _sized({"_id": "huge"}, MAX_REQUEST_OBJECT + 1)])
    assert info.value.code == 10334
    assert str(info.value.details["errmsg"]).startswith(
        "BSONObj size: 16793601 (0x1004001) is invalid. Size must be between 0 and 16793600(16MB)"
    )
    assert coll.count_documents({}) == 0


def test_update_refuses_a_result_over_16_mib(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    original = {"_id": 1, "a": "small"}
    coll.insert_one(original)
    grow = {"$set": {"pad": "x" * MAX_BSON}}
    with pytest.raises(WriteError) as update:
        coll.update_one({"_id": 1}, grow)
    with pytest.raises(WriteError) as replace:
        coll.replace_one({"_id": 1}, {"pad": "x" * MAX_BSON})
    for refused in (update, replace):
        assert refused.value.code == 17419
        assert "Resulting document after update is larger than 16777216" in refused.value.details["errmsg"]
    assert coll.find_one({"_id": 1}) == original
    # Exactly 16 MiB is allowed.
    coll.update_one({"_id": 1}, {"$set": {"pad": _sized(original, MAX_BSON)["pad"]}})
    assert len(bson.encode(coll.find_one({"_id": 1}))) == MAX_BSON


def test_upsert_refuses_a_new_document_over_16_mib(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    with pytest.raises(WriteError) as update:
        coll.update_one({"_id": "new"}, {"$set": {"pad": "x" * MAX_BSON}}, upsert=True)
    with pytest.raises(WriteError) as replace:
        coll.replace_one({"_id": "new"}, {"pad": "x" * MAX_BSON}, upsert=True)
    for refused in (update, replace):
        assert refused.value.code == 17420
        assert "Document to upsert is larger than 16777216" in refused.value.details["errmsg"]
    assert coll.count_documents({}) == 0


def test_find_and_modify_refuses_a_result_over_16_mib(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "a": "small"})
    big = "x" * MAX_BSON
    with pytest.raises(OperationFailure) as update:
        coll.find_one_and_update({"_id": 1}, {"$set": {"pad": big}})
    with pytest.raises(OperationFailure) as replace:
        coll.find_one_and_replace({"_id": 1}, {"pad": big})
    with pytest.raises(OperationFailure) as upsert:
        coll.find_one_and_update({"_id": 2}, {"$set": {"pad": big}}, upsert=True)
    assert (update.value.code, replace.value.code, upsert.value.code) == (17419, 17419, 17420)
    assert "Resulting document after update is larger than 16777216" in str(update.value.details["errmsg"])
    assert "Document to upsert is larger than 16777216" in str(upsert.value.details["errmsg"])
    assert list(coll.find()) == [{"_id": 1, "a": "small"}]


def test_find_filter_sort_skip_limit_projection(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_many([{"_id": i, "g": i % 3, "v": 10 - i, "sub": {"x": i}} for i in range(10)])
    assert [d["_id"] for d in coll.find({"g": 0}).sort("v", 1)] == [9, 6, 3, 0]
    assert [d["_id"] for d in coll.find().sort([("g", 1), ("v", -1)]).skip(2).limit(3)] == [6, 9, 1]
    assert list(coll.find({"_id": 4}, {"sub.x": 1, "_id": 0})) == [{"sub": {"x": 4}}]
    assert list(coll.find({"_id": 4}, {"sub": 0, "g": 0})) == [{"_id": 4, "v": 6}]
    assert [d["_id"] for d in coll.find({"v": {"$in": [1, 2]}, "sub.x": {"$gte": 8}})] == [8, 9]
    assert coll.find_one({"missing": {"$exists": True}}) is None
    with pytest.raises(OperationFailure):
        list(coll.find({"$bogusOperator": 1}))


def test_find_cursor_batches_getmore_and_kill(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.c.insert_many([{"_id": i} for i in range(250)])
    assert [d["_id"] for d in db.c.find().sort("_id", 1).batch_size(7)] == list(range(250))
    first = db.command("find", "c", batchSize=5, sort={"_id": 1})
    cursor = first["cursor"]
    assert [d["_id"] for d in cursor["firstBatch"]] == [0, 1, 2, 3, 4]
    assert cursor["id"] != 0 and cursor["ns"] == f"{db_name}.c"
    more = db.command("getMore", cursor["id"], collection="c", batchSize=3)
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [5, 6, 7]
    assert more["cursor"]["id"] == cursor["id"]
    killed = db.command("killCursors", "c", cursors=[cursor["id"]])
    assert killed["cursorsKilled"] == [cursor["id"]]
    with pytest.raises(CursorNotFound) as gone:
        db.command("getMore", cursor["id"], collection="c")
    assert gone.value.code == 43
    default_first = db.command("find", "c")
    assert len(default_first["cursor"]["firstBatch"]) == 101
    db.command("killCursors", "c", cursors=[default_first["cursor"]["id"]])
    single = db.command("find", "c", batchSize=2, singleBatch=True)
    assert single["cursor"]["id"] == 0 and len(single["cursor"]["firstBatch"]) == 2
    limited = db.command("find", "c", limit=3)
    assert limited["cursor"]["id"] == 0 and len(limited["cursor"]["firstBatch"]) == 3
    unknown = db.command("killCursors", "c", cursors=[Int64(123456789)])
    assert unknown["cursorsNotFound"] == [123456789]


async def test_find_cursor_batches_async(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.insert_many([{"_id": i} for i in range(120)])
    ids = [d["_id"] async for d in coll.find().sort("_id", -1).batch_size(11)]
    assert ids == list(range(119, -1, -1))
    cursor = coll.find().batch_size(2)
    await cursor.next()
    await cursor.close()
    with pytest.raises(OperationFailure) as info:
        await async_client[db_name].command("getMore", Int64(987654321), collection="c")
    assert info.value.code == 43


def test_type_takes_aliases_codes_and_arrays_of_them(client: pymongo.MongoClient, db_name: str) -> None:
    from bson import Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

    coll = client[db_name].types
    oid = ObjectId()
    coll.insert_many(
        [
            {"_id": 1, "v": None},
            {"_id": 2, "v": 5},
            {"_id": 3, "v": Int64(5)},
            {"_id": 4, "v": 2.5},
            {"_id": 5, "v": "text"},
            {"_id": 6, "v": oid},
            {"_id": 7, "v": Timestamp(1, 2)},
            {"_id": 8, "v": Regex("^a")},
            {"_id": 9, "v": MinKey()},
            {"_id": 10, "v": MaxKey()},
            {"_id": 11, "v": [1, "x"]},
            {"_id": 12},
        ]
    )

    def ids(type_: object) -> list[int]:
        return [d["_id"] for d in coll.find({"v": {"$type": type_}}, sort=[("_id", 1)])]

    assert ids("null") == [1]
    assert ids(10) == [1]
    assert ids("int") == [2, 11]
    assert ids("long") == [3]
    assert ids("number") == [2, 3, 4, 11]
    assert ids(["string", "objectId"]) == [5, 6, 11]
    assert ids([17, "regex"]) == [7, 8]
    assert ids(["minKey", "maxKey"]) == [9, 10]
    assert ids("array") == [11]
    with pytest.raises(pymongo.errors.OperationFailure) as refused:
        coll.find_one({"v": {"$type": "no such type"}})
    assert refused.value.code == 2


def test_regex_options_take_the_letters_mongod_knows_and_refuse_others(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].names
    coll.insert_many([{"_id": 1, "v": "Alpha"}, {"_id": 2, "v": "beta\nALPHA"}, {"_id": 3, "v": "gamma"}])

    def ids(options: str) -> list[int]:
        found = coll.find({"v": {"$regex": "^alpha", "$options": options}}, sort=[("_id", 1)])
        return [d["_id"] for d in found]

    assert ids("") == []
    assert ids("i") == [1]
    assert ids("im") == [1, 2]
    assert ids("iu") == [1]
    with pytest.raises(OperationFailure) as refused:
        ids("ig")  # g is JavaScript's, not mongod's
    assert refused.value.code == 51108
    assert "invalid flag in regex options: g" in str(refused.value)
