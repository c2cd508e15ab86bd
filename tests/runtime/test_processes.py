"""Claims about processes, tested on real processes: SIGKILL at random moments, SIGTERM."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from flowwarden.events import token_cluster_time
from helpers import checkpoint_doc, wait_until

from .conftest import ChildLog, run_connector
from .conftest import handled as handled_lines

WORKER = Path(__file__).with_name("worker.py")


def start_worker(
    uri: str, db: str, log: Path, save_every_n: int, *options: str, stderr: int = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """tests/runtime/worker.py in a process of its own; ``options`` as that script takes them."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(WORKER), uri, db, str(log), str(save_every_n), *options],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )


def handled(log: Path) -> list[int]:
    return [int(key) for _, key in handled_by(log)]


def handled_by(log: Path) -> list[tuple[str, int]]:
    """The log's ``(instance, _id)`` lines, in the order they were handled."""
    if not log.exists():
        return []
    return [(who, int(key)) for who, key in (line.split() for line in log.read_text().splitlines() if line)]


def handled_in_round(log: Path, since: int, first: int) -> int:
    """How many events from ``first`` on the worker whose lines start at line ``since`` handled."""
    return sum(key >= first for key in handled(log)[since:])


def states(path: Path) -> list[str]:
    """The states a worker started with ``--states path`` went through."""
    return path.read_text().split() if path.exists() else []


@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_loses_nothing(mongodb_uri, client, db_name, tmp_path):
    """A worker is SIGKILLed again and again while it is in the middle of the events written for
    it: it has handled some of them, not all (its log says so). Each restart goes on from the
    stored checkpoint: nothing is skipped, and what it handles again is at most the save_every_n
    events the killed worker had handled since its last save."""
    save_every_n = 25
    kills_wanted = 5
    log = tmp_path / "handled.log"
    orders = client[db_name]["orders"]
    rng = random.Random(20261121)

    def start() -> subprocess.Popen[str]:
        # 1 ms per event: a round of a few hundred events takes long enough to be killed in.
        return start_worker(mongodb_uri, db_name, log, save_every_n, "--handle-seconds", "0.001")

    worker = start()
    # The first run saves its opening position, so events written from now on are all owed.
    wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="initial checkpoint")
    written = 0
    kills: list[int] = []  # the log's length when each killed worker was gone
    mid_stream: list[tuple[int, int]] = []  # (handled, written) of the round of each mid-stream kill
    try:
        for _ in range(3 * kills_wanted):
            if len(mid_stream) == kills_wanted:
                break
            first, chunk = written, rng.randrange(200, 400)
            orders.insert_many([{"_id": first + i} for i in range(chunk)])
            written += chunk
            since = kills[-1] if kills else 0  # this worker's lines start there
            kill_after = rng.randrange(1, chunk // 2)
            wait_until(
                lambda since=since, first=first, n=kill_after: handled_in_round(log, since, first) >= n,
                what=f"the worker to handle {kill_after} of the {chunk} events of this round",
            )
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills.append(len(handled(log)))
            this_round = handled_in_round(log, since, first)
            if this_round < chunk:  # else it finished the round before the signal landed
                mid_stream.append((this_round, chunk))
            worker = start()
        wait_until(lambda: set(handled(log)) >= set(range(written)), timeout=60, what="every event handled")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    assert code == 0
    assert len(mid_stream) == kills_wanted, f"only {len(mid_stream)} kills landed mid-stream: {mid_stream}"

    lines = handled(log)
    runs = [lines[a:b] for a, b in zip([0, *kills], [*kills, len(lines)], strict=True)]
    for run in runs:  # each worker handles the stream in order, without a gap
        assert run == list(range(run[0], run[0] + len(run))), run
    assert runs[0][0] == 0 and set(lines) == set(range(written)), "an event was never handled"
    # Each restart starts at or before the event after the killed worker's last one (nothing
    # skipped), at most save_every_n events before it (the unsaved window).
    again = [killed[-1] + 1 - restarted[0] for killed, restarted in pairwise(runs)]
    assert all(0 <= n <= save_every_n for n in again), again
    counts = Counter(lines)
    assert sum(c - 1 for c in counts.values()) == sum(again)  # every duplicate is a restart's


@pytest.mark.slow
def test_sigkill_in_a_first_run_loses_nothing_written_after_the_open(mongodb_uri, client, db_name, tmp_path):
    """`flowwarden run` is killed in its first run, after it handled some events but before any
    save but the opening one, while a writer inserts about 100 documents a second; the restart
    delivers every one written after the open, those the killed run handled included."""
    log = tmp_path / "handled.log"
    orders = client[db_name]["orders"]
    written: list[tuple[int, Any]] = []
    stop = threading.Event()

    def write() -> None:
        with client.start_session() as session:
            key = 0
            while not stop.is_set():
                orders.insert_one({"_id": key}, session=session)
                written.append((key, session.operation_time))
                key += 1
                time.sleep(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        child = run_connector(mongodb_uri, db_name, log)  # saves every 1000 events or 60 s
        opened = wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="the open")
        kill_after = random.Random(20261123).randrange(20, 60)
        wait_until(lambda: len(handled_lines(log)) >= kill_after, what=f"{kill_after} events handled")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed_run = len(handled_lines(log))
        stored = checkpoint_doc(client, db_name, "orders")
        assert stored["lastProcessedToken"] is None  # nothing saved since the open
        assert stored["lastSeenToken"] == opened["lastSeenToken"]
        restart = run_connector(mongodb_uri, db_name, log)
    finally:
        stop.set()
        writer.join()
    start = token_cluster_time(opened["lastSeenToken"])
    owed = {str(key) for key, at in written if at >= start}
    try:
        wait_until(
            lambda: owed <= set(handled_lines(log)[killed_run:]),
            timeout=60,
            what="the restart to handle every event written after the open",
        )
    finally:
        restart.send_signal(signal.SIGTERM)
        restart.wait(timeout=30)


def test_sigterm_stops_gracefully_and_flushes(mongodb_uri, client, db_name, tmp_path):
    log = tmp_path / "handled.log"
    worker = start_worker(mongodb_uri, db_name, log, 10_000)
    wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="initial checkpoint")
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(123)])
    wait_until(lambda: len(handled(log)) == 123, what="123 events")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    # save_every_n=10000: only the graceful stop's flush can have saved these
    assert checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 123


@pytest.mark.slow
def test_standby_takes_over_when_the_leader_is_killed(mongodb_uri, client, db_name, tmp_path):
    log = tmp_path / "handled.log"
    b_states = tmp_path / "b.states"
    orders = client[db_name]["orders"]
    leader = start_worker(mongodb_uri, db_name, log, 1, "--single-leader", "a")
    standby = None
    try:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="a leads")
        standby = start_worker(
            mongodb_uri, db_name, log, 1, "--single-leader", "b", "--states", str(b_states)
        )
        wait_until(lambda: "STANDBY" in states(b_states), timeout=30, what="b to stand by")
        orders.insert_many([{"_id": i} for i in range(50)])
        wait_until(lambda: ("a", 49) in handled_by(log), what="a to handle 50 events")
        wait_until(
            lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 50, what="a's saves"
        )
        assert states(b_states)[-1] == "STANDBY" and "RUNNING" not in states(b_states)
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        orders.insert_many([{"_id": i} for i in range(50, 80)])
        wait_until(lambda: ("b", 79) in handled_by(log), timeout=30, what="the standby to take over")
    finally:
        for p in (leader, standby):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    # b handled nothing while a led, then went on from a's last save: b handles in order, so
    # anything it handled twice or before its turn would be in the log before its 79.
    assert handled_by(log) == [("a", i) for i in range(50)] + [("b", i) for i in range(50, 80)]


@pytest.mark.slow
def test_a_process_with_the_leaders_instance_id_stands_by_and_takes_over_when_it_is_killed(
    mongodb_uri, client, db_name, tmp_path
):
    """Two processes configured with one instance id: the second neither takes the live lease
    nor handles anything while the first runs, and says why; SIGKILLed, the first's lease
    expires and the second goes on from its last save."""
    log = tmp_path / "handled.log"
    b_states = tmp_path / "b.states"
    orders = client[db_name]["orders"]
    locks = client[db_name]["_fw_locks"]
    shared_id = ("--instance-id", "orders-1")
    leader = start_worker(mongodb_uri, db_name, log, 1, "--single-leader", "a", *shared_id)
    standby = None
    try:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="a leads")
        standby = start_worker(
            mongodb_uri,
            db_name,
            log,
            1,
            "--single-leader",
            "b",
            *shared_id,
            "--states",
            str(b_states),
            stderr=subprocess.PIPE,
        )
        b_log = ChildLog(standby.stderr)
        wait_until(lambda: "STANDBY" in states(b_states), timeout=30, what="b to stand by")
        b_log.wait_for("another process with the same instance id 'orders-1' holds the lease")
        # While b tries again every third of the 2 s TTL, a renews (a new expiresAt each time)
        # under the epoch it acquired: the lease does not change hands.
        lease = locks.find_one({"_id": "orders"})
        epoch, renewals = lease["epoch"], {lease["expiresAt"]}

        def renewed_four_times() -> bool:
            now = locks.find_one({"_id": "orders"})
            assert now["epoch"] == epoch, f"the lease changed hands: epoch {epoch} -> {now['epoch']}"
            renewals.add(now["expiresAt"])
            return len(renewals) >= 5

        wait_until(renewed_four_times, what="four renewals of a's lease")
        orders.insert_many([{"_id": i} for i in range(50)])
        wait_until(lambda: ("a", 49) in handled_by(log), what="a to handle 50 events")
        wait_until(
            lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 50, what="a's saves"
        )
        assert states(b_states)[-1] == "STANDBY" and "RUNNING" not in states(b_states)
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        orders.insert_many([{"_id": i} for i in range(50, 80)])
        wait_until(lambda: ("b", 79) in handled_by(log), timeout=30, what="b to take over")
    finally:
        for p in (leader, standby):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    # b handled nothing while a led, then went on from a's last save, each event once.
    assert handled_by(log) == [("a", i) for i in range(50)] + [("b", i) for i in range(50, 80)]
    assert locks.find_one({"_id": "orders"})["epoch"] == epoch + 1  # one takeover, by b
