"""Events of documents holding a string that is not UTF-8, which MongoDB stores as the client sent
it: a connector whose client decodes strictly cannot decode such an event and gives up on it
alone under its retry policy's on_exhausted; a client that tolerates such text handles it like
any other event; a DataFrame stream reads the event's bytes and gives up on that event alone."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pymongo
import pytest
from bson.raw_bson import RawBSONDocument

from flowwarden import (
    ChangeEvent,
    Connector,
    OnError,
    StreamState,
    change_stream,
    checkpoint,
    on_change,
    on_dataframe,
    retry_policy,
)
from helpers import checkpoint_doc, running, wait_until, wait_until_async

_INT32 = struct.Struct("<i")
POISON = 5


def order(number: int, name: bytes) -> RawBSONDocument:
    """``{_id: number, name: <name's bytes>}`` as BSON built by hand: PyMongo encodes only valid
    UTF-8, MongoDB stores whatever bytes a string holds."""
    body = (
        b"\x10_id\x00" + _INT32.pack(number) + b"\x02name\x00" + _INT32.pack(len(name) + 1) + name + b"\x00"
    )
    return RawBSONDocument(_INT32.pack(len(body) + 5) + body + b"\x00")


def ten_orders() -> list[Any]:
    """Orders 0 to 9; order 5's name is not UTF-8."""
    return [order(i, b"n\xff" if i == POISON else f"n{i}".encode()) for i in range(10)]


def orders_handler(db: str, on_exhausted: OnError, seen: list[tuple[int, str]]) -> type:
    @change_stream("orders", db, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=3, initial_delay_seconds=0.01, on_exhausted=on_exhausted)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            full = event.full_document or {}
            seen.append((event.document_key["_id"], full.get("name", "")))

    return Orders


def events_processed(client: pymongo.MongoClient, db: str) -> int:
    return int((checkpoint_doc(client, db, "orders") or {}).get("eventsProcessed", 0))


@pytest.mark.parametrize("on_exhausted", [OnError.SKIP, OnError.DEAD_LETTER])
def test_a_strict_client_gives_up_on_that_event_alone_and_carries_on(
    mongodb_uri: str, client: pymongo.MongoClient, db_name: str, on_exhausted: OnError
) -> None:
    seen: list[tuple[int, str]] = []
    with running(mongodb_uri, [orders_handler(db_name, on_exhausted, seen)]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many(ten_orders())
        wait_until(lambda: events_processed(client, db_name) == 10, what="the ten events")
        client[db_name].orders.insert_one({"_id": 10, "name": "n10"})
        wait_until(lambda: events_processed(client, db_name) == 11, what="the event after them")
        status = connector.status()["orders"]
    assert [key for key, _ in seen] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert status.events_failed == 1
    letters = list(client[db_name]["_fw_dlq"].find())
    if on_exhausted is OnError.SKIP:
        assert letters == []
        return
    (letter,) = letters
    assert letter["event"]["documentKey"] == {"_id": POISON}
    assert letter["event"]["fullDocument"] == {"_id": POISON, "name": "n\\xff"}  # the bytes, readable
    assert letter["errorType"] == "bson.errors.InvalidBSON" and letter["attempts"] == 1


def test_a_strict_client_with_stop_fails_before_that_event(
    mongodb_uri: str, client: pymongo.MongoClient, db_name: str
) -> None:
    seen: list[tuple[int, str]] = []
    with running(mongodb_uri, [orders_handler(db_name, OnError.STOP, seen)]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many(ten_orders())
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
    assert [key for key, _ in seen] == [0, 1, 2, 3, 4]
    assert events_processed(client, db_name) == 5
    assert client[db_name]["_fw_dlq"].count_documents({}) == 0


def test_a_client_tolerating_such_text_handles_the_event(
    mongodb_uri: str, client: pymongo.MongoClient, db_name: str
) -> None:
    seen: list[tuple[int, str]] = []
    handler = orders_handler(db_name, OnError.STOP, seen)

    async def run() -> None:
        lenient = pymongo.AsyncMongoClient(mongodb_uri, unicode_decode_error_handler="replace")
        connector = Connector(lenient, [handler])
        task = asyncio.create_task(connector.run_async())
        try:
            await wait_until_async(
                lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint"
            )
            client[db_name].orders.insert_many(ten_orders())
            await wait_until_async(lambda: events_processed(client, db_name) == 10, what="the ten events")
        finally:
            connector.stop()
            await task
            await lenient.close()

    asyncio.run(run())
    assert seen[POISON] == (POISON, "n\ufffd")  # the byte 0xff, as the client's "replace" reads it
    assert [key for key, _ in seen] == list(range(10))


@pytest.mark.spark
def test_a_dataframe_stream_gives_up_on_that_event_alone(
    mongodb_uri: str, client: pymongo.MongoClient, db_name: str, spark: Any
) -> None:
    rows: list[Any] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=1, on_exhausted=OnError.DEAD_LETTER)
    class Frames:
        @on_dataframe(max_events=100, max_wait_seconds=0.3)
        def write(self, df: Any) -> None:
            rows.extend(df.orderBy("_id").collect())

    with running(mongodb_uri, [Frames], spark=spark) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint", timeout=120)
        client[db_name].orders.insert_many(ten_orders())
        wait_until(lambda: events_processed(client, db_name) == 10, what="the batch", timeout=120)
        status = connector.status()["orders"]
    assert [row["full_document"] for row in rows] == [
        f'{{"_id":{{"$numberInt":"{i}"}},"name":"n{i}"}}' for i in range(10) if i != POISON
    ]
    assert status.events_failed == 1
    (letter,) = client[db_name]["_fw_dlq"].find()
    assert letter["event"]["fullDocument"] == {"_id": POISON, "name": "n\\xff"}
    assert letter["errorType"].endswith("UndecodableEventError") and letter["attempts"] == 1


@pytest.mark.parametrize("on_exhausted", [OnError.SKIP, OnError.DEAD_LETTER, OnError.STOP])
def test_the_initial_snapshot_gives_up_on_a_document_it_cannot_decode_alone(
    mongodb_uri: str, client: pymongo.MongoClient, db_name: str, on_exhausted: OnError
) -> None:
    from flowwarden import Snapshot

    client[db_name].orders.insert_many(ten_orders())
    seen: list[tuple[int, str]] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, snapshot_chunk_size=4)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted=on_exhausted)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append((event.document_key["_id"], (event.full_document or {}).get("name", "")))

    with running(mongodb_uri, [Orders]) as connector:
        if on_exhausted is OnError.STOP:
            wait_until(lambda: connector.status()["orders"].state is StreamState.FAILED, what="the stop")
        else:
            wait_until(
                lambda: (s := connector.status()["orders"].snapshot) is not None and s.done, what="copy"
            )
        status = connector.status()["orders"]
    if on_exhausted is OnError.STOP:
        # It stops before the chunk holding it (4 to 7), whose progress stays before it.
        assert [key for key, _ in seen] == [0, 1, 2, 3]
        assert status.snapshot is not None and status.snapshot.copied == 4
        assert connector.stream_errors()["orders"] is not None
        return
    assert seen == [(i, f"n{i}") for i in range(10) if i != POISON]
    assert status.events_failed == 1 and status.snapshot is not None and status.snapshot.copied == 10
    letters = list(client[db_name]["_fw_dlq"].find())
    if on_exhausted is OnError.DEAD_LETTER:
        (letter,) = letters
        assert letter["event"]["operationType"] == "snapshot" and letter["event"]["documentKey"] == {
            "_id": POISON
        }
    else:
        assert letters == []
