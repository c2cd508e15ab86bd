"""Orders from MongoDB change events into parquet, partitioned by date, through Spark DataFrames.

    .venv/bin/python examples/orders_to_parquet.py [OUTPUT_DIR]

Runs on an EmbeddedReplicaSet (a test double standing in for your replica set) with local Spark.
The handler receives each batch as a DataFrame whose ``full_document`` is typed by the ``Order``
model, and writes it under ``batch=<ctx.batch_id>`` with mode "overwrite": should the process die
after the write but before the checkpoint save, the batch comes again with the same id and replaces
its own files instead of duplicating them.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymongo
from bson import Decimal128
from pydantic import BaseModel

from flowwarden import Connector, StreamContext, change_stream, checkpoint, on_dataframe
from flowwarden.spark import get_or_create_session
from flowwarden.testing import EmbeddedReplicaSet


class Order(BaseModel):
    customer: str
    amount: Decimal
    status: str
    created_at: datetime


def orders_to_parquet(output: Path) -> type:
    @change_stream(collection="orders", database="shop", full_document="updateLookup")
    @checkpoint(save_every_n=1000, save_interval_seconds=2)
    class OrdersToParquet:
        @on_dataframe(max_events=500, max_wait_seconds=0.5, schema=Order)
        def write(self, df: Any, ctx: StreamContext) -> None:
            from pyspark.sql import functions as F

            (
                df.withColumn("date", F.to_date("cluster_time"))
                .write.mode("overwrite")
                .partitionBy("date")
                .parquet(str(output / f"batch={ctx.batch_id}"))
            )

    return OrdersToParquet


def main(output: Path, orders: int = 1200) -> dict[str, int]:
    """Write ``orders`` orders (and pay a third of them), stream them to parquet, read it back."""
    spark = get_or_create_session(app_name="orders-to-parquet", conf={"spark.ui.enabled": "false"})
    client: pymongo.MongoClient[dict[str, Any]]
    with EmbeddedReplicaSet() as rs, pymongo.MongoClient(rs.uri) as client:
        connector = Connector(rs.uri, [orders_to_parquet(output)], spark=spark)
        connector.start()
        shop: pymongo.collection.Collection[dict[str, Any]] = client.shop.orders
        ids = shop.insert_many(
            [
                {
                    "customer": f"c{i % 40:02d}",
                    "amount": Decimal128(f"{(i % 50) + 0.99}"),
                    "status": "new",
                    "created_at": datetime.now(timezone.utc),
                }
                for i in range(orders)
            ]
        ).inserted_ids
        for _id in ids[: orders // 3]:
            shop.update_one({"_id": _id}, {"$set": {"status": "paid"}})
        expected = orders + orders // 3
        deadline = time.monotonic() + 120
        while connector.status()["OrdersToParquet"].events_processed < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(connector.status()["OrdersToParquet"])
            time.sleep(0.1)
        connector.stop()
    df = spark.read.parquet(str(output))
    counts = {r["operation_type"]: r["count"] for r in df.groupBy("operation_type").count().collect()}
    paid = df.filter("full_document.status = 'paid'").count()
    return {**counts, "paid": paid, "rows": df.count()}


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "out/orders")
    print(main(target))
