"""Throughput of the embedded replica set, as one PyMongo client sees it.

Prints two figures (no assertions):

* insert_many documents/s: batches of 1000 small documents through ``insert_many``;
* change events/s served to one ``watch(batch_size=1000)`` reading a pre-filled oplog (the
  documents inserted above, read back from ``startAtOperationTime`` before the first insert).

By default the server runs in its own process (``python -m flowwarden.cli embedded-mongo``), as
the other benchmarks run it, so server and client each get a core. ``--in-process`` runs it in a
thread of this process instead, as tests do: then both share one interpreter lock and one garbage
collector, and the figures measure the pair.

Run: ``.venv/bin/python benchmarks/embedded_rs.py [--events 200000] [--in-process]``.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pymongo
from bson import Timestamp

BATCH = 1000


def fill(collection: Any, total: int) -> float:
    """Insert ``total`` small documents in batches of 1000; return documents per second."""
    started = time.perf_counter()
    for start in range(0, total, BATCH):
        collection.insert_many(
            [{"_id": i, "n": i, "name": f"item-{i}", "tags": ["a", "b"]} for i in range(start, start + BATCH)]
        )
    return total / (time.perf_counter() - started)


def serve(collection: Any, start: Timestamp, total: int) -> float:
    """Read ``total`` insert events from ``start`` with batch_size 1000; return events per second."""
    started = time.perf_counter()
    seen = 0
    with collection.watch(batch_size=BATCH, start_at_operation_time=start) as stream:
        for _change in stream:
            seen += 1
            if seen == total:
                break
    return seen / (time.perf_counter() - started)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def server(in_process: bool = False, uri: str | None = None) -> Iterator[str]:
    """The URI of a running deployment: ``uri`` when given, else an embedded replica set started
    here (in its own process unless ``in_process``), answering before it is yielded and stopped on
    exit. Every benchmark starts its server through this."""
    if uri is not None:
        yield uri
        return
    if in_process:
        from flowwarden.testing import EmbeddedReplicaSet

        with EmbeddedReplicaSet() as rs:
            yield rs.uri
        return
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "flowwarden.cli", "embedded-mongo", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started = f"mongodb://127.0.0.1:{port}/?replicaSet=rs0"
    try:
        with pymongo.MongoClient(started, serverSelectionTimeoutMS=30_000) as probe:
            probe.admin.command("ping")
        yield started
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="documents inserted, then events read")
    parser.add_argument(
        "--in-process", action="store_true", help="run the server in a thread of this process"
    )
    args = parser.parse_args()
    total = max(BATCH, args.events - args.events % BATCH)
    with server(args.in_process) as uri, pymongo.MongoClient(uri, serverSelectionTimeoutMS=30_000) as client:
        collection = client.bench.items
        collection.drop()
        collection.insert_one({"_id": "warm-up"})
        last = client.admin.command("ping")["operationTime"]
        start = Timestamp(last.time, last.inc + 1)
        inserts_per_second = fill(collection, total)
        events_per_second = serve(collection, start, total)
    where = "in a thread of the client's process" if args.in_process else "in its own process"
    print(f"EmbeddedReplicaSet {where}, {total} documents / events")
    print(f"insert_many documents/s (batches of {BATCH}): {inserts_per_second:,.0f}")
    print(
        f"change events/s to one watch(batch_size={BATCH}) from a pre-filled oplog: {events_per_second:,.0f}"
    )


if __name__ == "__main__":
    main()
