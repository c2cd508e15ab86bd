"""The connector's own cost per event, without the driver, the network or the server.

    .venv/bin/python benchmarks/runtime_overhead.py [--events 300000] [--rounds 3]

benchmarks/runtime.py measures the connector end to end against the raw driver loop; its figures
move with the embedded server's speed and the machine's load. This script isolates what the
connector adds: the change stream the stream reads is replaced by one that hands out pre-decoded
change events from memory. The seam is ``StreamOpener.open`` (flowwarden.runtime.opening), the one
place the runtime opens the change stream it reads; everything around it runs as in production:
the opening position is asked of an EmbeddedReplicaSet and stored before the first event, then the
read-ahead task (flowwarden.runtime.read_ahead), the read loop and the no-op ``@on_change`` handler
inline on the event loop (flowwarden.runtime.dispatch), the committer with save_every_n=1000 into
an in-memory store. A run fails, with a message saying why, rather than measure something else:
if the runtime no longer opens its stream there, or if its checkpoint does not reach the last event.

It prints microseconds per event for the connector, timed from its first handled event to its
last, and for a bare ``await try_next()`` loop over the same stand-in stream; the difference is
the connector's overhead. It then runs the connector again with an ``@event_filter`` that reads
each event's operation type and keeps it: the difference to the run without is what a filter
costs per event. Best of ``--rounds``. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping
from typing import Any
from unittest import mock

from bson import Timestamp

from flowwarden import (
    ChangeEvent,
    Connector,
    StartPosition,
    change_stream,
    checkpoint,
    event_filter,
    on_change,
)
from flowwarden.checkpoints import InMemoryCheckpointStore
from flowwarden.runtime.opening import StreamOpener
from flowwarden.runtime.status import StreamState
from flowwarden.testing import EmbeddedReplicaSet

# How long a round may take beyond its events (the connector's start-up, the opening position).
START_UP_SECONDS = 60.0


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


def connector_run(
    uri: str, events: list[dict[str, Any]], round_number: int, *, filtered: bool = False
) -> float:
    count = len(events)
    name = f"overhead-{round_number}{'-filtered' if filtered else ''}"
    marks: dict[str, float] = {}
    opened: list[MemoryStream] = []

    @change_stream("events", "bench", name=name, batch_size=1000)
    @checkpoint(save_every_n=1000, save_interval_seconds=5, start_position=StartPosition.LATEST)
    class NoOp:
        seen = 0
        if filtered:

            @event_filter
            def keep(self, event: ChangeEvent) -> bool:
                return event.operation_type != "delete"

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            NoOp.seen += 1
            if NoOp.seen == 1:
                marks["first"] = time.perf_counter()
            elif NoOp.seen == count:
                marks["last"] = time.perf_counter()
                finished.set()  # handlers run on the connector's loop: no thread hop

    async def stand_in(
        self: StreamOpener, start: Mapping[str, Any], codec_options: Any = None
    ) -> MemoryStream:
        stream = MemoryStream(events)
        opened.append(stream)
        return stream

    store = InMemoryCheckpointStore()
    connector = Connector(uri, [NoOp], checkpoint_store=store)
    finished = asyncio.Event()

    def failure(why: str) -> RuntimeError:
        status = connector.status().get(name)
        state = f"{status.state.value}, {status.last_error}" if status is not None else "no status"
        return RuntimeError(f"{why} (stream {name}: {state})")

    async def run() -> None:
        task = asyncio.create_task(connector.run_async())
        try:
            # Until the stream opens: it must open the stand-in, or it would read the (empty)
            # server and wait forever. Polled only before the first event, outside the timing.
            while not opened:
                status = connector.status().get(name)
                if task.done():
                    raise failure("the connector ended before its stream opened")
                if status is not None and status.state is StreamState.RUNNING:
                    raise failure(
                        "the stream did not open its change stream through StreamOpener.open, the "
                        "seam this benchmark replaces; find where flowwarden.runtime now opens it "
                        "and patch that instead"
                    )
                await asyncio.sleep(0.005)
            done = asyncio.ensure_future(finished.wait())
            deadline = START_UP_SECONDS + count * 1e-4
            await asyncio.wait({done, task}, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            if not finished.is_set():
                raise failure(f"the handler saw {NoOp.seen} of {count} events within {deadline:.0f} s")
        finally:
            connector.stop()
            await task

    with mock.patch.object(StreamOpener, "open", stand_in):
        asyncio.run(run())
    saved = store.load(name)
    if saved is None or saved.last_processed_token != events[-1]["_id"]:
        position = saved.last_processed_token if saved is not None else None
        raise RuntimeError(f"the checkpoint did not reach the last event on stop: it holds {position}")
    # From the first handled event to the last: start-up is not part of the per-event cost.
    return (marks["last"] - marks["first"]) / (count - 1) * count


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000, help="at least 2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.events < 2:
        parser.error("--events must be at least 2 (the timing runs from the first event to the last)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    events = make_events(args.events)
    best_connector = best_bare = best_filtered = float("inf")
    # The checkpoint store and the stand-in stream live in memory; the embedded server answers
    # the client's handshake and names the stream's opening position.
    with EmbeddedReplicaSet() as rs:
        for round_number in range(args.rounds):
            best_bare = min(best_bare, bare_loop(events))
            best_connector = min(best_connector, connector_run(rs.uri, events, round_number))
            best_filtered = min(
                best_filtered, connector_run(rs.uri, events, round_number, filtered=True)
            )
    per_event = best_connector / args.events * 1e6
    bare = best_bare / args.events * 1e6
    print(f"{args.events:,} pre-decoded change events from memory, best of {args.rounds}")
    print(f"  bare `await try_next()` loop                              {bare:6.2f} us/event")
    print(f"  Connector, no-op @on_change, save_every_n=1000            {per_event:6.2f} us/event")
    print(f"  the connector's own cost                                  {per_event - bare:6.2f} us/event")
    filtered = best_filtered / args.events * 1e6
    print(f"  Connector, the same with an @event_filter keeping it       {filtered:6.2f} us/event")
    print(f"  the filter's cost                                         {filtered - per_event:6.2f} us/event")


if __name__ == "__main__":
    main()
