"""End to end, from the change stream to a Spark sink: what a user of flowwarden feels.

An EmbeddedReplicaSet runs in its own process (``python -m flowwarden.cli embedded-mongo``), so
the server and the reader each get a core, as with a real deployment. ``--events`` orders (the
documents of ``benchmarks/spark.py``) are inserted first; then every variant reads the same change
events from the same cluster time into a ``noop`` sink, in one process with one local SparkSession:

- by hand: ``collection.watch()``, a dict per event (what users write), and every
  ``--batch-events`` events ``spark.createDataFrame(rows, schema)`` plus the write; twice: the
  simplest loop (nine fields, ``json_util.dumps`` for the document and its key) and one with
  every column ``@on_dataframe`` delivers (the dicts of ``benchmarks/spark.py``);
- ``@on_dataframe(max_events=--batch-events)`` in a Connector: each batch's DataFrame written;
- ``@on_change`` no-op in a Connector (``batch_size=1000``): how fast the connector reads at all,
  the rate ``@on_dataframe`` is compared with;
- the Structured Streaming source, ``Trigger.AvailableNow`` with
  ``max_events_per_trigger=--batch-events``;
- the floor of any Python streaming source: a source that reads nothing, handing Spark the same
  rows (the source's own Arrow record batches of these events, memory-mapped from a file) in the
  same micro-batches. Spark's fixed cost per query (it starts a Python process for each query's
  planning) and per micro-batch (offset and commit logs, a job, a task) is all it measures, so
  the streaming source cannot be faster than it; the ratio to ``@on_dataframe`` it allows is
  printed beside the target;
- the floor reading: the same source, whose planner also reads each micro-batch's events from
  the change stream (as raw BSON, the next micro-batch's while Spark runs the current one, as the
  streaming source plans) and drops them: what reading the events at all costs on this machine,
  where the server shares the two cores with Spark. Nothing is converted or carried to the
  executor, so the streaming source cannot be faster than this either.

``--partitions N ...`` adds, for each N, ``@on_dataframe`` in a class with
``@change_stream(partitions=N)`` (N streams, one per hash bucket, each with its own batches) and
the streaming source with ``.option("partitions", N)`` (N input partitions per micro-batch).

Each connector run has a stream name of its own, so no run resumes from another's checkpoint;
its time runs from ``Connector.start()`` to the moment the handler's method returns for the last
event (``@on_dataframe``: the last batch's write done). The stop that follows is not counted, as
the hand-written loops' closing is not. The streaming runs are timed
from ``start()`` to termination with a fresh checkpointLocation each. The variants take turns for
``--rounds`` rounds after ``--warmup-rounds`` untimed ones (default 1), their order rotating each
round; each one's best round counts and the spread is printed. Figures only: nothing here asserts.

    .venv/bin/python benchmarks/spark_end_to_end.py [--events 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
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
FLOOR = "flowwarden-floor"


def floor_source() -> type:
    """The ``flowwarden-floor`` data source (options ``path``, ``rows``, ``batch``,
    ``schema`` as JSON): the rows of
    the Arrow file at ``path`` in micro-batches of ``batch`` rows, with nothing read or converted.
    With ``uri`` (and ``start`` as ``time:inc``), planning also reads each micro-batch's events
    from the change stream of ``shop.orders`` and drops them."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from bson.raw_bson import RawBSONDocument
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

    class RowRange(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            self.start, self.end = start, end

    class FloorReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, path: str, rows: int, batch: int, uri: str = "", start: str = "") -> None:
            self.path, self.rows, self.batch = path, rows, batch
            self.uri, self.start = uri, start
            self._stream: Any = None
            self._ahead: Future[None] | None = None
            self._pool: ThreadPoolExecutor | None = None

        def __getstate__(self) -> dict[str, Any]:
            return {**self.__dict__, "_stream": None, "_ahead": None, "_pool": None}

        def _read(self, count: int) -> None:
            """Read ``count`` more events of the change stream, as raw BSON, and drop them."""
            if self._stream is None:
                seconds, increment = map(int, self.start.split(":"))
                client: pymongo.MongoClient[RawBSONDocument]
                client = pymongo.MongoClient(self.uri, document_class=RawBSONDocument)
                self._stream = client[DB][COLL].watch(
                    start_at_operation_time=Timestamp(seconds, increment), batch_size=self.batch
                )
            read = 0
            while read < count:
                if self._stream.try_next() is not None:
                    read += 1

        def _read_range(self, start: int, end: int) -> None:
            """The events of rows ``start`` to ``end``: read while Spark ran the micro-batch
            before (the first, now); then the next range's are read ahead."""
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1)
                self._read(end - start)
            else:
                assert self._ahead is not None
                self._ahead.result()
            following = min(end + self.batch, self.rows) - end
            self._ahead = self._pool.submit(self._read, following)

        def stop(self) -> None:
            if self._pool is not None:
                self._pool.shutdown()
            if self._stream is not None:
                self._stream.close()

        def initialOffset(self) -> dict[str, int]:
            return {"row": 0}

        def getDefaultReadLimit(self) -> Any:
            return ReadMaxRows(self.batch)

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            end = min(start["row"] + limit.max_rows, self.rows)
            if self.uri and end > start["row"]:
                self._read_range(start["row"], end)
            return {"row": end}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return [RowRange(start["row"], end["row"])]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa

            table = pa.ipc.open_file(pa.memory_map(self.path)).read_all()
            yield from table.slice(partition.start, partition.end - partition.start).to_batches()

        def commit(self, end: dict[str, int]) -> None:
            pass

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FLOOR

        def schema(self) -> Any:
            import json

            from pyspark.sql.types import StructType

            return StructType.fromJson(json.loads(self.options["schema"]))

        def streamReader(self, schema: Any) -> Any:
            options = self.options
            return FloorReader(
                options["path"],
                int(options["rows"]),
                int(options["batch"]),
                options.get("uri", ""),
                options.get("start", ""),
            )

    return FloorSource


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
        self._returned: list[float] = []
        """When the handler's method returned, per call, in the connector run under way."""
        self.stream_phases: list[tuple[int, float, float]] = []
        """Per streaming run: events, seconds within micro-batches, seconds to the first one."""
        self.floor_phases: list[tuple[int, float, float]] = []
        self.reading_phases: list[tuple[int, float, float]] = []
        self.floor: tuple[str, int, str] = ("", 0, "")

    def simplest(self) -> int:
        """The simplest loop a user writes: nine fields per event, the document and its key as
        Extended JSON strings."""
        from bson import json_util

        schema = (
            "token STRING, operation_type STRING, cluster_time TIMESTAMP, wall_time TIMESTAMP, "
            "database STRING, collection STRING, document_key STRING, full_document STRING, "
            "updated_fields STRING"
        )
        client: pymongo.MongoClient[dict[str, Any]]
        delivered = 0
        with pymongo.MongoClient(self.uri, tz_aware=True) as client:
            rows: list[dict[str, Any]] = []
            with client[DB][COLL].watch(start_at_operation_time=self.start, batch_size=1000) as stream:
                for change in stream:
                    document = change.get("fullDocument")
                    update = change.get("updateDescription")
                    rows.append(
                        {
                            "token": change["_id"]["_data"],
                            "operation_type": change["operationType"],
                            "cluster_time": change["clusterTime"].as_datetime(),
                            "wall_time": change.get("wallTime"),
                            "database": change["ns"]["db"],
                            "collection": change["ns"]["coll"],
                            "document_key": json_util.dumps(change["documentKey"]),
                            "full_document": None if document is None else json_util.dumps(document),
                            "updated_fields": (
                                None if update is None else json_util.dumps(update["updatedFields"])
                            ),
                        }
                    )
                    if len(rows) == self.batch or delivered + len(rows) == self.events:
                        materialise(self.spark.createDataFrame(rows, schema))
                        delivered += len(rows)
                        rows = []
                        if delivered == self.events:
                            break
        return delivered

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

    def on_dataframe(self, partitions: int = 1) -> tuple[int, float]:
        """``partitions`` > 1: each bucket's batches are 1/N of the size; buckets are not exactly
        even, so each one's last batch is short and waits max_wait_seconds (0.1 s) to be cut."""
        spark = self.spark
        max_events = self.batch // partitions
        max_wait = 2.0 if partitions == 1 else 0.1

        returned = self._returned

        def handler_class(name: str) -> type:
            @change_stream(COLL, DB, name=name, batch_size=1000, partitions=partitions)
            @checkpoint(save_interval_seconds=5, start_position=StartPosition.AT_TIME, start_at=self.start)
            class ToSpark:
                @on_dataframe(max_events=max_events, max_wait_seconds=max_wait)
                def write(self, df: Any, ctx: StreamContext) -> None:
                    materialise(df)
                    returned.append(time.perf_counter())

            return ToSpark

        return self._connector(handler_class, spark)

    def on_change(self) -> tuple[int, float]:
        returned = self._returned

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
                    returned.append(time.perf_counter())

            return NoOp

        return self._connector(handler_class, None)

    def _connector(self, handler_class: Callable[[str], type], spark: Any) -> tuple[int, float]:
        """Events delivered and seconds from ``start()`` to the method's last return."""
        self._run += 1
        name = f"e2e-{self._run}-{time.monotonic_ns()}"
        connector = Connector(self.uri, [handler_class(name)], spark=spark)
        self._returned.clear()
        began = time.perf_counter()
        connector.start()
        try:
            deadline = time.monotonic() + 600
            while True:
                # A partitioned class runs one stream per bucket: count them all.
                processed = sum(s.events_processed for s in connector.status().values())
                if processed >= self.events:
                    return processed, self._returned[-1] - began
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the connector did not deliver every event: {connector.status()}")
                time.sleep(0.005)
        finally:
            connector.stop()

    def _source(self) -> Any:
        return (
            self.spark.readStream.format("flowwarden")
            .option("uri", self.uri)
            .option("database", DB)
            .option("collection", COLL)
            .option("start_position", "AT_TIME")
            .option("start_at", _iso(self.start))
            .option("max_events_per_trigger", str(self.batch))
        )

    def prepare_floor(self, directory: str) -> None:
        """Write the streaming source's rows of these events to an Arrow file for the floor."""
        import pyarrow as pa

        location = tempfile.mkdtemp(prefix="fw-e2e-floor-", dir=directory)
        frame = self._source().load()
        query = (
            frame.writeStream.format("parquet")
            .option("path", f"{location}/rows")
            .option("checkpointLocation", f"{location}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        table = self.spark.read.parquet(f"{location}/rows").toArrow()
        path = f"{directory}/rows.arrow"
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=self.batch)
        self.floor = (path, table.num_rows, frame.schema.json())
        shutil.rmtree(location)

    def floor_run(self, reading: bool = False) -> int:
        path, rows, ddl = self.floor
        reader = (
            self.spark.readStream.format(FLOOR)
            .option("path", path)
            .option("rows", str(rows))
            .option("batch", str(self.batch))
            .option("schema", ddl)
        )
        if reading:
            reader = reader.option("uri", self.uri).option("start", f"{self.start.time}:{self.start.inc}")
        return self.streaming(reader=reader, phases=self.reading_phases if reading else self.floor_phases)

    def streaming(
        self,
        partitions: int | None = None,
        reader: Any = None,
        phases: list[tuple[int, float, float]] | None = None,
    ) -> int:
        """Rows delivered; each run's (rows, seconds within micro-batches, seconds to the first)
        goes to ``phases`` (the streaming source's, read as one partition, by default)."""
        location = tempfile.mkdtemp(prefix="fw-e2e-stream-")
        if phases is None:
            phases = self.stream_phases if partitions is None and reader is None else []
        try:
            if reader is None:
                reader = self._source()
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
            phases.append((rows, within, (first - began).total_seconds()))
            return rows
        finally:
            shutil.rmtree(location, ignore_errors=True)


def _iso(ts: Timestamp) -> str:
    return ts.as_datetime().isoformat()


def timed(
    runs: dict[str, Callable[[], int | tuple[int, float]]], rounds: int, warmup: int = 1
) -> dict[str, list[tuple[int, float]]]:
    """Each run's (events, seconds) per timed round, after ``warmup`` untimed rounds; the order
    rotates. A run that times itself returns (events, seconds)."""
    results: dict[str, list[tuple[int, float]]] = {label: [] for label in runs}
    labels = list(runs)
    for round_ in range(warmup + rounds):
        for turn in range(len(labels)):
            label = labels[(turn + round_) % len(labels)]
            began = time.perf_counter()
            outcome = runs[label]()
            elapsed = time.perf_counter() - began
            delivered = outcome if isinstance(outcome, int) else outcome[0]
            if not isinstance(outcome, int):
                elapsed = outcome[1]
            if round_ >= warmup:
                results[label].append((delivered, elapsed))
        if round_ >= warmup:
            print(f"  round {round_ - warmup + 1} of {rounds} done", flush=True)
    return results


def report(results: dict[str, list[tuple[int, float]]], events: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    for label, series in results.items():
        per_round = [n / seconds for n, seconds in series]
        counts = {n for n, _ in series}
        best = max(per_round)
        rates[label] = best
        note = "" if counts == {events} else f"  (delivered {sorted(counts)} events)"
        print(f"  {label:<58} {best:>9,.0f} events/s  [{min(per_round):>9,.0f} .. {best:>9,.0f}]{note}")
    return rates


def end_to_end(
    spark: Any,
    documents: list[dict[str, Any]],
    rounds: int,
    batch: int,
    partitions: list[int],
    warmup: int = 1,
) -> None:
    print(
        f"\nend to end: {len(documents):,} inserts read from the change stream into a noop sink, "
        f"EmbeddedReplicaSet in its own process, master {spark.sparkContext.master}, "
        f"best of {rounds} rounds after {warmup} warm-up round(s) [spread]"
    )
    # A last batch short of max_events would wait max_wait_seconds in the connector: use whole
    # batches (the default 50,000 events are five).
    batch = min(batch, len(documents))
    spark.dataSource.register(floor_source())
    with server_process() as uri, tempfile.TemporaryDirectory(prefix="fw-e2e-") as directory:
        start = fill(uri, documents)
        runs = Runs(spark, uri, start, len(documents), batch)
        runs.prepare_floor(directory)
        variants: dict[str, Callable[[], int | tuple[int, float]]] = {
            f"simplest loop: watch(), 9-field dicts, createDataFrame per {batch:,}": runs.simplest,
            f"by hand: watch(), dicts of every column, createDataFrame per {batch:,}": runs.by_hand,
            f"@on_dataframe(max_events={batch:,}), noop write": runs.on_dataframe,
            "@on_change no-op, save_every_n=1000 (the connector's rate)": runs.on_change,
            f"streaming source, availableNow, {batch:,} per trigger": runs.streaming,
            "floor: a Python source reading nothing, same rows and triggers": runs.floor_run,
            "floor reading: the floor, its planner reading the events too": lambda: runs.floor_run(True),
        }
        for n in partitions:
            variants[f"@on_dataframe, partitions={n}, {batch // n:,} per batch"] = lambda n=n: (
                runs.on_dataframe(n)
            )
            variants[f"streaming source, partitions={n}"] = lambda n=n: runs.streaming(n)
        rates = report(timed(variants, rounds, warmup), len(documents))
        for name, phases in (
            ("streaming source", runs.stream_phases),
            ("floor", runs.floor_phases),
            ("floor reading", runs.reading_phases),
        ):
            rows, within, _ = max(phases, key=lambda phase: phase[0] / phase[1])
            print(
                f"    {name} within its micro-batches, best run: {rows / within:,.0f} events/s; "
                f"query start to its first micro-batch: {min(phase[2] for phase in phases):.2f} s"
            )
    labels = list(variants)
    simplest, hand, dataframe, change, source, floor, reading = (rates[label] for label in labels[:7])
    print(f"  @on_dataframe / simplest loop: {dataframe / simplest:.2f}x (target >= 3)")
    print(f"  @on_dataframe / by hand, every column: {dataframe / hand:.2f}x")
    print(f"  @on_dataframe / @on_change: {dataframe / change:.2f} (target >= 0.7)")
    print(
        f"  streaming source / @on_dataframe: {source / dataframe:.2f} (target >= 0.8; "
        f"the floor allows at most {floor / dataframe:.2f})"
    )
    print(f"  streaming source / floor: {source / floor:.2f} (target >= 0.9)")
    print(
        f"  streaming source / floor reading: {source / reading:.2f} "
        f"(reading the events allows at most {reading / floor:.2f} of the floor)"
    )
    for label in labels[7:]:
        print(f"  {label} / @on_dataframe: {rates[label] / dataframe:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first (default 1)")
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
    end_to_end(
        spark,
        inserted_documents(args.events),
        args.rounds,
        args.batch_events,
        args.partitions,
        args.warmup_rounds,
    )
    spark.stop()


if __name__ == "__main__":
    main()
