"""Change streams through PyMongo's AsyncMongoClient (motor has its own smoke test, test_motor_smoke.py),
from a replica set and through a mongos."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from bson import Int64
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure

from flowwarden.events import compare_tokens, token_cluster_time

pytestmark = pytest.mark.through_mongos

AWAIT_MS = 100


async def next_change(stream: AsyncChangeStream, attempts: int = 100) -> dict[str, Any]:
    for _ in range(attempts):
        change = await stream.try_next()
        if change is not None:
            return change
        if not stream.alive:
            break
    raise AssertionError("no change arrived")


async def changes(stream: AsyncChangeStream, count: int) -> list[dict[str, Any]]:
    return [await next_change(stream) for _ in range(count)]


async def test_document_events(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    async with await coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        await coll.insert_one({"_id": 1, "a": {"b": 1}})
        await coll.update_one({"_id": 1}, {"$set": {"a.b": 2}})
        await coll.delete_one({"_id": 1})
        insert, update, delete = await changes(stream, 3)
    assert insert["fullDocument"] == {"_id": 1, "a": {"b": 1}}
    assert update["updateDescription"]["updatedFields"] == {"a.b": 2}
    assert delete["documentKey"] == {"_id": 1}
    assert compare_tokens(insert["_id"], update["_id"]) == -1 == compare_tokens(update["_id"], delete["_id"])


async def test_pre_and_post_images(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    db = async_client[db_name]
    await db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    await db.c.insert_one({"_id": 1, "v": 1})
    async with await db.c.watch(
        full_document="required", full_document_before_change="required", max_await_time_ms=AWAIT_MS
    ) as stream:
        await db.c.update_one({"_id": 1}, {"$inc": {"v": 1}})
        event = await next_change(stream)
    assert event["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
    assert event["fullDocument"] == {"_id": 1, "v": 2}


async def test_post_batch_resume_token_advances_when_filtered(
    async_client: pymongo.AsyncMongoClient, db_name: str
) -> None:
    coll = async_client[db_name].c
    pipeline = [{"$match": {"operationType": "delete"}}]
    async with await coll.watch(pipeline, max_await_time_ms=AWAIT_MS) as stream:
        assert await stream.try_next() is None
        before = stream.resume_token
        async with async_client.start_session() as session:
            await coll.insert_one({"_id": 1}, session=session)
            written = session.operation_time
        assert written is not None
        for _ in range(50):
            assert await stream.try_next() is None
            if token_cluster_time(stream.resume_token) >= written:
                break
        assert compare_tokens(stream.resume_token, before) == 1
        assert token_cluster_time(stream.resume_token) >= written


async def test_transaction_events(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    db = async_client[db_name]
    await db.create_collection("c")
    async with await db.c.watch(max_await_time_ms=AWAIT_MS) as stream:
        async with async_client.start_session() as session:
            async with await session.start_transaction():
                await db.c.insert_one({"_id": 1}, session=session)
                await db.c.insert_one({"_id": 2}, session=session)
            lsid = session.session_id
        first, second = await changes(stream, 2)
    assert first["clusterTime"] == second["clusterTime"]
    assert first["lsid"] == lsid == second["lsid"]
    assert first["txnNumber"] == Int64(1) == second["txnNumber"]


async def test_invalidate_and_start_after(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    coll = async_client[db_name].c
    await coll.insert_one({"_id": 0})
    async with await coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        await coll.drop()
        drop, invalidate = await changes(stream, 2)
        assert (drop["operationType"], invalidate["operationType"]) == ("drop", "invalidate")
        assert not stream.alive
    await coll.insert_one({"_id": 1})
    async with await coll.watch(start_after=invalidate["_id"], max_await_time_ms=AWAIT_MS) as again:
        assert (await next_change(again))["documentKey"] == {"_id": 1}
    with pytest.raises(OperationFailure) as info:
        await coll.watch(resume_after=invalidate["_id"])
    assert info.value.code == 260


async def test_forbidden_stage(async_client: pymongo.AsyncMongoClient, db_name: str) -> None:
    with pytest.raises(OperationFailure) as info:
        await async_client[db_name].c.watch([{"$group": {"_id": None}}])
    assert info.value.code == 20
