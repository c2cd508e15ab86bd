"""Schema inference, the last change per key, and the Delta sink, each beside a hand-written
equivalent.

    .venv/bin/python benchmarks/lakehouse.py [--samples 1000] [--rows 1000000] [--events 20000]
        [--batch-events 2000] [--repeat 3] [--spark]

- inference: ``infer_document_spec`` on ``--samples`` documents drawn by ``$sample`` from an
  EmbeddedReplicaSet collection, beside a hand-written pass that only collects each field's
  Python type names (no merging rules, no hints) over the same ``$sample``;
- ``latest_per_key_arrow`` on an Arrow table of ``--rows`` change rows (one key per ten rows),
  beside pandas ``drop_duplicates(keep="last")`` after a sort by token; with ``--spark``, also
  ``latest_per_key`` on a Spark DataFrame of the same rows beside a hand-written
  ``groupBy(...).agg(max(struct(_id, ...)))``;
- the Delta sink end to end: ``--events`` changes read from the change stream as raw BSON,
  converted with an inferred schema and MERGEd batch by batch (``--batch-events``) into a Delta
  table with exactly-once commits, beside the same batches written with delta-rs's plain append
  (``write_deltalake``, no MERGE, no transaction: what a hand-written sink without keys does).

Each figure is the best of ``--repeat`` runs. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pymongo
from bson.raw_bson import RawBSONDocument

from flowwarden.spark import events_to_arrow, latest_per_key_arrow
from flowwarden.spark.infer import infer_document_spec, sample_pipeline
from flowwarden.testing import EmbeddedReplicaSet


def best(repeat: int, run: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def document(i: int) -> dict[str, Any]:
    return {
        "_id": i,
        "sku": f"sku-{i % 97}",
        "qty": i % 13,
        "price": i / 7,
        "tags": ["a", "b"][: i % 3],
        "address": {"city": "Lyon", "zip": 69000 + i % 10},
        "flag": i % 2 == 0,
    }


def bench_inference(client: pymongo.MongoClient[Any], samples: int, repeat: int) -> None:
    coll = client.bench.inferred
    coll.insert_many([document(i) for i in range(samples * 2)])

    def by_hand() -> None:
        seen: dict[str, set[str]] = {}
        for doc in coll.aggregate(sample_pipeline(samples)):
            for key, value in doc.items():
                seen.setdefault(key, set()).add(type(value).__name__)

    flowwarden = best(repeat, lambda: infer_document_spec(client, "bench", "inferred", sample_size=samples))
    hand = best(repeat, by_hand)
    print(f"inference, {samples} samples:        infer_schema {flowwarden * 1e3:8.1f} ms   "
          f"hand-written type scan {hand * 1e3:8.1f} ms")


def change_rows(rows: int) -> pa.Table:
    keys = [f'{{"_id":{{"$numberInt":"{i % (rows // 10 or 1)}"}}}}' for i in range(rows)]
    return pa.table(
        {
            "_id": [f"8266F0A1B2{i:012X}" for i in range(rows)],
            "operation_type": ["update"] * rows,
            "document_key": keys,
            "full_document": [f'{{"n":{i}}}' for i in range(rows)],
        }
    )


def bench_latest(rows: int, repeat: int, spark: bool) -> None:
    table = change_rows(rows)
    frame = table.to_pandas()
    flowwarden = best(repeat, lambda: latest_per_key_arrow(table))
    hand = best(repeat, lambda: frame.sort_values("_id").drop_duplicates("document_key", keep="last"))
    print(f"latest_per_key_arrow, {rows} rows:  {flowwarden * 1e3:8.1f} ms   "
          f"pandas sort + drop_duplicates {hand * 1e3:8.1f} ms")
    if not spark:
        return
    from pyspark.sql import functions as F

    from flowwarden.spark import get_or_create_session, latest_per_key

    session = get_or_create_session("local[2]", conf={"spark.ui.enabled": "false"})
    df = session.createDataFrame(table).cache()
    df.count()
    flowwarden = best(repeat, lambda: latest_per_key(df).count())
    by_hand = (
        df.groupBy("document_key")
        .agg(F.max(F.struct("_id", "operation_type", "full_document")).alias("last"))
        .select("document_key", "last.*")
    )
    hand = best(repeat, by_hand.count)
    print(f"latest_per_key (Spark), {rows} rows: {flowwarden * 1e3:8.1f} ms   "
          f"groupBy + max(struct) {hand * 1e3:8.1f} ms")


def bench_delta(
    client: pymongo.MongoClient[Any], uri: str, events: int, batch_events: int, repeat: int
) -> None:
    from deltalake import write_deltalake

    from flowwarden.sinks import DeltaSink

    coll = client.bench.orders
    coll.insert_many([document(i) for i in range(100)])
    start = client.admin.command("ping")["operationTime"]
    for first in range(0, events, 1000):
        count = min(1000, events - first)
        coll.insert_many([document(100 + first + i) for i in range(count)])
    raw: pymongo.MongoClient[RawBSONDocument] = pymongo.MongoClient(uri, document_class=RawBSONDocument)

    def read() -> list[RawBSONDocument]:
        out = []
        with raw.bench.orders.watch(start_at_operation_time=start, max_await_time_ms=200) as stream:
            while len(out) < events:
                change = stream.try_next()
                if change is not None:
                    out.append(change)
        return out

    schema = infer_document_spec(client, "bench", "orders")

    def sink_run() -> None:
        sink = DeltaSink(tempfile.mkdtemp(prefix="fw-delta-") + "/t")
        changes = read()
        for first in range(0, len(changes), batch_events):
            batch = changes[first : first + batch_events]
            table = events_to_arrow(batch, schema=schema, rescued_data=True).table
            sink.write(table, SimpleNamespace(batch_id=batch[0]["_id"]["_data"], stream="orders"))

    def append_run() -> None:
        target = tempfile.mkdtemp(prefix="fw-append-") + "/t"
        changes = read()
        for first in range(0, len(changes), batch_events):
            batch = changes[first : first + batch_events]
            table = events_to_arrow(batch, schema=schema).table
            document_table = pa.Table.from_batches(
                [pa.RecordBatch.from_struct_array(table["full_document"].combine_chunks())]
            )
            write_deltalake(target, document_table, mode="append")

    flowwarden = best(repeat, sink_run)
    hand = best(repeat, append_run)
    print(f"Delta end to end, {events} events in batches of {batch_events}: DeltaSink MERGE "
          f"{events / flowwarden:9.0f} events/s   plain append {events / hand:9.0f} events/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch-events", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also time latest_per_key on Spark")
    args = parser.parse_args()
    with EmbeddedReplicaSet() as rs, pymongo.MongoClient(rs.uri) as client:
        bench_inference(client, args.samples, args.repeat)
        bench_latest(args.rows, args.repeat, args.spark)
        bench_delta(client, rs.uri, args.events, args.batch_events, args.repeat)


if __name__ == "__main__":
    main()
