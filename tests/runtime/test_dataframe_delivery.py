"""@on_dataframe batches around their conversion, without a JVM: the connector is handed a
session whose ``createDataFrame`` returns the Arrow table it is given, so each batch goes through
the real conversion (schemas, modes, undecodable events, inferred schemas) and the method gets
that table. What Spark itself does with the table is tested under tests/spark."""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from typing import Any

import pymongo
import pytest
from bson.codec_options import TypeDecoder, TypeRegistry
from bson.decimal128 import Decimal128
from pydantic import BaseModel

import flowwarden.spark
import flowwarden.spark.infer as infer
from flowwarden import (
    Connector,
    OnError,
    StreamContext,
    change_stream,
    checkpoint,
    on_dataframe,
    retry_policy,
)
from helpers import checkpoint_doc, events_counted, running, wait_until, wait_until_async

from .test_raw_strings import order


class ArrowSession:
    """A stand-in SparkSession: ``createDataFrame`` returns the Arrow table, and keeps its schema."""

    def __init__(self) -> None:
        self.schemas: list[Any] = []

    def createDataFrame(self, table: Any, schema: Any) -> Any:  # SparkSession's name
        self.schemas.append(schema)
        return table


class Named(BaseModel):
    name: str


def frames(db: str, tables: list[Any], **dataframe: Any) -> type:
    """An @on_dataframe class on ``db.orders`` that keeps every table it gets (and needs the
    batch's context to)."""
    options = {"max_events": 100, "max_wait_seconds": 0.3, **dataframe}

    @change_stream(
        "orders",
        db,
        name="orders",
        max_await_time_ms=50,
        restart_initial_delay_seconds=0.05,
        restart_max_delay_seconds=0.1,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=3, initial_delay_seconds=0.01, on_exhausted=OnError.DEAD_LETTER)
    class Frames:
        @on_dataframe(**options)
        def write(self, table: Any, ctx: StreamContext) -> None:
            assert ctx.batch_id, "a DataFrame batch's context names it by its first event"
            tables.append(table)

    return Frames


def processed(client: pymongo.MongoClient[Any], db: str) -> int:
    return int((checkpoint_doc(client, db, "orders") or {}).get("eventsProcessed", 0))


# ------------------------------------------------------------------------------------------------
# batches that cannot become DataFrames


def test_a_batch_without_a_spark_session_is_given_up_on_at_once_with_the_sessions_error(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[str] = []

    def no_session(**options: Any) -> Any:
        starts.append(options["master"])
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(flowwarden.spark, "get_or_create_session", no_session)
    tables: list[Any] = []
    with running(mongodb_uri, [frames(db_name, tables)], metrics_port=0) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(3)])
        wait_until(lambda: processed(client, db_name) == 3, what="the batch given up on")
        counted = events_counted(connector)
    assert tables == []
    assert starts == ["local[*]"]  # not retried: a session that cannot start does not start on a retry
    assert counted == {("insert", "dead_lettered"): 3}
    letters = sorted(
        client[db_name]["_fw_dlq"].find(), key=lambda letter: letter["event"]["documentKey"]["_id"]
    )
    assert [letter["event"]["documentKey"]["_id"] for letter in letters] == [0, 1, 2]
    for letter in letters:
        assert letter["errorType"] == "builtins.RuntimeError"
        assert letter["message"] == "Java gateway process exited before sending its port number"
        assert letter["attempts"] == 1


def test_a_batch_whose_conversion_fails_is_given_up_on_at_once_with_the_conversions_error(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    session = ArrowSession()
    tables: list[Any] = []
    handler = frames(db_name, tables, schema=Named, mode="FAILFAST")
    with running(mongodb_uri, [handler], spark=session) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": 1, "name": "a"}, {"_id": 2, "name": 2}])
        wait_until(lambda: processed(client, db_name) == 2, what="the batch given up on")
        assert connector.status()["orders"].events_failed == 2
    assert tables == [] and session.schemas == []
    letters = sorted(
        client[db_name]["_fw_dlq"].find(), key=lambda letter: letter["event"]["documentKey"]["_id"]
    )
    assert [letter["event"]["documentKey"]["_id"] for letter in letters] == [1, 2]
    for letter in letters:
        assert letter["errorType"].endswith("SchemaMismatchError")
        assert "name" in letter["message"] and letter["attempts"] == 1


# ------------------------------------------------------------------------------------------------
# each event counted once


def test_a_batch_with_an_undecodable_and_a_malformed_event_counts_each_event_once(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="flowwarden")
    tables: list[Any] = []
    handler = frames(db_name, tables, schema=Named, mode="DROPMALFORMED")
    with running(mongodb_uri, [handler], spark=ArrowSession(), metrics_port=0) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        # 3's name is not UTF-8 (the event cannot be decoded); 6's is a number (it does not fit).
        documents: list[Any] = [order(i, b"n\xff" if i == 3 else f"n{i}".encode()) for i in range(10)]
        documents[6] = {"_id": 6, "name": 6}
        client[db_name].orders.insert_many(documents)
        wait_until(lambda: processed(client, db_name) == 10, what="the batch")
        counted = events_counted(connector)
        status = connector.status()["orders"]
    (table,) = tables
    assert [document["name"] for document in table.column("full_document").to_pylist()] == [
        f"n{i}" for i in range(10) if i not in (3, 6)
    ]
    assert status.events_failed == 2
    # Both given up on alone, each under its own outcome only; the other eight with their batch.
    assert counted == {("insert", "ok"): 8, ("insert", "dead_lettered"): 2}
    keys = sorted(letter["event"]["documentKey"]["_id"] for letter in client[db_name]["_fw_dlq"].find())
    assert keys == [3, 6]
    (line,) = [r.getMessage() for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert line.startswith("stream orders: an event of a DataFrame batch cannot be decoded: ")


# ------------------------------------------------------------------------------------------------
# inferred schemas


@pytest.fixture
def samplings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every sampling a stream makes to infer its schema: the collection's codec options, and
    the sample's size."""
    made: list[Any] = []
    sample = infer.infer_document_spec_async

    async def counted(collection: Any, **options: Any) -> Any:
        made.append((collection.codec_options, options.get("sample_size")))
        return await sample(collection, **options)

    monkeypatch.setattr(infer, "infer_document_spec_async", counted)
    return made


def test_an_inferred_schema_takes_the_hints_over_what_the_sample_found(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    samplings: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client[db_name].orders.insert_many([{"_id": i, "qty": i, "sku": f"s{i}"} for i in range(3)])
    tables: list[Any] = []
    handler = frames(db_name, tables, schema="infer", schema_hints="qty BIGINT", sample_size=50)
    caplog.set_level(logging.INFO, logger="flowwarden.runtime.batching")
    with running(mongodb_uri, [handler], spark=ArrowSession()) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_one({"_id": 3, "qty": 3, "sku": "s3"})
        wait_until(lambda: tables, what="the batch")
        status = connector.status()["orders"]
    assert status.inferred_schema == "`_id` INT, `qty` BIGINT, `sku` STRING"
    (table,) = tables
    full = table.schema.field("full_document").type
    assert str(full.field("qty").type) == "int64" and str(full.field("_id").type) == "int32"
    # An inferred schema keeps what does not fit it: the batch has the rescued-data column.
    assert table.column_names[-1] == "_rescued_data"
    assert [sample_size for _, sample_size in samplings] == [50]
    lines = [r.getMessage() for r in caplog.records if r.name == "flowwarden.runtime.batching"]
    assert lines == [
        "stream orders: full_document schema inferred from a sample of up to 50 documents: "
        "`_id` INT, `qty` BIGINT, `sku` STRING"
    ]


class DecimalsAsFloats(TypeDecoder):
    """A client's decoder that reads every Decimal128 as a float."""

    bson_type = Decimal128

    def transform_bson(self, value: Decimal128) -> float:
        return float(value.to_decimal())


def test_the_sample_reads_plain_bson_whatever_the_clients_type_registry(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, samplings: list[Any]
) -> None:
    client[db_name].orders.insert_many([{"_id": i, "amount": Decimal128(f"{i}.25")} for i in range(3)])
    tables: list[Any] = []
    handler = frames(db_name, tables, schema="infer")

    async def run() -> Any:
        async_client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(
            mongodb_uri, type_registry=TypeRegistry([DecimalsAsFloats()])
        )
        connector = Connector(async_client, [handler], spark=ArrowSession())
        task = asyncio.create_task(connector.run_async())
        try:
            await wait_until_async(
                lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint"
            )
            client[db_name].orders.insert_one({"_id": 3, "amount": Decimal128("3.25")})
            await wait_until_async(lambda: tables, what="the batch")
            return connector.status()["orders"]
        finally:
            connector.stop()
            await task
            await async_client.close()

    status = asyncio.run(run())
    # The batch is converted from the events' BSON, where the amounts are decimals: so is the sample.
    assert status.inferred_schema == "`_id` INT, `amount` DECIMAL(3,2)"
    (table,) = tables
    (document,) = table.column("full_document").to_pylist()
    assert document == {"_id": 3, "amount": Decimal("3.25")}
    ((options, _),) = samplings
    assert options.type_registry == TypeRegistry()


def test_an_inferred_schema_is_sampled_once_and_kept_when_the_stream_reopens(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, samplings: list[Any], fail_command: Any
) -> None:
    client[db_name].orders.insert_many([{"_id": i, "qty": i} for i in range(3)])
    tables: list[Any] = []
    with running(mongodb_uri, [frames(db_name, tables, schema="infer")], spark=ArrowSession()) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_one({"_id": 3, "qty": 3})
        wait_until(lambda: processed(client, db_name) == 1, what="the first batch")
        # BadValue, without a resumable label: the driver gives up and the stream re-opens.
        fail_command(["getMore"], mode={"times": 1}, errorCode=2)
        wait_until(lambda: connector.status()["orders"].restarts >= 1, what="a re-open")
        client[db_name].orders.insert_one({"_id": 4, "qty": 4})
        wait_until(lambda: processed(client, db_name) == 2, what="the batch after the re-open")
    assert len(samplings) == 1
    assert [t.column("full_document").to_pylist() for t in tables] == [
        [{"_id": 3, "qty": 3}],
        [{"_id": 4, "qty": 4}],
    ]


def test_a_dataframe_stream_with_a_given_schema_samples_nothing(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    samplings: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="flowwarden.runtime.batching")
    tables: list[Any] = []
    session = ArrowSession()
    with running(mongodb_uri, [frames(db_name, tables, schema=Named)], spark=session) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="initial checkpoint")
        client[db_name].orders.insert_one({"_id": 1, "name": "a"})
        wait_until(lambda: tables, what="the batch")
        status = connector.status()["orders"]
    assert samplings == [] and status.inferred_schema is None
    assert [r.getMessage() for r in caplog.records if r.name == "flowwarden.runtime.batching"] == []
    (struct,) = session.schemas
    assert "_rescued_data" not in struct.fieldNames()
