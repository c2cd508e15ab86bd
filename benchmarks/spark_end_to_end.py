"""End to end, from the change stream to a Spark sink: what a user of flowwarden feels.

An EmbeddedReplicaSet runs in its own process (``python -m flowwarden.cli embedded-mongo``), so
the server and the reader each get a core, as with a real deployment. ``--events`` orders (the
documents of ``benchmarks/spark.py``) are inserted first; then every variant reads the same change
events from the same cluster time into a ``noop`` sink, in one process with one local SparkSession:

- by hand: ``collection.watch()``, a dict per event (what users write), and every
  ``--batch-events`` events ``spark.createDataFrame(rows, schema)`` plus the write;
- ``@on_dataframe(max_events=--batch-events)`` in a Connector: each batch's DataFrame written;
- ``@on_change`` no-op in a Connector (``batch_size=1000``): how fast the connector reads at all,
  the rate ``@on_dataframe`` is compared with;
- the Structured Streaming source, ``Trigger.AvailableNow`` with
  ``max_events_per_trigger=--batch-events`` (``--partitions`` adds runs with that many input
  partitions).

Each connector run has a stream name of its own, so no run resumes from another's checkpoint;
its time runs from before the Connector starts to the moment its status counts the last event as
processed (checkpointed handling, as a user's monitoring sees it). The streaming runs are timed
from ``start()`` to termination with a fresh checkpointLocation each. The variants take turns for
``--rounds`` rounds after one untimed warm-up round, their order rotating each round; each one's
best round counts and the spread is printed. Figures only: nothing here asserts.

    .venv/bin/python benchmarks/spark_end_to_end.py [--events 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pymongo
from bson import Timestamp

from flowwarden import (
    ChangeEvent,
    Connector,
    StartPosition,
    StreamContext,
    change_stream,
    checkpoint,
    on_change,
    on_dataframe,
)
from flowwarden.spark import change_event_struct_type

DB, COLL = "shop", "orders"


def server_process() -> contextlib.AbstractContextManager[str]:
    """An EmbeddedReplicaSet in a process of its own; yields its URI."""
    from embedded_rs import server  # benchmarks/embedded_rs.py

    return server(in_process=False)


def fill(uri: str, documents: list[dict[str, Any]]) -> Timestamp:
    """Insert ``documents``; return the cluster time just before the first insert."""
    client: pymongo.MongoClient[dict[str, Any]]
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=30_000) as client:
        start: Timestamp = client.admin.command("ping")["operationTime"]
        for offset in range(0, len(documents), 5000):
            client[DB][COLL].insert_many(documents[offset : offset + 5000])
    return start


def inserted_documents(count: int) -> list[dict[str, Any]]:
    """``count`` orders, the documents of benchmarks/spark.py's insert events."""
    from spark import make_events  # benchmarks/spark.py

    events = make_events(count * 2)
    return [event["fullDocument"] for event in events if event["operationType"] == "insert"][:count]


def materialise(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


class Runs:
    """The variants, each a callable returning the number of events it delivered."""

    def __init__(self, spark: Any, uri: str, start: Timestamp, events: int, batch: int) -> None:
        self.spark = spark
        self.uri = uri
        self.start = start
        self.events = events
        self.batch = batch
        self._run = 0
        self.stream_phases: list[tuple[int, float, float]] = []
        """Per streaming run: events, seconds within micro-batches, seconds to the first one."""

    def by_hand(self) -> int:
        from spark import by_hand  # benchmarks/spark.py: the dict per event users write

        struct = change_event_struct_type(None)
        client: pymongo.MongoClient[dict[str, Any]]
        delivered = 0
        with pymongo.MongoClient(self.uri) as client:
            rows: list[dict[str, Any]] = []
            with client[DB][COLL].watch(start_at_operation_time=self.start, batch_size=1000) as stream:
                for change in stream:
                    rows.extend(by_hand([change], typed=False))
                    if len(rows) == self.batch or delivered + len(rows) == self.events:
                        materialise(self.spark.createDataFrame(rows, struct))
                        delivered += len(rows)
                        rows = []
                        if delivered == self.events:
                            break
        return delivered

    def on_dataframe(self) -> int:
        spark = self.spark

        def handler_class(name: str) -> type:
            @change_stream(COLL, DB, name=name, batch_size=1000)
            @checkpoint(save_interval_seconds=5, start_position=StartPosition.AT_TIME, start_at=self.start)
            class ToSpark:
                @on_dataframe(max_events=self.batch, max_wait_seconds=2.0)
                def write(self, df: Any, ctx: StreamContext) -> None:
                    materialise(df)

            return ToSpark

        return self._connector(handler_class, spark)

    def on_change(self) -> int:
        def handler_class(name: str) -> type:
            @change_stream(COLL, DB, name=name, batch_size=1000)
            @checkpoint(
                save_every_n=1000,
                save_interval_seconds=5,
                start_position=StartPosition.AT_TIME,
                start_at=self.start,
            )
            class NoOp:
                @on_change
                def handle(self, event: ChangeEvent) -> None:
                    pass

            return NoOp

        return self._connector(handler_class, None)

    def _connector(self, handler_class: Callable[[str], type], spark: Any) -> int:
        self._run += 1
        name = f"e2e-{self._run}-{time.monotonic_ns()}"
        connector = Connector(self.uri, [handler_class(name)], spark=spark)

        async def main() -> int:
            runner = asyncio.create_task(connector.run_async())
            try:
                while not runner.done():
                    status = connector.status().get(name)
                    if status is not None and status.events_processed >= self.events:
                        return status.events_processed
                    await asyncio.sleep(0.005)
                runner.result()
                raise RuntimeError(f"the connector stopped early: {connector.status()[name]}")
            finally:
                connector.stop()
                await runner

        return asyncio.run(main())

    def streaming(self, partitions: int | None = None) -> int:
        location = tempfile.mkdtemp(prefix="fw-e2e-stream-")
        try:
            reader = (
                self.spark.readStream.format("flowwarden")
                .option("uri", self.uri)
                .option("database", DB)
                .option("collection", COLL)
                .option("start_position", "AT_TIME")
                .option("start_at", _iso(self.start))
                .option("max_events_per_trigger", str(self.batch))
            )
            if partitions is not None:
                reader = reader.option("partitions", str(partitions))
            began = dt.datetime.now(dt.timezone.utc)
            query = (
                reader.load()
                .writeStream.format("noop")
                .option("checkpointLocation", location)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            rows = int(sum(p["numInputRows"] for p in progress))
            within = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
            first = began
            if progress:
                first = dt.datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00"))
            self.stream_phases.append((rows, within, (first - began).total_seconds()))
            return rows
        finally:
            shutil.rmtree(location, ignore_errors=True)


def _iso(ts: Timestamp) -> str:
    return ts.as_datetime().isoformat()


def timed(runs: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[tuple[int, float]]]:
    """Each run's (events, seconds) per timed round, after one warm-up round; the order rotates."""
    results: dict[str, list[tuple[int, float]]] = {label: [] for label in runs}
    labels = list(runs)
    for round_ in range(rounds + 1):
        for turn in range(len(labels)):
            label = labels[(turn + round_) % len(labels)]
            began = time.perf_counter()
            delivered = runs[label]()
            elapsed = time.perf_counter() - began
            if round_:
                results[label].append((delivered, elapsed))
        if round_:
            print(f"  round {round_} of {rounds} done", flush=True)
    return results


def report(results: dict[str, list[tuple[int, float]]], events: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    for label, series in results.items():
        per_round = [n / seconds for n, seconds in series]
        counts = {n for n, _ in series}
        best = max(per_round)
        rates[label] = best
        note = "" if counts == {events} else f"  (delivered {sorted(counts)} events)"
        print(
            f"  {label:<58} {best:>9,.0f} events/s  [{min(per_round):>9,.0f} .. {best:>9,.0f}]{note}"
        )
    return rates


def end_to_end(
    spark: Any, documents: list[dict[str, Any]], rounds: int, batch: int, partitions: list[int]
) -> None:
    print(
        f"\nend to end: {len(documents):,} inserts read from the change stream into a noop sink, "
        f"EmbeddedReplicaSet in its own process, master {spark.sparkContext.master}, "
        f"best of {rounds} rounds after a warm-up round [spread]"
    )
    # A last batch short of max_events would wait max_wait_seconds in the connector: use whole
    # batches (the default 50,000 events are five).
    batch = min(batch, len(documents))
    with server_process() as uri:
        start = fill(uri, documents)
        runs = Runs(spark, uri, start, len(documents), batch)
        variants: dict[str, Callable[[], int]] = {
            f"by hand: watch(), dicts, createDataFrame per {batch:,}": runs.by_hand,
            f"@on_dataframe(max_events={batch:,}), noop write": runs.on_dataframe,
            "@on_change no-op, save_every_n=1000 (the connector's rate)": runs.on_change,
            f"streaming source, availableNow, {batch:,} per trigger": runs.streaming,
        }
        for n in partitions:
            variants[f"streaming source, partitions={n}"] = lambda n=n: runs.streaming(n)
        rates = report(timed(variants, rounds), len(documents))
        rows, within, _ = max(runs.stream_phases, key=lambda phase: phase[0] / phase[1])
        print(
            f"    streaming source within its micro-batches (plan, read, convert, sink), best run: "
            f"{rows / within:,.0f} events/s; query start to its first micro-batch: "
            f"{min(phase[2] for phase in runs.stream_phases):.2f} s"
        )
    labels = list(variants)
    hand, dataframe, change, source = (rates[label] for label in labels[:4])
    print(f"  @on_dataframe / by hand: {dataframe / hand:.2f}x (target >= 3)")
    print(f"  @on_dataframe / @on_change: {dataframe / change:.2f} (target >= 0.7)")
    print(f"  streaming source / @on_dataframe: {source / dataframe:.2f} (target >= 0.8)")
    for label in labels[4:]:
        print(f"  {label} / @on_dataframe: {rates[label] / dataframe:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-events", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, nargs="*", default=[])
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from flowwarden.spark import get_or_create_session, register

    spark = get_or_create_session(
        args.master,
        app_name="flowwarden-benchmark-e2e",
        conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    end_to_end(spark, inserted_documents(args.events), args.rounds, args.batch_events, args.partitions)
    spark.stop()


if __name__ == "__main__":
    main()
