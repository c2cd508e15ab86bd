"""A Structured Streaming query on a MongoDB change stream: revenue per order status.

    readStream.format("flowwarden")  ->  groupBy(status)  ->  parquet, with a checkpointLocation

The query runs twice with Trigger.AvailableNow (each run reads what is there and stops), with
new orders written in between. The second run continues from the checkpointLocation: its
totals include both rounds, and no event is counted twice.

By default it starts an EmbeddedReplicaSet (flowwarden's test double: a MongoDB-compatible
server for tests and demos, not for production) and local Spark. Point it at a real replica set
with ``--uri mongodb://host:27017/?replicaSet=rs0``.

    .venv/bin/python examples/streaming_query.py
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import random
import shutil
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pymongo
from bson import Decimal128
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flowwarden.spark import get_or_create_session, register
from flowwarden.testing import EmbeddedReplicaSet

STATUSES = ("new", "paid", "shipped")


Totals = dict[str, tuple[int, Decimal]]


def write_orders(collection: Any, count: int, seed: int, totals: Totals) -> None:
    """Insert ``count`` orders and add them to ``totals`` (orders and revenue per status)."""
    rng = random.Random(seed)
    documents = []
    for _ in range(count):
        status = rng.choice(STATUSES)
        amount = Decimal(rng.randrange(100, 100_000)) / 100
        seen, revenue = totals.get(status, (0, Decimal("0.00")))
        totals[status] = (seen + 1, revenue + amount)
        documents.append(
            {"status": status, "amount": Decimal128(amount), "customer": f"c{rng.randrange(50)}"}
        )
    collection.insert_many(documents)


def revenue_query(spark: SparkSession, uri: str, database: str, start_at: str) -> DataFrame:
    events = (
        spark.readStream.format("flowwarden")
        .option("uri", uri)
        .option("database", database)
        .option("collection", "orders")
        .option("start_position", "AT_TIME")
        .option("start_at", start_at)
        .option("max_events_per_trigger", "500")
        .option("schema", "status STRING, amount DECIMAL(12,2), customer STRING")
        .load()
    )
    return (
        events.where("operation_type = 'insert'")
        .groupBy(F.col("full_document.status").alias("status"))
        .agg(F.count("*").alias("orders"), F.sum("full_document.amount").alias("revenue"))
    )


def run_once(totals: DataFrame, output: Path, checkpoint: Path) -> None:
    """One availableNow run: every micro-batch replaces the parquet file with the full totals."""

    def write(batch: DataFrame, batch_id: int) -> None:
        # The totals of a complete-mode batch are the whole result, so overwriting is idempotent:
        # a micro-batch replayed after a crash writes the same file again.
        batch.coalesce(1).write.mode("overwrite").parquet(str(output))

    query = (
        totals.writeStream.outputMode("complete")
        .foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def read_totals(output: Path) -> Totals:
    table = pq.read_table(str(output))
    return {row["status"]: (row["orders"], row["revenue"]) for row in table.to_pylist()}


@contextlib.contextmanager
def mongodb(uri: str | None) -> Iterator[str]:
    if uri:
        yield uri
        return
    with EmbeddedReplicaSet() as rs:
        yield rs.uri


def main(argv: list[str] | None = None) -> Totals:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uri", help="a MongoDB replica set (default: start an EmbeddedReplicaSet)")
    parser.add_argument("--database", default="shop", help="database of the orders collection")
    parser.add_argument("--orders", type=int, default=300, help="orders written per round")
    parser.add_argument("--output", type=Path, help="directory for the parquet totals and the checkpoint")
    args = parser.parse_args(argv)

    workdir = args.output or Path(tempfile.mkdtemp(prefix="flowwarden-streaming-"))
    for leftover in ("totals", "checkpoint"):  # a new query, not the continuation of an old one
        shutil.rmtree(workdir / leftover, ignore_errors=True)
    spark = get_or_create_session(
        "local[2]",
        app_name="flowwarden-streaming-example",
        # a small local job: a handful of shuffle partitions, no UI, no progress bars
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    expected: Totals = {}
    with mongodb(args.uri) as uri, pymongo.MongoClient[dict[str, Any]](uri) as client:
        collection = client[args.database]["orders"]
        collection.drop()
        start_at = dt.datetime.now(dt.timezone.utc).isoformat()
        for round_number in (1, 2):
            write_orders(collection, args.orders, round_number, expected)
            query = revenue_query(spark, uri, args.database, start_at)
            run_once(query, workdir / "totals", workdir / "checkpoint")
            totals = read_totals(workdir / "totals")
            print(f"after round {round_number}:")
            for status in sorted(totals):
                orders, revenue = totals[status]
                print(f"  {status:<8} {orders:>6} orders  {revenue:>12} revenue")
    if totals != expected:
        raise SystemExit(f"the query's totals {totals} differ from the orders written {expected}")
    print("totals match the orders written: every event counted once")
    if args.output is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return totals


if __name__ == "__main__":
    main()
