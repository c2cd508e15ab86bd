"""``flowwarden demo``: orders flow from MongoDB change events into Spark DataFrames and parquet.

Runs entirely on this machine: an EmbeddedReplicaSet stands in for MongoDB (a test double; point
production at a real replica set), Spark runs ``local[*]``. The demo writes orders, runs the
connector until every change is in parquet, stops it, writes more, and starts it again to show the
second run resumes exactly after the first one's checkpoint.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pymongo

from flowwarden.decorators import change_stream, checkpoint, on_batch, on_dataframe
from flowwarden.events import ChangeEvent
from flowwarden.runtime import Connector, StreamContext

DATABASE = "shop"
COLLECTION = "orders"


def _write_orders(client: pymongo.MongoClient[Any], count: int, seed: int) -> int:
    """Insert ``count`` orders, update a third and delete a tenth; returns the number of changes."""
    rng = random.Random(seed)
    coll = client[DATABASE][COLLECTION]
    docs = [
        {
            "customer": f"c{rng.randrange(100):03d}",
            "amount": round(rng.uniform(5, 500), 2),
            "status": "new",
            "createdAt": datetime.now(timezone.utc),
        }
        for _ in range(count)
    ]
    ids = coll.insert_many(docs).inserted_ids
    updated = ids[: count // 3]
    for _id in updated:
        coll.update_one({"_id": _id}, {"$set": {"status": "paid"}})
    deleted = ids[-(count // 10) :] if count >= 10 else []
    for _id in deleted:
        coll.delete_one({"_id": _id})
    return len(ids) + len(updated) + len(deleted)


def _wait_for(connector: Connector, stream: str, processed: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = connector.status()[stream]
        if status.events_processed >= processed:
            return
        if status.last_error and status.state.value == "FAILED":
            raise RuntimeError(f"demo stream failed: {status.last_error}")
        time.sleep(0.1)
    raise TimeoutError(
        f"the connector processed {connector.status()[stream].events_processed} of {processed}"
    )


def _spark_handler(output: Path) -> type:
    @change_stream(COLLECTION, DATABASE, name="orders-to-parquet", full_document="updateLookup")
    @checkpoint(save_every_n=500, save_interval_seconds=1)
    class OrdersToParquet:
        @on_dataframe(max_events=5000, max_wait_seconds=0.5)
        def write(self, df: Any, ctx: StreamContext) -> None:
            from pyspark.sql import functions as F

            (
                df.withColumn("date", F.to_date("cluster_time"))
                .write.mode("append")
                .partitionBy("date")
                .parquet(str(output))
            )

    return OrdersToParquet


def _plain_handler(seen: list[int]) -> type:
    @change_stream(COLLECTION, DATABASE, name="orders-counter")
    @checkpoint(save_every_n=500, save_interval_seconds=1)
    class OrdersCounter:
        @on_batch(max_events=1000, max_wait_seconds=0.5)
        def count(self, events: list[ChangeEvent]) -> None:
            seen.append(len(events))

    return OrdersCounter


def run_demo(*, events: int = 2000, output: str = "out/demo", use_spark: bool = True) -> int:
    from flowwarden.testing import EmbeddedReplicaSet

    out = Path(output)
    shutil.rmtree(out, ignore_errors=True)
    seen: list[int] = []
    spark = None
    if use_spark:
        from flowwarden.spark import get_or_create_session

        print("starting local Spark ...", file=sys.stderr)
        spark = get_or_create_session(
            app_name="flowwarden-demo",
            conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        handler = _spark_handler(out)
    else:
        handler = _plain_handler(seen)
    stream = ""
    rs = EmbeddedReplicaSet()
    client: pymongo.MongoClient[Any]
    with rs, pymongo.MongoClient(rs.uri) as client:
        print(f"EmbeddedReplicaSet (test double) at {rs.uri}", file=sys.stderr)
        total = 0
        for run in (1, 2):
            connector = Connector(rs.uri, [handler], spark=spark)
            stream = connector.specs[0].name
            connector.start()
            started = time.perf_counter()
            changes = _write_orders(client, events, seed=run)
            total += changes
            _wait_for(connector, stream, total)
            elapsed = time.perf_counter() - started
            connector.stop()
            status = connector.status()[stream]
            print(
                f"run {run}: {changes} changes written and delivered in {elapsed:.2f}s; "
                f"checkpoint: {status.events_processed} events processed in total"
            )
        cp = client[DATABASE]["_fw_checkpoints"].find_one({"_id": stream})
        assert cp is not None
        print(f"checkpoint document: lastProcessedTimestamp={cp.get('lastProcessedTimestamp')}")
    if spark is not None:
        df = spark.read.parquet(str(out))
        rows = df.groupBy("operation_type").count().orderBy("operation_type").collect()
        summary = ", ".join(f"{r['operation_type']}={r['count']}" for r in rows)
        written = df.count()
        print(f"parquet at {out}: {written} change rows ({summary})")
        if written != total:
            print(f"MISMATCH: {total} changes written to MongoDB, {written} rows in parquet", file=sys.stderr)
            return 1
    elif sum(seen) != total:
        print(f"MISMATCH: {total} changes written, {sum(seen)} delivered", file=sys.stderr)
        return 1
    print(f"ok: every one of {total} changes delivered exactly once across two runs")
    return 0
