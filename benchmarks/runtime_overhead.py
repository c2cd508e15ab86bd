"""The connector's own cost per event, without the driver, the network or the server.

    .venv/bin/python benchmarks/runtime_overhead.py [--events 300000] [--rounds 3]

benchmarks/runtime.py measures the connector end to end against the raw driver loop; its figures
move with the embedded server's speed and the machine's load. This script isolates what the
connector adds: the stream's change stream is replaced by one that hands out pre-decoded change
events from memory (``StreamRunner._open`` is patched to return it; everything after it, the read
loop, dispatch, the no-op ``@on_change`` handler, the committer with save_every_n=1000 into an
in-memory store, runs as in production). It prints microseconds per event for the connector and for
a bare ``await try_next()`` loop over the same stand-in stream; the difference is the connector's
overhead. Best of ``--rounds``. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bson import Timestamp

from flowwarden import ChangeEvent, Connector, StartPosition, change_stream, checkpoint, on_change
from flowwarden.checkpoints import InMemoryCheckpointStore
from flowwarden.runtime.stream import StreamRunner
from flowwarden.testing import EmbeddedReplicaSet


def make_events(count: int) -> list[dict[str, Any]]:
    events = []
    for i in range(count):
        seconds, inc = 1_700_000_000 + i // 1000, i % 1000 + 1
        events.append(
            {
                "_id": {"_data": f"82{seconds:08X}{inc:08X}2B0429296E1404"},
                "operationType": "insert",
                "clusterTime": Timestamp(seconds, inc),
                "ns": {"db": "bench", "coll": "events"},
                "documentKey": {"_id": i},
                "fullDocument": {"_id": i, "sku": f"s{i % 97}", "qty": i},
            }
        )
    return events


class MemoryStream:
    """Stands in for PyMongo's change stream: the events, then empty getMores."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = iter(events)
        self.alive = True
        self.resume_token = None

    async def try_next(self) -> dict[str, Any] | None:
        event = next(self._events, None)
        if event is None:
            await asyncio.sleep(0.01)  # an idle getMore
        return event

    async def close(self) -> None:
        pass


def bare_loop(events: list[dict[str, Any]]) -> float:
    async def run() -> float:
        stream = MemoryStream(events)
        began = time.perf_counter()
        for _ in range(len(events)):
            await stream.try_next()
        return time.perf_counter() - began

    return asyncio.run(run())


def connector_run(uri: str, events: list[dict[str, Any]], round_number: int) -> float:
    count = len(events)
    marks: dict[str, float] = {}
    finished: dict[str, asyncio.Event] = {}

    @change_stream("events", "bench", name=f"overhead-{round_number}", batch_size=1000)
    @checkpoint(save_every_n=1000, save_interval_seconds=5, start_position=StartPosition.LATEST)
    class NoOp:
        seen = 0

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            NoOp.seen += 1
            if NoOp.seen == 1:
                marks["first"] = time.perf_counter()
            elif NoOp.seen == count:
                marks["last"] = time.perf_counter()
                finished["event"].set()  # handlers run on the connector's loop: no thread hop

    async def fake_open(self: StreamRunner, start: Any, codec_options: Any = None) -> MemoryStream:
        return MemoryStream(events)

    original = StreamRunner._open
    StreamRunner._open = fake_open  # type: ignore[method-assign]
    try:
        connector = Connector(uri, [NoOp], checkpoint_store=InMemoryCheckpointStore())

        async def run() -> None:
            finished["event"] = asyncio.Event()
            task = asyncio.create_task(connector.run_async())
            await finished["event"].wait()
            connector.stop()
            await task

        asyncio.run(run())
    finally:
        StreamRunner._open = original  # type: ignore[method-assign]
    # From the first handled event to the last: start-up is not part of the per-event cost.
    return (marks["last"] - marks["first"]) / (count - 1) * count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    events = make_events(args.events)
    best_connector = best_bare = float("inf")
    # The checkpoint store and the stand-in stream live in memory; the embedded server only
    # answers the client's handshake.
    with EmbeddedReplicaSet() as rs:
        for round_number in range(args.rounds):
            best_bare = min(best_bare, bare_loop(events))
            best_connector = min(best_connector, connector_run(rs.uri, events, round_number))
    per_event = best_connector / args.events * 1e6
    bare = best_bare / args.events * 1e6
    print(f"{args.events:,} pre-decoded change events from memory, best of {args.rounds}")
    print(f"  bare `await try_next()` loop                              {bare:6.2f} us/event")
    print(f"  Connector, no-op @on_change, save_every_n=1000            {per_event:6.2f} us/event")
    print(f"  the connector's own cost                                  {per_event - bare:6.2f} us/event")


if __name__ == "__main__":
    main()
