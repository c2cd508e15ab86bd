"""``flowwarden demo``: orders flow from MongoDB change events into Spark DataFrames and parquet.

Runs entirely on this machine: an EmbeddedReplicaSet stands in for MongoDB (a test double; point
production at a real replica set), Spark runs ``local[*]``. The demo writes orders, runs the
connector until every change is in parquet, stops it, writes more, and starts it again to show the
second run resumes exactly after the first one's checkpoint. It checks the claim by identity:
every change written (its operation type and document ``_id``) must arrive exactly once, so a lost
change is never hidden by one delivered twice.

While a run goes, a live panel on stderr shows what the connector reports (changes written and
delivered, events/s, batches, seconds behind or caught up, the stored checkpoint) and where its
Prometheus endpoint is, in lines that fit 80 columns; until Spark's first batch is through (its
Python workers start: 10-30 s), it says that Spark is starting. A table on stdout sums the runs
up. Spark's own log goes to a file beside the output.
"""

from __future__ import annotations

import logging
import random
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pymongo
from bson import json_util
from rich.console import Console, Group
from rich.live import Live
from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from flowwarden.decorators import change_stream, checkpoint, on_batch, on_dataframe
from flowwarden.events import ChangeEvent
from flowwarden.runtime import Connector, StreamContext, StreamState

DATABASE = "shop"
COLLECTION = "orders"

Change = tuple[str, Any]
"""A change as the demo identifies it: ``(operationType, documentKey._id)``; each is written once."""


class _Writer(threading.Thread):
    """Writes ``count`` orders, updates a third and deletes a tenth, in a thread of its own so the
    connector is seen catching up while the writes go on. ``changes`` grows as they are written."""

    def __init__(self, client: pymongo.MongoClient[Any], count: int, seed: int) -> None:
        super().__init__(name="demo-writer", daemon=True)
        self._orders = client[DATABASE][COLLECTION]
        self._count = count
        self._rng = random.Random(seed)
        self.changes: list[Change] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._write()
        except BaseException as error:  # reported by the demo, which stops waiting for changes
            self.error = error

    def _write(self) -> None:
        rng, count = self._rng, self._count
        docs = [
            {
                "customer": f"c{rng.randrange(100):03d}",
                "amount": round(rng.uniform(5, 500), 2),
                "status": "new",
                "createdAt": datetime.now(timezone.utc),
            }
            for _ in range(count)
        ]
        ids = self._orders.insert_many(docs).inserted_ids
        self.changes += [("insert", _id) for _id in ids]
        for _id in ids[: count // 3]:
            self._orders.update_one({"_id": _id}, {"$set": {"status": "paid"}})
            self.changes.append(("update", _id))
        for _id in ids[-(count // 10) :] if count >= 10 else []:
            self._orders.delete_one({"_id": _id})
            self.changes.append(("delete", _id))


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


PANEL_WIDTH = 80
"""The panel's lines fit a terminal this wide."""
_INDENT = " " * len("run 1: ")


@dataclass
class _Run:
    """One run of the connector as the panel and the summary show it."""

    number: int
    opened_from: str
    written: int = 0
    delivered: int = 0
    seconds: float = 0.0
    behind: float | None = None
    batches: int = 0
    writing: bool = True
    saved: tuple[int, str] | None = None
    """The stored checkpoint: changes handled in all, and when it was saved; None until one is."""

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0

    @property
    def caught_up(self) -> bool:
        return not self.writing and self.delivered >= self.written

    @property
    def checkpoint(self) -> str:
        """The stored checkpoint in words, for the summary table."""
        return "none saved yet" if self.saved is None else f"{self.saved[0]:,} at {self.saved[1]}"


@dataclass
class _Demo:
    rs_uri: str
    client: pymongo.MongoClient[Any]
    handler: type
    spark: Any
    runs: list[_Run] = field(default_factory=list)
    written: list[Change] = field(default_factory=list)
    metrics: str = ""

    def run_once(self, number: int, events: int, live: Live | None, timeout: float = 120.0) -> None:
        stream = Connector(self.rs_uri, [self.handler]).specs[0].name
        run = _Run(number, self._opened_from(stream))
        self.runs.append(run)
        connector = Connector(
            self.rs_uri, [self.handler], spark=self.spark, metrics_port=0, progress_interval=0
        )
        connector.start()
        try:
            address = connector.metrics_address
            self.metrics = f"http://{address[0]}:{address[1]}/metrics" if address else ""
            writer = _Writer(self.client, events, seed=number)
            started = time.perf_counter()
            writer.start()
            deadline = time.monotonic() + timeout
            while True:
                writing = writer.is_alive()  # before the count: a write can end between the two
                status = connector.status()[stream]
                run.writing = writing
                run.written = len(writer.changes)
                run.delivered = status.events_processed - self._processed_before()
                run.seconds = time.perf_counter() - started
                run.behind = status.lag_seconds
                run.batches = sum(r.metrics.batch_events.count for r in connector.runners() if r.metrics)
                run.saved = self._saved(stream)
                if live is not None:
                    live.update(self.panel())
                if writer.error is not None:
                    raise RuntimeError(f"writing the demo's orders failed: {writer.error}") from writer.error
                if not writing and run.delivered >= run.written:
                    break
                if status.state == StreamState.FAILED:
                    raise RuntimeError(f"the demo's stream failed: {status.last_error}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the connector delivered {run.delivered} of {run.written} changes")
                time.sleep(0.1)
        finally:
            connector.stop()
        run.saved = self._saved(stream)
        if live is not None:
            live.update(self.panel())
        self.written += writer.changes

    def _processed_before(self) -> int:
        return sum(run.delivered for run in self.runs[:-1])

    def _checkpoint(self, stream: str) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = self.client[DATABASE]["_fw_checkpoints"].find_one({"_id": stream})
        return doc

    def _opened_from(self, stream: str) -> str:
        doc = self._checkpoint(stream)
        if doc is None:
            return "no: new"
        return f"after {doc.get('eventsProcessed', 0):,}"

    def _saved(self, stream: str) -> tuple[int, str] | None:
        doc = self._checkpoint(stream)
        if doc is None or doc.get("lastProcessedTimestamp") is None:
            return None  # only the position the stream opened at is stored: no change handled yet
        return int(doc.get("eventsProcessed", 0)), doc["lastProcessedTimestamp"].strftime("%H:%M:%S")

    @property
    def spark_starting(self) -> bool:
        """Spark runs its first batch: its Python workers start, which takes 10-30 s, once."""
        return self.spark is not None and not any(run.batches for run in self.runs)

    def panel(self) -> Group:
        lines = [Text(f"metrics: {self.metrics}", style="dim")] if self.metrics else []
        lines += [Text(line) for run in self.runs for line in self.lines(run)]
        return Group(*lines)

    def lines(self, run: _Run) -> list[str]:
        """What the panel says of ``run``: two lines of at most :data:`PANEL_WIDTH` characters."""
        batches = f"{run.batches:,} batch{'' if run.batches == 1 else 'es'}"
        counts = f"{run.written:,} written, {run.delivered:,} delivered, {run.rate:,.0f}/s, {batches}"
        first = f"run {run.number}: {counts}"
        if self.spark_starting and not run.caught_up:
            return [first, f"{_INDENT}Spark is starting (its first batch takes 10-30 s)"]
        if run.caught_up:
            where = "caught up"
        elif run.behind is not None:
            where = f"{run.behind:.1f} s behind"
        else:
            where = "not reading yet"
        if run.saved is None:
            saved = "checkpoint: none saved yet"
        else:
            saved = f"checkpoint saved: {run.saved[0]:,} changes, at {run.saved[1]}"
        return [first, f"{_INDENT}{where}; {saved}"]

    def summary(self) -> Table:
        table = Table(title="two runs, one checkpoint")
        table.add_column("run", justify="right")
        table.add_column("resumed")
        table.add_column("changes", justify="right")
        table.add_column("per second", justify="right")
        table.add_column("batches", justify="right")
        table.add_column("checkpoint")
        for run in self.runs:
            table.add_row(
                str(run.number),
                run.opened_from,
                f"{run.delivered:,}",
                f"{run.rate:,.0f}",
                str(run.batches),
                run.checkpoint,
            )
        return table


@contextmanager
def _logs_above(console: Console) -> Iterator[None]:
    """Log lines print above the live panel instead of through it (and return afterwards)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [RichHandler(console=console, show_path=False, markup=False)]
    try:
        yield
    finally:
        root.handlers = saved


def run_demo(*, events: int = 2000, output: str = "out/demo", use_spark: bool = True) -> int:
    from flowwarden.testing import EmbeddedReplicaSet

    out = Path(output)
    shutil.rmtree(out, ignore_errors=True)
    parquet = out / "orders"
    delivered: list[Change] = []
    err = Console(stderr=True)
    spark = None
    if use_spark:
        from flowwarden.spark import get_or_create_session
        from flowwarden.spark.session import require_java

        require_java("the demo", without="run the demo without Spark: flowwarden demo --no-spark")
        spark_log = out / "spark.log"
        err.print(f"starting local Spark (its log: {spark_log}) ...")
        spark = get_or_create_session(
            app_name="flowwarden-demo",
            conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
            jvm_log=spark_log,
        )
        spark.sparkContext.setLogLevel("ERROR")
        handler = _spark_handler(parquet)
    else:
        handler = _plain_handler(delivered)
    rs = EmbeddedReplicaSet()
    client: pymongo.MongoClient[Any]
    with rs, pymongo.MongoClient(rs.uri) as client:
        err.print(f"EmbeddedReplicaSet (a test double) at {rs.uri}")
        demo = _Demo(rs.uri, client, handler, spark)
        if err.is_terminal:  # a live panel, with the log lines printed above it
            with _logs_above(err), Live(demo.panel(), console=err, refresh_per_second=8) as live:
                for number in (1, 2):
                    demo.run_once(number, events, live)
        else:  # a log file or a pipe: the panel's lines once per run
            for number in (1, 2):
                demo.run_once(number, events, None)
                for line in demo.lines(demo.runs[-1]):
                    err.print(line, soft_wrap=True, highlight=False)
    Console().print(demo.summary())
    written = demo.written
    if spark is not None:
        delivered = _parquet_changes(spark, parquet)
        summary = ", ".join(f"{op}={n}" for op, n in sorted(Counter(op for op, _ in delivered).items()))
        print(f"parquet at {parquet}: {len(delivered)} change rows ({summary})")
    problem = _mismatch(written, delivered)
    if problem is not None:
        print(f"MISMATCH: {problem}", file=sys.stderr)
        return 1
    print(f"ok: every one of {len(written)} changes delivered exactly once across two runs (compared by id)")
    return 0
