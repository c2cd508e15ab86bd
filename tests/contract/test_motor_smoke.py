"""One end-to-end pass with motor: the async driver many applications still use."""

from __future__ import annotations

import pytest

motor_asyncio = pytest.importorskip(
    "motor.motor_asyncio", reason='motor is an extra: pip install "flowwarden[motor]"'
)


async def test_motor_crud_transaction_and_change_stream(mongodb_uri: str, db_name: str) -> None:
    client = motor_asyncio.AsyncIOMotorClient(mongodb_uri, serverSelectionTimeoutMS=10_000)
    try:
        coll = client[db_name].orders
        await coll.create_index("sku", unique=True)
        await coll.insert_many([{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}])
        await coll.update_one({"sku": "a"}, {"$inc": {"qty": 5}})
        assert [d["qty"] async for d in coll.find({}, {"_id": 0}).sort("sku", 1)] == [6, 2]
        async with await client.start_session() as session, session.start_transaction():
            await coll.insert_one({"sku": "c", "qty": 3}, session=session)
        assert await coll.count_documents({}) == 3
        async with coll.watch(max_await_time_ms=100) as stream:
            await coll.delete_one({"sku": "b"})
            change = None
            for _ in range(50):
                change = await stream.try_next()
                if change is not None:
                    break
        assert change is not None and change["operationType"] == "delete"
    finally:
        client.close()
