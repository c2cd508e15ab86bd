"""What a checkpoint costs: the committer's hot path and the Mongo stores' save rate.

    .venv/bin/python benchmarks/committer.py [--commits 1000000] [--saves 2000]

Prints plain figures, asserts nothing:

* microseconds per ``await committer.commit(...)`` with save_every_n=1000 on the in-memory store,
  for in-order completions and for completions out of order within windows of 8 (each window
  finishes last-to-first, so 7 of every 8 commits wait in the gap map);
* checkpoint saves per second of MongoCheckpointStore and AsyncMongoCheckpointStore against an
  EmbeddedReplicaSet started here (store.save directly, and through a committer that saves every
  commit). The embedded server is a Python test double: these rates measure flowwarden's
  overhead plus that double, not a production MongoDB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import pymongo

from flowwarden.checkpoints import (
    AsyncMongoCheckpointStore,
    Checkpoint,
    CheckpointCommitter,
    InMemoryCheckpointStore,
    MongoCheckpointStore,
)
from flowwarden.checkpoints.contract import sample_token
from flowwarden.testing import EmbeddedReplicaSet


def tokens(count: int) -> list[dict[str, Any]]:
    return [sample_token(1_700_000_000 + i // 1000, i % 1000 + 1) for i in range(count + 1)]


def out_of_order(count: int, window: int) -> list[int]:
    order: list[int] = []
    for start in range(1, count + 1, window):
        order.extend(range(min(start + window - 1, count), start - 1, -1))
    return order


async def empty(sequence: int, token: dict[str, Any]) -> None:
    return None


# A stream yields to the event loop between events (it awaits the next batch, handlers await
# I/O); yielding every 100 commits lets the save task run, so its saves are in the figure.
YIELD_EVERY = 100


async def time_commits(order: list[int], toks: list[dict[str, Any]]) -> tuple[float, float, int]:
    """Seconds for committing ``order``; seconds for the same loop with an empty coroutine; saves."""
    committer = CheckpointCommitter(
        InMemoryCheckpointStore(), "bench", save_every_n=1000, save_interval_seconds=5
    )
    commit = committer.commit
    start = time.perf_counter()
    for index, sequence in enumerate(order):
        await commit(sequence, toks[sequence])
        if index % YIELD_EVERY == 0:
            await asyncio.sleep(0)
    elapsed = time.perf_counter() - start
    await committer.close()

    start = time.perf_counter()
    for index, sequence in enumerate(order):
        await empty(sequence, toks[sequence])
        if index % YIELD_EVERY == 0:
            await asyncio.sleep(0)
    baseline = time.perf_counter() - start
    return elapsed, baseline, committer.saves


def sync_saves(uri: str, count: int) -> float:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    with client:
        store = MongoCheckpointStore(client["bench_sync"])
        toks = tokens(count)
        start = time.perf_counter()
        for i in range(count):
            store.save(Checkpoint(stream_id="bench", last_processed_token=toks[i + 1], events_processed=i))
        return count / (time.perf_counter() - start)


async def async_saves(uri: str, count: int) -> float:
    client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(uri)
    try:
        store = AsyncMongoCheckpointStore(client["bench_async"])
        toks = tokens(count)
        start = time.perf_counter()
        for i in range(count):
            await store.save(
                Checkpoint(stream_id="bench", last_processed_token=toks[i + 1], events_processed=i)
            )
        return count / (time.perf_counter() - start)
    finally:
        await client.close()


async def committer_saves(uri: str, count: int, *, use_async: bool) -> float:
    """Saves/s through a committer with save_every_n=0, save_interval_seconds=0 (every commit)."""
    toks = tokens(count)
    if use_async:
        aclient: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(uri)
        store: Any = AsyncMongoCheckpointStore(aclient["bench_committer_async"])
    else:
        sclient: pymongo.MongoClient[Any] = pymongo.MongoClient(uri)
        store = MongoCheckpointStore(sclient["bench_committer_sync"])
    committer = CheckpointCommitter(store, "bench", save_every_n=0, save_interval_seconds=0)
    try:
        start = time.perf_counter()
        for sequence in range(1, count + 1):
            await committer.commit(sequence, toks[sequence])
        rate = committer.saves / (time.perf_counter() - start)
        await committer.close()
        return rate
    finally:
        if use_async:
            await aclient.close()
        else:
            sclient.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--saves", type=int, default=2000)
    args = parser.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    toks = tokens(args.commits)
    for label, order in (
        ("in order", list(range(1, args.commits + 1))),
        ("out of order, windows of 8", out_of_order(args.commits, 8)),
    ):
        elapsed, baseline, saves = asyncio.run(time_commits(order, toks))
        per_commit = elapsed / len(order) * 1e6
        per_await = baseline / len(order) * 1e6
        print(
            f"committer.commit, save_every_n=1000, in-memory store, {label}: "
            f"{per_commit:.3f} us/commit ({saves} saves; awaiting an empty coroutine: {per_await:.3f} us)"
        )

    # A fresh server for each figure, so one measurement's oplog does not slow the next.
    measures: list[tuple[str, Callable[[str], float]]] = [
        ("MongoCheckpointStore.save", lambda uri: sync_saves(uri, args.saves)),
        ("AsyncMongoCheckpointStore.save", lambda uri: asyncio.run(async_saves(uri, args.saves))),
        (
            "committer (N=0, T=0) over MongoCheckpointStore (worker thread)",
            lambda uri: asyncio.run(committer_saves(uri, args.saves, use_async=False)),
        ),
        (
            "committer (N=0, T=0) over AsyncMongoCheckpointStore",
            lambda uri: asyncio.run(committer_saves(uri, args.saves, use_async=True)),
        ),
    ]
    for label, measure in measures:
        with EmbeddedReplicaSet() as rs:
            rate = measure(rs.uri)
        print(f"{label} on EmbeddedReplicaSet: {rate:,.0f} saves/s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
