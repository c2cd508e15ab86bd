"""How fast an incremental snapshot copies while the stream runs and a writer keeps writing.

    .venv/bin/python benchmarks/incremental.py [--documents 50000] [--write-rate 200] [--chunk 1000]
        [--kind event|batch] [--uri mongodb://...]

Starts an EmbeddedReplicaSet in its own process (unless ``--uri`` names a deployment), fills a
collection with ``--documents`` documents, then runs, each in a process of its own:

- a writer updating (80 %), inserting (10 %) and deleting (10 %) random documents at
  ``--write-rate`` writes per second (paced, not flat out);
- a connector with a no-op ``@on_change`` (``--kind event``) or ``@on_batch(max_events=chunk)``
  (``--kind batch``) handler, ``full_document="updateLookup"``.

Once the stream is open and the writer at its pace, it requests an incremental snapshot with
``--chunk`` documents per chunk and times it from the request to the progress stored as done. It
prints the documents copied per second, the rows the watermark rule left out, the writes the
writer made meanwhile (the rate it held), and the machine's load averages before and after, as
uptime shows them. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from typing import Any

import pymongo
from embedded_rs import server  # benchmarks/embedded_rs.py

DB, COLL = "bench_incremental", "orders"


# -- children ----------------------------------------------------------------------------------


def child_writer(uri: str, rate: float, documents: int) -> None:
    """Writes at ``rate`` per second until killed; prints nothing."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri)
    orders = client[DB][COLL]
    pick = random.Random(7)
    next_id = documents
    began = time.perf_counter()
    writes = 0
    counter = client[DB]["bench_writes"]
    while True:
        key = pick.randrange(next_id)
        choice = pick.random()
        if choice < 0.8:
            orders.update_one({"_id": key}, {"$inc": {"qty": 1}})
        elif choice < 0.9:
            orders.insert_one({"_id": next_id, "qty": 0})
            next_id += 1
        else:
            orders.delete_one({"_id": key})
        writes += 1
        if writes % 20 == 0:  # the count, for the run to read (a write of its own, now and then)
            counter.update_one({"_id": "writer"}, {"$set": {"writes": writes}}, upsert=True)
        pause = began + writes / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)


def child_connector(uri: str, kind: str, chunk: int) -> None:
    from flowwarden import ChangeEvent, Connector, change_stream, checkpoint, on_batch, on_change

    @change_stream(COLL, DB, name="orders", full_document="updateLookup", snapshot_chunk_size=chunk)
    @checkpoint(save_every_n=1000, save_interval_seconds=0.5)
    class Events:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            pass

    @change_stream(COLL, DB, name="orders", full_document="updateLookup", snapshot_chunk_size=chunk)
    @checkpoint(save_every_n=1000, save_interval_seconds=0.5)
    class Batches:
        @on_batch(max_events=chunk, max_wait_seconds=0.2)
        def handle(self, events: list[ChangeEvent]) -> None:
            pass

    Connector(uri, [Events if kind == "event" else Batches], progress_interval=0).run()


# -- the run -----------------------------------------------------------------------------------


def _progress(client: pymongo.MongoClient[Any]) -> dict[str, Any]:
    record = client[DB]["_fw_checkpoints"].find_one({"_id": "orders"}) or {}
    progress: dict[str, Any] = record.get("incrementalSnapshot") or {}
    return progress


def _writes(client: pymongo.MongoClient[Any]) -> int:
    found = client[DB]["bench_writes"].find_one({"_id": "writer"}) or {}
    return int(found.get("writes", 0))


def _load() -> str:
    """The machine's load averages, as uptime shows them: the figures depend on what else ran."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _wait(what: str, predicate: Any, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--write-rate", type=float, default=200.0, help="writes per second")
    parser.add_argument("--chunk", type=int, default=1000, help="documents per chunk")
    parser.add_argument("--kind", choices=["event", "batch"], default="event")
    parser.add_argument("--uri", default=None, help="a deployment to use instead of an embedded one")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child == "writer":
        child_writer(args.uri, args.write_rate, args.documents)
        return
    if args.child == "connector":
        child_connector(args.uri, args.kind, args.chunk)
        return

    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"load before (1, 5, 15 min): {_load()}")
    processes: list[subprocess.Popen[bytes]] = []  # the connector and the writer
    with server(uri=args.uri) as uri:
        try:
            client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=30_000)
            client.drop_database(DB)
            orders = client[DB][COLL]
            for offset in range(0, args.documents, 5000):
                ids = range(offset, min(offset + 5000, args.documents))
                orders.insert_many([{"_id": i, "qty": 0, "sku": f"s{i % 97}"} for i in ids])

            def child(role: str) -> subprocess.Popen[bytes]:
                command = [sys.executable, __file__, "--child", role, "--uri", uri, "--kind", args.kind]
                command += ["--chunk", str(args.chunk), "--write-rate", str(args.write_rate)]
                command += ["--documents", str(args.documents)]
                return subprocess.Popen(command, env=os.environ.copy())

            processes.append(child("connector"))
            opened = client[DB]["_fw_checkpoints"]
            _wait("the stream to open", lambda: opened.find_one({"_id": "orders"}), 120)
            processes.append(child("writer"))
            _wait("the writer", lambda: _writes(client) > args.write_rate, 120)  # a second of writing

            from flowwarden.mongo.calls import run
            from flowwarden.mongo.signals import SIGNALS_COLLECTION, insert_request, request_document

            writes_before = _writes(client)
            began = time.perf_counter()
            request = request_document("orders", chunk_size=args.chunk)
            run(insert_request(client[DB][SIGNALS_COLLECTION], request))
            progress = _wait("the copy to end", lambda: (p := _progress(client)).get("state") == "done" and p)
            seconds = time.perf_counter() - began
            writes = _writes(client) - writes_before
            copied, dropped = progress["copied"], progress["dropped"]
            print(
                f"incremental snapshot, {args.kind} handler, chunks of {args.chunk}: {copied:,} rows copied "
                f"+ {dropped:,} left out for their changes in {seconds:.1f} s = "
                f"{(copied + dropped) / seconds:,.0f} documents/s; the writer made {writes:,} writes "
                f"meanwhile ({writes / seconds:,.0f}/s, asked {args.write_rate:g}/s)"
            )
            print(f"load after (1, 5, 15 min): {_load()}; {os.cpu_count()} cores")
        finally:
            for process in reversed(processes):
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    main()
