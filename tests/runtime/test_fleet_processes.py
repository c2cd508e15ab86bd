"""A fleet of ``flowwarden run`` processes sharing one partitioned ``single_leader`` stream, with a
writer throughout: processes join (the buckets are handed over), one is killed with SIGKILL (its
buckets are taken over after the lease TTL), another joins.

The ground truth of every event and its order is a plain change stream the test opens before it
writes anything; a bucket's share of it is the documents whose ``_id`` hashes there.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pymongo
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import wait_until

from .test_partition_crashes import (
    Child,
    Truth,
    Writer,
    bucket_names,
    buckets_of,
    cli,
    count_through,
    log_lines,
    read_events,
    resume_position,
)

PARTITIONS = 6
SAVE_EVERY_N = 10
LEASE_TTL = 5.0


def holders(client: pymongo.MongoClient[Any], db: str) -> dict[str, int]:
    """The pid of the process holding each bucket's live lease (from its instance token,
    ``host:pid:random``)."""
    now = datetime.now(timezone.utc)
    leases = client[db]["_fw_locks"].find(
        {"_id": {"$in": bucket_names(PARTITIONS)}, "ownerToken": {"$ne": None}, "expiresAt": {"$gt": now}}
    )
    return {lease["_id"]: int(lease["ownerToken"].split(":")[1]) for lease in leases}


def shares(client: pymongo.MongoClient[Any], db: str) -> Counter[int]:
    """How many buckets each process holds."""
    return Counter(holders(client, db).values())


def probe(child: Child, path: str) -> tuple[int, str]:
    """GET ``path`` from the metrics server of ``child`` (run with FLOWWARDEN_METRICS_PORT=0: the
    port it picked is in its log)."""
    child.log.wait_for("/readyz served on http://")
    found = re.search(r"/readyz served on (http://\S+)", child.log.text())
    assert found is not None
    try:
        with urllib.request.urlopen(found[1] + path, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def leases_held(child: Child) -> set[str]:
    """The buckets whose ``flowwarden_lease_held`` is 1 in ``child``'s metrics."""
    code, body = probe(child, "/metrics")
    assert code == 200, body
    return {
        sample.labels["stream"]
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "flowwarden_lease_held" and sample.value == 1
    }


def segments(lines: list[list[str]], bucket: str) -> list[tuple[int, int, list[str]]]:
    """One bucket's log lines as runs by one process: (pid, index of the run's first line in the
    log, the run's tokens), in log order."""
    runs: list[tuple[int, int, list[str]]] = []
    for index, (stream, token, pid) in enumerate(lines):
        if stream != bucket:
            continue
        if runs and runs[-1][0] == int(pid):
            runs[-1][2].append(token)
        else:
            runs.append((int(pid), index, [token]))
    return runs


@pytest.mark.slow
@pytest.mark.usefixtures("needs_hashed_index_key")
def test_a_fleet_of_processes_shares_the_buckets_through_joins_and_a_sigkill(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    tmp_path: Path,
) -> None:
    """Three processes run FleetOrders (partitions=6, single_leader) while a writer inserts,
    updates and deletes; each comes to hold 2 buckets, the first handing 4 over as the others
    join. One is killed with SIGKILL: the other two take its buckets once their leases expire (3
    each). A fourth joins and gets its 2.

    Every event is handled, each bucket's (so each document's) in stream order. A bucket handed
    over goes on exactly where its giver stopped: the giver finished and saved before releasing.
    Events are handled twice only in the killed process's unsaved windows: for each bucket it held,
    the events it handled after that bucket's stored position, at most save_every_n; no other
    event twice. At the end each live process holds 1 or 2 buckets, as `flowwarden status` shows."""
    names = bucket_names(PARTITIONS)
    log = tmp_path / "handled.log"
    orders = client[db_name]["orders"]
    env = {
        "FW_TEST_PARTITIONS": str(PARTITIONS),
        "FW_TEST_SAVE_EVERY_N": str(SAVE_EVERY_N),
        "FW_TEST_SAVE_INTERVAL": "0.3",
        "FW_TEST_LEASE_TTL": str(LEASE_TTL),
        "FLOWWARDEN_METRICS_PORT": "0",
    }
    bucket_of = buckets_of(client, db_name, PARTITIONS)
    checkpoints = client[db_name]["_fw_checkpoints"]
    children: list[Child] = []
    killed = None

    def start(name: str) -> Child:
        child = Child(mongodb_uri, db_name, log, "FleetOrders", FLOWWARDEN_INSTANCE_ID=name, **env)
        children.append(child)
        return child

    def balanced(pids: list[int], share: int) -> bool:
        held = shares(client, db_name)
        return sorted(held) == sorted(pids) and set(held.values()) == {share}

    def handled_since(since: int, pid: int, count: int) -> bool:
        return sum(int(line[2]) == pid for line in log_lines(log)[since:]) >= count

    try:
        first = start("a")
        # Every bucket stores its opening position before it handles anything: what is written
        # from now on is owed.
        wait_until(
            lambda: checkpoints.count_documents({"_id": {"$in": names}}) == PARTITIONS,
            timeout=60,
            what="each bucket's opening position",
        )
        with orders.watch(max_await_time_ms=50) as truth_stream:
            with Writer(orders) as writer:
                wait_until(lambda: len(log_lines(log)) >= 30, timeout=60, what="the first process to handle")
                second, third = start("b"), start("c")
                pids = [child.process.pid for child in (first, second, third)]
                wait_until(lambda: balanced(pids, 2), timeout=60, what="3 processes holding 2 buckets each")
                since = len(log_lines(log))
                for pid in pids:
                    wait_until(
                        lambda pid=pid: handled_since(since, pid, 20), timeout=60, what=f"{pid} to handle"
                    )

                killed = second.process.pid
                held_at_kill = {name for name, pid in holders(client, db_name).items() if pid == killed}
                second.kill()
                killed_at = time.monotonic()
                kill_line = len(log_lines(log))
                # The killed process's leases are still live: nobody else writes its buckets'
                # checkpoints until they expire, so these are what it left.
                stored = {name: resume_position(client, db_name, name) for name in held_at_kill}
                survivors = [first.process.pid, third.process.pid]
                wait_until(lambda: balanced(survivors, 3), timeout=60, what="the survivors taking over")
                takeover_seconds = time.monotonic() - killed_at

                spawned = time.monotonic()
                fourth = start("d")
                joined = wait_until(
                    lambda: client[db_name]["_fw_locks"].find_one(
                        {"kind": "member", "ownerToken": {"$regex": f":{fourth.process.pid}:"}}
                    )
                    and time.monotonic(),
                    timeout=60,
                    what="the fourth process's member record",
                )
                live = [*survivors, fourth.process.pid]
                wait_until(lambda: balanced(live, 2), timeout=60, what="the fourth to get its buckets")
                balanced_at = time.monotonic()
                print(
                    f"\ntakeover after SIGKILL (lease_ttl_seconds={LEASE_TTL:g}): {takeover_seconds:.2f} s; "
                    f"join: {joined - spawned:.2f} s from spawn to member record, "
                    f"{balanced_at - joined:.2f} s from member record to holding its 2 buckets"
                )
                since = len(log_lines(log))
                fourth_pid = fourth.process.pid
                wait_until(lambda: handled_since(since, fourth_pid, 20), timeout=60, what="its events")
                final_holders = holders(client, db_name)
                status = json.loads(cli(mongodb_uri, "status", "--database", db_name, "--json"))
                # Each live process's metrics say which buckets it holds, and it is ready (the
                # buckets it stands by for run elsewhere).
                for child in (first, third, fourth):
                    pid = child.process.pid
                    assert leases_held(child) == {n for n, p in final_holders.items() if p == pid}
                    code, body = probe(child, "/readyz")
                    assert code == 200, body
            truth = Truth(read_events(truth_stream, writer.writes), bucket_of)
        # Each bucket handles its events in order: once the last of every bucket was handled, the
        # fleet is done (what it skipped, if anything, the checks below name).
        last = {tokens[-1] for tokens in truth.buckets.values()}
        wait_until(
            lambda: last <= {line[1] for line in log_lines(log)[kill_line:]},
            timeout=60,
            what="the fleet to reach every bucket's last event",
        )
    finally:
        codes: dict[int, int | str] = {}
        for child in children:  # every one, even when another did not stop
            if child.process.pid != killed:
                try:
                    codes[child.process.pid] = child.stop()
                except AssertionError as error:
                    codes[child.process.pid] = str(error)
    assert set(codes.values()) == {0}, "\n".join(child.log.finish() for child in children)

    # Each live process holds 1 or 2 buckets at the end, and `flowwarden status` names the holder
    # of every bucket.
    assert sorted(final_holders) == names
    assert set(Counter(final_holders.values()).values()) <= {1, 2}
    assert set(final_holders.values()) == set(live)
    rows = {row["stream"]: row for row in status}
    for name in names:
        assert rows[name]["leaseHolderToken"] is not None, f"`flowwarden status` names no holder of {name}"
        assert int(rows[name]["leaseHolderToken"].split(":")[1]) == final_holders[name]
        assert rows[name]["leaseHolder"] in {"a", "c", "d"}

    lines = log_lines(log)
    assert {token for _, token, _ in lines} <= set(truth.tokens), "an event handled was never written"
    for stream, token, _ in lines:
        key = truth.key[token]
        assert stream == bucket_of[key], f"an event of document {key} went to {stream}, not {bucket_of[key]}"

    duplicates = 0
    handovers = 0
    for name in names:
        tokens = truth.buckets[name]
        runs = segments(lines, name)
        start_at = 0  # the first process opened the bucket before every event
        end = 0
        taken_over = name not in held_at_kill
        for number, (pid, first_line, run) in enumerate(runs):
            if not taken_over and first_line >= kill_line:
                # The first run after the kill of the bucket's holder: from its stored position.
                taken_over = True
                at = count_through(tokens, stored[name])
                assert at <= end, (
                    f"{name}'s checkpoint after the kill is past #{at}, but the killed process handled "
                    f"only up to #{end}: the taker would lose {end - at} event(s)"
                )
                assert end - at <= SAVE_EVERY_N, (
                    f"{name} repeats {end - at} events after the kill, more than save_every_n={SAVE_EVERY_N}"
                )
                duplicates += end - at
                start_at = at
            elif number > 0:
                handovers += 1
                start_at = end  # a handover: the giver saved all it handled before releasing
            handled = [truth.bucket_index[token] for token in run]
            assert handled == list(range(start_at, start_at + len(handled))), (
                f"{name}'s run #{number} (process {pid}) did not go on from #{start_at} in stream order: "
                f"got {handled[:12]}..."
            )
            end = start_at + len(handled)
        assert end == len(tokens), f"{name} ended at #{end} of {len(tokens)}"
        # After the graceful stops, the bucket's position covers every one of its events.
        assert count_through(tokens, resume_position(client, db_name, name)) == len(tokens)

    counts = Counter(token for _, token, _ in lines)
    assert sum(count - 1 for count in counts.values()) == duplicates, "a duplicate outside an unsaved window"
    assert handovers >= 4, f"only {handovers} handovers between processes that handled events"
    print(f"{len(lines)} handlings of {len(truth.tokens)} events, {duplicates} twice, {handovers} handovers")
