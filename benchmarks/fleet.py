"""How long connector processes sharing a partitioned stream take to move its buckets.

    .venv/bin/python benchmarks/fleet.py [--partitions 6] [--lease-ttl 10] [--uri mongodb://...]

Starts an EmbeddedReplicaSet in its own process (unless ``--uri`` names a deployment), then
connector processes running one ``partitions``-bucket ``single_leader`` stream with a no-op
handler, each with its own instance id, and reads the buckets' leases in ``_fw_locks`` every 20 ms:

- the first process takes every bucket (at least 3 are needed for what follows);
- a second and a third join: for each, the time from its member record appearing (it runs) to
  holding its share (the floor of buckets / members), and from its process start;
- the second is killed with SIGKILL: the time until the others hold every bucket it held, which
  waits for its leases to expire (``--lease-ttl``).

Prints the times and the machine's load averages; nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pymongo
from embedded_rs import server  # benchmarks/embedded_rs.py

DB = "bench_fleet"


def child_connector(uri: str, instance: str, partitions: int, ttl: float) -> None:
    """A connector running the stream until killed or stopped."""
    from flowwarden import ChangeEvent, Connector, change_stream, checkpoint, on_change

    @change_stream(
        "orders", DB, name="orders", partitions=partitions, deployment="single_leader", lease_ttl_seconds=ttl
    )
    @checkpoint(save_every_n=100)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            pass

    Connector(uri, [Orders], instance_id=instance).run()


def _spawn(args: argparse.Namespace, uri: str, instance: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--child", instance, "--uri", uri]
    command += ["--partitions", str(args.partitions), "--lease-ttl", str(args.lease_ttl)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _holders(locks: Any) -> dict[str, str | None]:
    """Bucket -> the instance id holding its lease now (None when free or expired)."""
    now = time.time()
    holders: dict[str, str | None] = {}
    for lease in locks.find({"_id": {"$regex": r"^orders\["}}):
        expires = lease.get("expiresAt")
        live = lease.get("owner") is not None and expires is not None and expires.timestamp() > now
        holders[lease["_id"]] = lease["owner"] if live else None
    return holders


def _members(locks: Any) -> set[str]:
    return {doc.get("owner") for doc in locks.find({"kind": "member", "stream": "orders"})}


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _until(what: str, predicate: Callable[[], bool], timeout: float = 120.0) -> float:
    """Seconds until ``predicate()`` holds, read every 20 ms."""
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)
    return time.perf_counter() - started


def _held(locks: Any, instance: str) -> int:
    return sum(1 for owner in _holders(locks).values() if owner == instance)


def run(args: argparse.Namespace, uri: str) -> None:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri)
    client.drop_database(DB)
    client[DB].orders.insert_one({"_id": 0})
    locks = client[DB]["_fw_locks"]
    buckets = args.partitions
    children: list[subprocess.Popen[bytes]] = []
    try:
        children.append(_spawn(args, uri, "a"))
        took = _until("the first process to take every bucket", lambda: _held(locks, "a") == buckets)
        print(f"first process, from its start to holding all {buckets} buckets: {took:.2f} s")
        for count, instance in ((2, "b"), (3, "c")):
            share = buckets // count
            children.append(_spawn(args, uri, instance))
            from_start = time.perf_counter()
            _until(f"{instance}'s member record", lambda instance=instance: instance in _members(locks))
            joined = time.perf_counter()
            _until(
                f"{instance} to hold {share} buckets",
                lambda instance=instance, share=share: _held(locks, instance) >= share,
            )
            done = time.perf_counter()
            print(
                f"process {count} joins: holds its {share} buckets {done - joined:.2f} s after its member "
                f"record appeared ({done - from_start:.2f} s after its process started)"
            )
        victim = children[1]
        lost = {bucket for bucket, owner in _holders(locks).items() if owner == "b"}
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        took = _until(
            "the others to take the killed process's buckets",
            lambda: all(_holders(locks).get(bucket) in ("a", "c") for bucket in lost),
        )
        print(
            f"process 2 killed (SIGKILL): its {len(lost)} buckets held by the others {took:.2f} s later "
            f"(lease_ttl_seconds={args.lease_ttl:g})"
        )
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        client.drop_database(DB)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--uri", default=None, help="a deployment to use instead of an embedded one")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.partitions < 3:
        parser.error("--partitions must be at least 3: three processes share the buckets")
    if args.child is not None:
        child_connector(args.uri, args.child, args.partitions, args.lease_ttl)
        return
    print(f"{' '.join(['benchmarks/fleet.py', *sys.argv[1:]])}; load averages {_load()}")
    with server(uri=args.uri) as uri:
        run(args, uri)
    print(f"load averages after: {_load()}")


if __name__ == "__main__":
    main()
