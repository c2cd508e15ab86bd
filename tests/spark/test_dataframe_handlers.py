"""@on_dataframe methods inside the connector: columns, checkpoint after return, modes, failures."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import helpers
from flowwarden import (
    Connector,
    OnError,
    StreamContext,
    StreamState,
    change_stream,
    checkpoint,
    on_dataframe,
    retry_policy,
)
from helpers import checkpoint_doc

pytestmark = pytest.mark.spark

# Spark jobs take their time: every wait here allows a minute.
wait_until = functools.partial(helpers.wait_until, timeout=60.0)

ROOT = Path(__file__).resolve().parents[2]


class Item(BaseModel):
    qty: int
    sku: str


def test_dataframe_batches_carry_the_events_and_checkpoint_after_return(
    spark, mongodb_uri, client, db_name, caplog
):
    caplog.set_level(logging.DEBUG, logger="flowwarden.checkpoints")

    def heartbeats() -> list[str]:
        return [r.getMessage() for r in caplog.records if "heartbeat; no event finished" in r.getMessage()]

    rows: list[Any] = []
    release = threading.Event()
    entered = threading.Event()

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Frames:
        @on_dataframe(max_events=10, max_wait_seconds=0.2, schema=Item)
        def write(self, df: Any, ctx: StreamContext) -> None:
            entered.set()
            rows.extend(df.orderBy("cluster_time").collect())
            release.wait(30)

    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i, "qty": i, "sku": f"s{i}"} for i in range(5)])
        assert entered.wait(30)
        # Heartbeats come and go while the method runs; none may move the processed position.
        ticks = len(heartbeats())
        wait_until(lambda: len(heartbeats()) >= ticks + 2, what="two heartbeats while the method runs")
        assert checkpoint_doc(client, db_name).get("eventsProcessed", 0) == 0
        release.set()
        wait_until(lambda: checkpoint_doc(client, db_name).get("eventsProcessed") == 5, what="the save")
    finally:
        release.set()
        connector.stop()
    assert [r["operation_type"] for r in rows] == ["insert"] * 5
    assert "_rescued_data" not in rows[0].asDict()  # a schema given as is: nothing to rescue
    assert [r["full_document"]["qty"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["full_document"]["sku"] for r in rows] == ["s0", "s1", "s2", "s3", "s4"]
    assert all(r["database"] == db_name and r["collection"] == "orders" for r in rows)
    assert all(r["_id"] for r in rows) and len({r["_id"] for r in rows}) == 5


def test_the_next_batch_becomes_a_dataframe_while_the_one_before_is_in_its_method(
    spark, mongodb_uri, client, db_name, monkeypatch
):
    import flowwarden.spark

    convert = flowwarden.spark.events_to_dataframe
    converting: list[int] = []
    second = threading.Event()

    def counting(*args: Any, **kwargs: Any) -> Any:
        converting.append(len(args[1]))
        if len(converting) == 2:
            second.set()
        return convert(*args, **kwargs)

    monkeypatch.setattr(flowwarden.spark, "events_to_dataframe", counting)
    batches: list[list[int]] = []
    overlapped: list[bool] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Frames:
        @on_dataframe(max_events=5, max_wait_seconds=30)
        def write(self, df: Any, ctx: StreamContext) -> None:
            if not batches:
                overlapped.append(second.wait(20))
            batches.append([row["document_key"] for row in df.orderBy("cluster_time").collect()])

    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(10)])
        wait_until(lambda: checkpoint_doc(client, db_name).get("eventsProcessed") == 10, what="both batches")
    finally:
        connector.stop()
    assert overlapped == [True], "the second batch was converted only after the first one's method returned"
    assert converting == [5, 5]
    assert batches == [[f'{{"_id":{{"$numberInt":"{i}"}}}}' for i in range(j, j + 5)] for j in (0, 5)]


def test_dropmalformed_dead_letters_what_does_not_fit(spark, mongodb_uri, client, db_name):
    seen: list[int] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Strict:
        @on_dataframe(max_events=10, max_wait_seconds=0.2, schema=Item, mode="DROPMALFORMED")
        def write(self, df: Any) -> None:
            seen.extend(r["full_document"]["qty"] for r in df.collect())

    connector = Connector(mongodb_uri, [Strict], spark=spark, metrics_port=0)
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many(
            [
                {"_id": 1, "qty": 1, "sku": "a"},
                {"_id": 2, "qty": "lots", "sku": "b"},
                {"_id": 3, "qty": 3, "sku": "c"},
            ]
        )
        wait_until(lambda: checkpoint_doc(client, db_name).get("eventsProcessed") == 3, what="the batch")
        status = connector.status()["orders"]
        counted = helpers.events_counted(connector)
    finally:
        connector.stop()
    assert sorted(seen) == [1, 3]
    assert status.events_failed == 1
    # Each event once: the one left out of the DataFrame under its own outcome only.
    assert counted == {("insert", "ok"): 2, ("insert", "dead_lettered"): 1}
    (letter,) = client[db_name]["_fw_dlq"].find()
    assert letter["event"]["documentKey"] == {"_id": 2}
    assert "qty" in letter["message"]


def test_a_failing_batch_is_retried_whole_then_dead_lettered_event_by_event(
    spark, mongodb_uri, client, db_name
):
    calls: list[int] = []

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted=OnError.DEAD_LETTER)
    class Broken:
        @on_dataframe(max_events=3, max_wait_seconds=5)
        def write(self, df: Any) -> None:
            calls.append(df.count())
            raise RuntimeError("the table is read-only")

    connector = Connector(mongodb_uri, [Broken], spark=spark)
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i} for i in range(3)])
        wait_until(lambda: checkpoint_doc(client, db_name).get("eventsProcessed") == 3, what="the batch")
    finally:
        connector.stop()
    assert calls == [3, 3]
    letters = sorted(d["event"]["documentKey"]["_id"] for d in client[db_name]["_fw_dlq"].find())
    assert letters == [0, 1, 2]


def test_failfast_stops_the_stream_naming_field_and_token(spark, mongodb_uri, client, db_name):
    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class FailFast:
        @on_dataframe(max_events=2, max_wait_seconds=0.2, schema=Item, mode="FAILFAST")
        def write(self, df: Any) -> None:
            df.count()

    connector = Connector(mongodb_uri, [FailFast], spark=spark)
    connector.start()
    try:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many(
            [{"_id": 1, "qty": "x", "sku": "a"}, {"_id": 2, "qty": 2, "sku": "b"}]
        )
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
        error = connector.stream_errors()["orders"]
    finally:
        connector.stop()
    assert "qty" in str(error.__cause__) and "token" in str(error.__cause__)
    assert checkpoint_doc(client, db_name).get("eventsProcessed", 0) == 0


def test_orders_to_parquet_example(spark, tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import orders_to_parquet
    finally:
        sys.path.pop(0)
    result = orders_to_parquet.main(tmp_path / "orders", orders=300)
    assert result == {"insert": 300, "update": 100, "paid": 100, "rows": 400}


@pytest.mark.slow
def test_a_crash_between_write_and_checkpoint_redelivers_the_batch_and_batch_id_overwrites_it(
    spark, mongodb_uri, client, db_name, tmp_path
):
    # Every write of this test's database comes at or after the server's time now.
    start = client.admin.command("ping")["operationTime"]
    client[db_name].orders.insert_many([{"_id": i} for i in range(250)])
    out, marker = tmp_path / "out", tmp_path / "crashed"
    worker = [sys.executable, str(ROOT / "tests/spark/dataframe_worker.py"), mongodb_uri, db_name]
    args = [*worker, str(out), str(marker), str(start.time)]
    first = subprocess.run(args, timeout=180, capture_output=True)
    assert first.returncode == -signal.SIGKILL and marker.exists()
    saved = checkpoint_doc(client, db_name)["eventsProcessed"]
    assert saved == 100  # batch 2 was written, its checkpoint save never happened
    second = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: checkpoint_doc(client, db_name)["eventsProcessed"] == 250, timeout=120, what="the rest"
        )
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
    df = spark.read.parquet(str(out))
    # batch 2 came again with the same batch_id and replaced its own files: no duplicates
    assert df.count() == 250
    assert df.select("_id").distinct().count() == 250
    assert len(os.listdir(out)) == 3


def test_a_partitioned_dataframe_stream_writes_each_event_once_from_its_bucket(
    spark, mongodb_uri, client, db_name
):
    if client.server_info()["versionArray"][0] < 7:
        pytest.skip("needs MongoDB 7.0+ ($toHashedIndexKey splits the stream)")
    from flowwarden.mongo.buckets import bucket_stage, partition_name

    start = client.admin.command("ping")["operationTime"]
    frames: dict[str, list[tuple[str, Any]]] = {}
    lock = threading.Lock()

    @change_stream("orders", db_name, name="orders", partitions=2, max_await_time_ms=50)
    @checkpoint(save_interval_seconds=0.1, start_position="AT_TIME", start_at=start)
    class Frames:
        @on_dataframe(max_events=40, max_wait_seconds=0.2)
        def write(self, df: Any, ctx: StreamContext) -> None:
            rows = [(row["_id"], row["document_key"]) for row in df.orderBy("_id").collect()]
            with lock:
                frames.setdefault(ctx.stream, []).extend(rows)

    client[db_name].orders.insert_many([{"_id": i, "qty": i} for i in range(150)])
    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        wait_until(
            lambda: sum(s.events_processed for s in connector.status().values()) == 150,
            what="every event written",
        )
    finally:
        connector.stop()
    assert sorted(frames) == [partition_name("orders", 0, 2), partition_name("orders", 1, 2)]
    for index in range(2):
        with client[db_name].orders.watch(
            [bucket_stage(index, 2)], start_at_operation_time=start, max_await_time_ms=50
        ) as stream:
            expected = [stream.next()["_id"]["_data"] for _ in frames[partition_name("orders", index, 2)]]
        assert [token for token, _ in frames[partition_name("orders", index, 2)]] == expected
    keys = [key for rows in frames.values() for _, key in rows]
    assert len(keys) == len(set(keys)) == 150


def test_snapshot_rows_reach_a_dataframe_method_as_rows_without_a_token(spark, mongodb_uri, client, db_name):
    from flowwarden import Snapshot

    client[db_name].orders.insert_many([{"_id": i, "qty": i, "sku": f"s{i}"} for i in range(30)])
    rows: list[Any] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    class Frames:
        @on_dataframe(max_events=12, max_wait_seconds=0.2, schema=Item)
        def write(self, df: Any, ctx: StreamContext) -> None:
            rows.extend(df.collect())

    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        wait_until(lambda: len(rows) == 30, what="the copy")
        client[db_name].orders.insert_one({"_id": 30, "qty": 30, "sku": "s30"})
        wait_until(lambda: len(rows) == 31, what="the change after it")
    finally:
        connector.stop()
    assert [r["operation_type"] for r in rows] == ["snapshot"] * 30 + ["insert"]
    assert [r["full_document"]["qty"] for r in rows] == list(range(31))
    assert all(r["_id"] is None for r in rows[:30]) and rows[30]["_id"]
    assert all(r["database"] == db_name and r["collection"] == "orders" for r in rows)
    assert rows[0]["cluster_time"] == rows[29]["cluster_time"] <= rows[30]["cluster_time"]


def test_an_inferred_schema_is_sampled_once_shown_in_the_status_and_sampled_again_after_a_failure(
    spark, mongodb_uri, client, db_name, caplog, monkeypatch
):
    import pymongo.errors

    import flowwarden.spark.infer as infer

    client[db_name].orders.insert_many([{"_id": i, "qty": i, "sku": f"s{i}"} for i in range(3)])
    samplings: list[int] = []
    sample = infer.infer_document_spec_async

    async def failing_once(collection: Any, **options: Any) -> Any:
        samplings.append(options["sample_size"])
        if len(samplings) == 1:
            raise pymongo.errors.AutoReconnect("the sample's connection was reset")
        return await sample(collection, **options)

    monkeypatch.setattr(infer, "infer_document_spec_async", failing_once)
    caplog.set_level(logging.INFO, logger="flowwarden.runtime.batching")
    frames: list[tuple[str, list[Any]]] = []
    columns: list[list[str]] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        max_await_time_ms=50,
        restart_initial_delay_seconds=0.05,
        restart_max_delay_seconds=0.1,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Frames:
        @on_dataframe(max_events=10, max_wait_seconds=0.2, schema="infer", sample_size=50)
        def write(self, df: Any) -> None:
            full = df.schema["full_document"].dataType
            frames.append((full.simpleString(), [r["full_document"]["qty"] for r in df.collect()]))
            columns.append(df.columns)

    with helpers.running(mongodb_uri, [Frames], spark=spark) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name), what="initial checkpoint")
        client[db_name].orders.insert_many([{"_id": i, "qty": i, "sku": f"s{i}"} for i in range(3, 5)])
        wait_until(lambda: sum(len(qty) for _, qty in frames) == 2, what="the two inserts")
        status = connector.status()["orders"]
    # The failed sampling failed the stream's first batch; it re-opened and sampled again, once.
    assert samplings == [50, 50] and status.restarts >= 1
    assert frames == [("struct<_id:int,qty:int,sku:string>", [3, 4])]
    # An inferred schema keeps what does not fit it: the batch has the rescued-data column.
    assert columns[0][-1] == "_rescued_data"
    assert status.inferred_schema == "`_id` INT, `qty` INT, `sku` STRING"
    lines = [r.getMessage() for r in caplog.records if r.name == "flowwarden.runtime.batching"]
    assert lines == [
        "stream orders: inferring the schema failed (the sample's connection was reset); the first batch "
        "fails with it and the stream samples again when it re-opens",
        "stream orders: full_document schema inferred from a sample of up to 50 documents: "
        "`_id` INT, `qty` INT, `sku` STRING",
    ]
