"""@on_dataframe streams read the events' BSON as the server sent it and convert it without
decoding it into dicts first; what the client's codec options change keeps the decoded path.
An event of such a batch that cannot be decoded gets on_exhausted alone."""

from __future__ import annotations

import asyncio
import functools
import logging
from decimal import Decimal
from typing import Any

import pymongo
import pytest
from bson import Decimal128
from bson.codec_options import TypeDecoder, TypeRegistry

import flowwarden.spark
import helpers
from flowwarden import Connector, OnError, StreamState, change_stream, checkpoint, on_dataframe, retry_policy
from flowwarden.errors import UndecodableEventError
from flowwarden.mongo.raw_events import RawEvent
from helpers import checkpoint_doc, events_counted

pytestmark = pytest.mark.spark

# Spark jobs take their time: every wait here allows a minute.
wait_until = functools.partial(helpers.wait_until, timeout=60.0)


@pytest.fixture
def conversions(monkeypatch):
    """The event lists the connector hands to events_to_dataframe, batch by batch."""
    batches: list[list[Any]] = []
    convert = flowwarden.spark.events_to_dataframe

    def recording(spark, events, **kwargs):
        batches.append(list(events))
        return convert(spark, events, **kwargs)

    monkeypatch.setattr(flowwarden.spark, "events_to_dataframe", recording)
    return batches


def frames_handler(db_name: str, rows: list[Any], **retry: Any) -> type:
    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=1, **retry)
    class Frames:
        @on_dataframe(max_events=100, max_wait_seconds=0.3)
        def write(self, df: Any) -> None:
            rows.extend(df.orderBy("_id").collect())

    return Frames


def test_a_dataframe_stream_converts_the_bytes_the_server_sent(
    spark, mongodb_uri, client, db_name, conversions
):
    rows: list[Any] = []
    connector = Connector(mongodb_uri, [frames_handler(db_name, rows)], spark=spark)
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i, "amount": Decimal128(f"{i}.5")} for i in range(4)])
        client[db_name].orders.update_one({"_id": 2}, {"$set": {"amount": Decimal128("9.25")}})
        wait_until(lambda: checkpoint_doc(client, db_name).get("eventsProcessed") == 5, what="the batch")
    finally:
        connector.stop()
    events = [event for batch in conversions for event in batch]
    assert events and all(type(event) is RawEvent for event in events)
    assert [r["operation_type"] for r in rows] == ["insert"] * 4 + ["update"]
    assert rows[0]["full_document"] == '{"_id":{"$numberInt":"0"},"amount":{"$numberDecimal":"0.5"}}'
    assert rows[4]["updated_fields"] == '{"amount":{"$numberDecimal":"9.25"}}'
    # the checkpoint holds a plain token document, not the raw event's bytes
    token = checkpoint_doc(client, db_name)["lastProcessedToken"]
    assert set(token) == {"_data"} and token["_data"] == rows[4]["_id"]


class _AmountAsDecimal(TypeDecoder):
    bson_type = Decimal128

    def transform_bson(self, value: Decimal128) -> Decimal:
        return value.to_decimal()


ONE_ORDER = '{"_id":{"$numberInt":"1"},"amount":{"$numberDecimal":"1.5"}}'


def _run_with_client(spark, client, db_name, async_client, rows) -> None:
    async def run() -> None:
        connector = Connector(async_client, [frames_handler(db_name, rows)], spark=spark)
        task = asyncio.create_task(connector.run_async())
        try:
            for _ in range(600):
                if checkpoint_doc(client, db_name):
                    break
                await asyncio.sleep(0.05)
            client[db_name].orders.insert_one({"_id": 1, "amount": Decimal128("1.5")})
            for _ in range(600):
                if (checkpoint_doc(client, db_name) or {}).get("eventsProcessed") == 1:
                    break
                await asyncio.sleep(0.05)
        finally:
            connector.stop()
            await task
            await async_client.close()

    asyncio.run(run())


def test_type_decoders_of_the_client_do_not_change_the_columns(
    spark, mongodb_uri, client, db_name, conversions
):
    """The DataFrame columns follow flowwarden's BSON mapping, not Python types a decoder makes."""
    rows: list[Any] = []
    registry = TypeRegistry([_AmountAsDecimal()])
    _run_with_client(
        spark, client, db_name, pymongo.AsyncMongoClient(mongodb_uri, type_registry=registry), rows
    )
    events = [event for batch in conversions for event in batch]
    assert len(events) == 1 and type(events[0]) is RawEvent
    assert [r["full_document"] for r in rows] == [
        '{"_id":{"$numberInt":"1"},"amount":{"$numberDecimal":"1.5"}}'
    ]


def test_a_client_lenient_with_invalid_utf8_keeps_the_decoded_path(
    spark, mongodb_uri, client, db_name, conversions
):
    rows: list[Any] = []
    lenient = pymongo.AsyncMongoClient(mongodb_uri, unicode_decode_error_handler="replace")
    _run_with_client(spark, client, db_name, lenient, rows)
    events = [event for batch in conversions for event in batch]
    assert len(events) == 1 and type(events[0]) is dict
    assert [r["full_document"] for r in rows] == [
        '{"_id":{"$numberInt":"1"},"amount":{"$numberDecimal":"1.5"}}'
    ]


@pytest.fixture
def event_three_undecodable(monkeypatch):
    """A converter that finds the bytes of the event for document 3 undecodable, as it does for
    damaged BSON, which no server sends (tests/runtime/test_raw_strings.py reads real events
    whose text is not UTF-8)."""
    convert = flowwarden.spark.events_to_dataframe

    def refusing(spark, events, **kwargs):
        for index, event in enumerate(events):
            if event["documentKey"]["_id"] == 3:
                raise UndecodableEventError(index, "invalid UTF-8 in fullDocument.name")
        return convert(spark, events, **kwargs)

    monkeypatch.setattr(flowwarden.spark, "events_to_dataframe", refusing)


def _run_with_poison(
    spark, mongodb_uri, client, db_name, on_exhausted: OnError
) -> tuple[Any, list[Any], dict[tuple[str, str], float]]:
    rows: list[Any] = []
    connector = Connector(
        mongodb_uri,
        [frames_handler(db_name, rows, on_exhausted=on_exhausted)],
        spark=spark,
        metrics_port=0,
    )
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i, "name": f"n{i}"} for i in range(6)])
        wait_until(
            lambda: (
                checkpoint_doc(client, db_name).get("eventsProcessed") == 6
                or connector.status()["orders"].state == StreamState.FAILED
            ),
            what="the batch or the failure",
        )
        status = connector.status()["orders"]
        # A connector whose every stream failed has stopped serving its metrics.
        counted = {} if status.state == StreamState.FAILED else events_counted(connector)
    finally:
        connector.stop()
    return status, rows, counted


def test_an_undecodable_event_is_dead_lettered_alone(
    spark, mongodb_uri, client, db_name, event_three_undecodable, caplog
):
    caplog.set_level(logging.ERROR, logger="flowwarden")
    status, rows, counted = _run_with_poison(spark, mongodb_uri, client, db_name, OnError.DEAD_LETTER)
    (line,) = [r.getMessage() for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert line.startswith("stream orders: an event of a DataFrame batch cannot be decoded: ")
    assert [r["full_document"] for r in rows] == [
        f'{{"_id":{{"$numberInt":"{i}"}},"name":"n{i}"}}' for i in (0, 1, 2, 4, 5)
    ]
    assert status.events_failed == 1
    # Each event once: the undecodable one under its own outcome, not also with its batch.
    assert counted == {("insert", "ok"): 5, ("insert", "dead_lettered"): 1}
    (letter,) = client[db_name]["_fw_dlq"].find()
    assert letter["event"]["documentKey"] == {"_id": 3}
    assert letter["event"]["fullDocument"] == {"_id": 3, "name": "n3"}
    assert letter["errorType"].endswith("UndecodableEventError") and letter["attempts"] == 1
    assert checkpoint_doc(client, db_name)["eventsProcessed"] == 6


def test_an_undecodable_event_with_stop_stops_before_the_batch(
    spark, mongodb_uri, client, db_name, event_three_undecodable
):
    status, rows, _ = _run_with_poison(spark, mongodb_uri, client, db_name, OnError.STOP)
    assert status.state == StreamState.FAILED and "UndecodableEventError" in (status.last_error or "")
    assert rows == []  # the method never saw the batch
    assert checkpoint_doc(client, db_name).get("eventsProcessed", 0) == 0
