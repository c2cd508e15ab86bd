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
from pathlib import Path
from typing import Any

import pytest

from flowwarden.events import token_cluster_time

from .conftest import checkpoint_doc, run_connector, wait_until
from .conftest import handled as handled_lines

WORKER = Path(__file__).with_name("worker.py")


def start_worker(uri: str, db: str, log: Path, save_every_n: int, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(WORKER), uri, db, str(log), str(save_every_n), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def handled(log: Path) -> list[int]:
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sigkill_at_random_moments_then_restart_loses_nothing(mongodb_uri, client, db_name, tmp_path):
    save_every_n = 25
    total = 1500
    log = tmp_path / "handled.log"
    orders = client[db_name]["orders"]
    rng = random.Random(20261121)
    # The first run saves its opening position, so events written from now on are all owed.
    worker = start_worker(mongodb_uri, db_name, log, save_every_n)
    wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="initial checkpoint")
    written = 0
    crashes = 0
    lines_before: list[int] = []
    while written < total:
        chunk = min(total - written, rng.randrange(100, 400))
        orders.insert_many([{"_id": written + i} for i in range(chunk)])
        written += chunk
        time.sleep(rng.uniform(0.0, 0.3))
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        crashes += 1
        lines_before.append(len(handled(log)))
        worker = start_worker(mongodb_uri, db_name, log, save_every_n)
    wait_until(lambda: set(handled(log)) >= set(range(total)), timeout=60, what="every event handled")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    counts = Counter(handled(log))
    assert set(counts) == set(range(total)), "an event was never handled"
    redelivered = sum(c - 1 for c in counts.values())
    assert crashes >= 4
    # each crash redelivers at most the unsaved window: save_every_n events
    assert redelivered <= crashes * save_every_n, (redelivered, crashes)


@pytest.mark.slow
def test_sigkill_in_a_first_run_loses_nothing_written_after_the_open(mongodb_uri, client, db_name, tmp_path):
    """`flowwarden run` is killed in its first run, before any save but the opening one, while a
    writer inserts about 100 documents a second; the restart delivers every one written after
    the open."""
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
        time.sleep(random.Random(20261123).uniform(0.3, 1.2))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert checkpoint_doc(client, db_name, "orders")["lastProcessedToken"] is None  # nothing saved since
        restart = run_connector(mongodb_uri, db_name, log)
    finally:
        stop.set()
        writer.join()
    start = token_cluster_time(opened["lastSeenToken"])
    owed = {str(key) for key, at in written if at >= start}
    try:
        wait_until(
            lambda: owed <= set(handled_lines(log)), timeout=60, what="every event written after the open"
        )
    finally:
        restart.send_signal(signal.SIGTERM)
        restart.wait(timeout=30)
    assert len(owed) > 50


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
    orders = client[db_name]["orders"]
    leader = start_worker(mongodb_uri, db_name, log, 1, "single_leader", "a")
    wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=30, what="a leads")
    standby = start_worker(mongodb_uri, db_name, log, 1, "single_leader", "b")
    try:
        orders.insert_many([{"_id": i} for i in range(50)])
        wait_until(lambda: len(handled(log)) >= 50, what="50 events")
        time.sleep(0.5)
        lines = log.read_text().splitlines()
        assert {line.split()[0] for line in lines} == {"a"}, "the standby processed while the leader lived"
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        orders.insert_many([{"_id": i} for i in range(50, 80)])
        wait_until(lambda: set(handled(log)) >= set(range(80)), timeout=30, what="the standby to take over")
        later = [line.split() for line in log.read_text().splitlines()]
        assert {who for who, key in later if int(key) >= 50} == {"b"}
    finally:
        for p in (leader, standby):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
