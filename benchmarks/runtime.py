"""Connector throughput against the raw driver ceiling, and the connector's memory.

    .venv/bin/python benchmarks/runtime.py [--events 200000] [--rounds 5]

Starts an EmbeddedReplicaSet in its own process (so server and consumer each get a core), fills the
oplog with N inserts, then measures in fresh child processes reading the same N events from the
same start time:

- raw PyMongo ``watch()`` loops, ``MongoClient`` and ``AsyncMongoClient``: the ceiling. Each loop
  calls ``try_next()`` (the driver's cheapest per-event call) and decodes with the codec options
  the connector uses (``tz_aware=True``, so both hand over the same timezone-aware datetimes);
- a Connector with a no-op ``@on_change`` handler, save_every_n=1000, run as ``run()`` runs it: on
  the process's main thread, timed from before it starts to its handler seeing the last event;
- the same with save_every_n=0 (heartbeat saves only): what the awaited count saves cost;
- the same with save_every_n=1 (on the first 20,000 events, once: each waits for its own save);
- the save_every_n=1000 connector with ``metrics_port`` set: what counting for Prometheus costs
  (nothing scrapes it during the run; a scrape reads the counters on the server's own thread).

The measurements take turns for ``--rounds`` rounds, in an order that rotates each round, and
each one's best run counts, so a busy moment of the machine (or of the server's garbage
collector) weighs on all rows alike. It prints
events/s, the spread over the rounds, the connector/ceiling ratios and each connector run's peak
RSS growth. For reference it also prints the sync loop with PyMongo's default codec options (naive
datetimes), which is not what the connector delivers. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import pymongo
from bson import Timestamp
from embedded_rs import server  # benchmarks/embedded_rs.py

DB, COLL = "bench", "events"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


# -- children ----------------------------------------------------------------------------------


def child_raw_sync(uri: str, start: Timestamp, events: int, tz_aware: bool = True) -> dict[str, Any]:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, tz_aware=tz_aware)
    coll = client[DB][COLL]
    began = time.perf_counter()
    n = 0
    with coll.watch(start_at_operation_time=start, batch_size=1000) as stream:
        while n < events:
            if stream.try_next() is not None:
                n += 1
    elapsed = time.perf_counter() - began
    client.close()
    return {"seconds": elapsed, "events": n}


def child_raw_async(uri: str, start: Timestamp, events: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(uri, tz_aware=True)
        coll = client[DB][COLL]
        began = time.perf_counter()
        n = 0
        async with await coll.watch(start_at_operation_time=start, batch_size=1000) as stream:
            while n < events:
                if await stream.try_next() is not None:
                    n += 1
        elapsed = time.perf_counter() - began
        await client.close()
        return {"seconds": elapsed, "events": n}

    return asyncio.run(main())


def child_connector(
    uri: str, start: Timestamp, events: int, save_every_n: int, metrics: bool = False
) -> dict[str, Any]:
    """The connector as ``run()`` runs it (and the CLI): on the process's main thread, nothing
    else in the process. The clock starts before the connector does (its client connects, the
    stream opens, like the raw loops' ``watch()``) and stops when the handler has seen the last
    event; then the handler asks the connector to stop."""
    from flowwarden import ChangeEvent, Connector, StartPosition, change_stream, checkpoint, on_change

    # A stream name of its own per run: no run resumes from another's checkpoint.
    name = f"bench-n{save_every_n}-{os.getpid()}"
    finished: list[float] = []

    @change_stream(COLL, DB, name=name, batch_size=1000)
    @checkpoint(
        save_every_n=save_every_n,
        save_interval_seconds=5,
        start_position=StartPosition.AT_TIME,
        start_at=start,
    )
    class NoOp:
        def __init__(self) -> None:
            self.seen = 0

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            self.seen += 1
            if self.seen == events:
                finished.append(time.perf_counter())
                connector.stop()

    baseline = _rss_mb()
    connector = Connector(uri, [NoOp], metrics_port=0 if metrics else None)
    began = time.perf_counter()
    connector.run()
    status = connector.status()[name]
    if not finished:
        raise RuntimeError(f"the connector stopped before the last event: {status.state} {status.last_error}")
    return {
        "seconds": finished[0] - began,
        "events": status.events_processed,
        "rss_growth_mb": _peak_rss_mb() - baseline,
    }


# -- parent ------------------------------------------------------------------------------------


def _run_child(kind: str, uri: str, start: Timestamp, events: int, extra: int = 0) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--uri",
            uri,
            "--start",
            f"{start.time}:{start.inc}",
            "--events",
            str(events),
            "--save-every-n",
            str(extra),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", default=None)
    parser.add_argument("--uri", default=None)
    parser.add_argument("--start", default=None)
    parser.add_argument("--save-every-n", type=int, default=0)
    args = parser.parse_args()

    if args.child:
        seconds, inc = map(int, args.start.split(":"))
        start = Timestamp(seconds, inc)
        if args.child == "raw-sync":
            result = child_raw_sync(args.uri, start, args.events)
        elif args.child == "raw-sync-naive":
            result = child_raw_sync(args.uri, start, args.events, tz_aware=False)
        elif args.child == "raw-async":
            result = child_raw_async(args.uri, start, args.events)
        else:
            metrics = args.child == "connector-metrics"
            result = child_connector(args.uri, start, args.events, args.save_every_n, metrics)
        print(json.dumps(result))
        return

    with server() as uri:
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=30_000)
        client.admin.command("ping")
        start = client.admin.command("ping")["operationTime"]
        print(f"filling the oplog with {args.events} inserts ...", flush=True)
        began = time.perf_counter()
        coll = client[DB][COLL]
        for offset in range(0, args.events, 1000):
            coll.insert_many(
                [
                    {"n": offset + i, "sku": f"s{(offset + i) % 97}", "qty": i}
                    for i in range(min(1000, args.events - offset))
                ]
            )
        print(f"  filled in {time.perf_counter() - began:.1f}s")

        variants: dict[str, tuple[str, int]] = {
            "raw PyMongo watch() loop, MongoClient": ("raw-sync", 0),
            "raw PyMongo watch() loop, AsyncMongoClient": ("raw-async", 0),
            "Connector, no-op @on_change, save_every_n=1000": ("connector", 1000),
            "Connector, no-op @on_change, save_every_n=0 (heartbeat only)": ("connector", 0),
            "Connector, no-op @on_change, save_every_n=1000, metrics_port set": ("connector-metrics", 1000),
            "(reference) raw MongoClient loop, default codec (naive datetimes)": ("raw-sync-naive", 0),
        }
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in variants}
        labels = list(variants)
        for round_number in range(1, args.rounds + 1):
            print(f"  round {round_number} of {args.rounds} ...", flush=True)
            # The order rotates each round: no variant always runs right after the same one.
            for turn in range(len(labels)):
                label = labels[(turn + round_number - 1) % len(labels)]
                kind, save_every_n = variants[label]
                runs[label].append(_run_child(kind, uri, start, args.events, save_every_n))
        # Every event waits for its own save: measured once, on fewer events; the rate is what counts.
        n1_label = "Connector, no-op @on_change, save_every_n=1"
        runs[n1_label] = [_run_child("connector", uri, start, min(args.events, 20_000), 1)]

        def rate(run: dict[str, Any]) -> float:
            return float(run["events"] / run["seconds"])

        best = {label: max(rs, key=rate) for label, rs in runs.items()}
        sync_ceiling = rate(best["raw PyMongo watch() loop, MongoClient"])
        async_loop = rate(best["raw PyMongo watch() loop, AsyncMongoClient"])
        ceiling = max(sync_ceiling, async_loop)
        print(
            f"\n{args.events:,} change events, EmbeddedReplicaSet in its own process, batch_size=1000, "
            f"best of {args.rounds} rounds (spread in brackets)"
        )
        for label, rs in runs.items():
            top = best[label]
            spread = f"[{min(map(rate, rs)):>9,.0f} .. {max(map(rate, rs)):>9,.0f}]" if len(rs) > 1 else ""
            extra = ""
            if label.startswith("Connector"):
                extra = f"  {rate(top) / ceiling:.2f} of ceiling, {rate(top) / async_loop:.2f} of async loop"
            if top.get("rss_growth_mb") is not None:
                extra += f"  peak RSS growth {max(r['rss_growth_mb'] for r in rs):.1f} MB"
            print(f"  {label:66s} {rate(top):>9,.0f} events/s {spread:24s}{extra}")
        print(f"  ceiling = the faster raw loop with the connector's codec options: {ceiling:,.0f} events/s")


if __name__ == "__main__":
    main()
