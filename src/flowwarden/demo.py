"""``flowwarden demo``: orders flow from MongoDB change events into Spark DataFrames and parquet.

Runs entirely on this machine: an EmbeddedReplicaSet stands in for MongoDB (a test double; point
production at a real replica set), Spark runs ``local[*]``. The demo writes orders, runs the
connector until every change is in parquet, stops it, writes more, and starts it again to show the
second run resumes exactly after the first one's checkpoint. It checks the claim by identity:
every change written (its operation type and document ``_id``) must arrive exactly once, so a lost
change is never hidden by one delivered twice.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pymongo
from bson import json_util

from flowwarden.decorators import change_stream, checkpoint, on_batch, on_dataframe
from flowwarden.events import ChangeEvent
from flowwarden.runtime import Connector, StreamContext

DATABASE = "shop"
COLLECTION = "orders"

Change = tuple[str, Any]
"""A change as the demo identifies it: ``(operationType, documentKey._id)``; each is written once."""


def _write_orders(client: pymongo.MongoClient[Any], count: int, seed: int) -> list[Change]:
    """Insert ``count`` orders, update a third and delete a tenth; returns the changes written."""
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
    return (
        [("insert", _id) for _id in ids]
        + [("update", _id) for _id in updated]
        + [("delete", _id) for _id in deleted]
    )


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


def _plain_handler(delivered: list[Change]) -> type:
    @change_stream(COLLECTION, DATABASE, name="orders-counter")
    @checkpoint(save_every_n=500, save_interval_seconds=1)
    class OrdersCounter:
        @on_batch(max_events=1000, max_wait_seconds=0.5)
        def record(self, events: list[ChangeEvent]) -> None:
            delivered.extend((e.operation_type, (e.document_key or {}).get("_id")) for e in events)

    return OrdersCounter


def _parquet_changes(spark: Any, output: Path) -> list[Change]:
    """The changes in the parquet output, one per row."""
    rows = spark.read.parquet(str(output)).select("operation_type", "document_key").collect()
    return [(row["operation_type"], json_util.loads(row["document_key"])["_id"]) for row in rows]


def _mismatch(written: list[Change], delivered: list[Change]) -> str | None:
    """What is wrong with ``delivered``, if anything: each change written must be there once."""
    missing = Counter(written) - Counter(delivered)
    extra = Counter(delivered) - Counter(written)
    if not missing and not extra:
        return None
    return (
        f"{len(written)} changes written, {len(delivered)} delivered: {missing.total()} never delivered "
        f"(first: {sorted(missing, key=str)[:3]}), {extra.total()} delivered more than once or never "
        f"written (first: {sorted(extra, key=str)[:3]})"
    )


def run_demo(*, events: int = 2000, output: str = "out/demo", use_spark: bool = True) -> int:
    from flowwarden.testing import EmbeddedReplicaSet

    out = Path(output)
    shutil.rmtree(out, ignore_errors=True)
    delivered: list[Change] = []
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
        handler = _plain_handler(delivered)
    stream = ""
    rs = EmbeddedReplicaSet()
    client: pymongo.MongoClient[Any]
    with rs, pymongo.MongoClient(rs.uri) as client:
        print(f"EmbeddedReplicaSet (test double) at {rs.uri}", file=sys.stderr)
        written: list[Change] = []
        for run in (1, 2):
            connector = Connector(rs.uri, [handler], spark=spark)
            stream = connector.specs[0].name
            connector.start()
            started = time.perf_counter()
            changes = _write_orders(client, events, seed=run)
            written += changes
            _wait_for(connector, stream, len(written))
            elapsed = time.perf_counter() - started
            connector.stop()
            status = connector.status()[stream]
            print(
                f"run {run}: {len(changes)} changes written and delivered in {elapsed:.2f}s; "
                f"checkpoint: {status.events_processed} events processed in total"
            )
        cp = client[DATABASE]["_fw_checkpoints"].find_one({"_id": stream})
        assert cp is not None
        print(f"checkpoint document: lastProcessedTimestamp={cp.get('lastProcessedTimestamp')}")
    if spark is not None:
        delivered = _parquet_changes(spark, out)
        summary = ", ".join(f"{op}={n}" for op, n in sorted(Counter(op for op, _ in delivered).items()))
        print(f"parquet at {out}: {len(delivered)} change rows ({summary})")
    problem = _mismatch(written, delivered)
    if problem is not None:
        print(f"MISMATCH: {problem}", file=sys.stderr)
        return 1
    print(f"ok: every one of {len(written)} changes delivered exactly once across two runs (compared by id)")
    return 0
