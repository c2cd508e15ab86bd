"""Batches keyed by ``ctx.batch_id`` stay idempotent across a kill -9 between the method's write
and the checkpoint save: the restart forms the interrupted batch again from the same events.

Each test runs tests/runtime/batch_worker.py twice: a first process that SIGKILLs itself right
after writing one batch, then a second that runs until every event is written. The output keeps
one file per batch id, replaced by a later write under the same id; every event must be in
exactly one file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from helpers import checkpoint_doc, wait_until

from .conftest import ChildLog

WORKER = Path(__file__).with_name("batch_worker.py")


def _worker(
    uri: str, db: str, out: Path, kind: str, max_events: int, max_wait: float, kill_at: int, save_every_n: int
):
    args = [
        sys.executable,
        str(WORKER),
        uri,
        db,
        str(out),
        kind,
        str(max_events),
        str(max_wait),
        str(kill_at),
    ]
    return subprocess.Popen(
        [*args, str(save_every_n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _written(out: Path) -> Counter[Any]:
    ids: Counter[Any] = Counter()
    for part in out.glob("*.json"):
        ids.update(json.loads(part.read_text()))
    return ids


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr.read() if process.stderr else ""


def _crash_then_finish(
    mongodb_uri: str,
    client: Any,
    db_name: str,
    out: Path,
    *,
    kind: str,
    max_events: int,
    max_wait: float,
    kill_at: int,
    save_every_n: int,
    bursts: list[int],
    gap: float,
) -> None:
    out.mkdir()
    orders = client[db_name].orders
    total = sum(bursts)
    first = _worker(mongodb_uri, db_name, out, kind, max_events, max_wait, kill_at, save_every_n)
    _wait_ready(first)
    wait_until(lambda: checkpoint_doc(client, db_name, "orders"), timeout=60, what="the opening position")

    def write() -> None:
        # Each burst after the first waits until the batch before it is written: the batches are
        # cut by time the same way however long the method takes (Spark's first job is slow).
        key = 0
        for index, size in enumerate(bursts):
            if index:
                wait_until(lambda index=index: len(list(out.glob("*.json"))) >= index, timeout=60)
                time.sleep(gap)
            orders.insert_many([{"_id": key + i} for i in range(size)])
            key += size

    writer = threading.Thread(target=write)
    writer.start()
    assert first.wait(timeout=120) == -signal.SIGKILL
    writer.join()
    interrupted = checkpoint_doc(client, db_name, "orders")
    assert interrupted is not None and interrupted.get("batchEndToken") is not None
    # Batches are pipelined (the next one was being read when the kill came), yet the checkpoint
    # counts no event of the batch written last: its method returned, its commit never came.
    on_disk = sum(_written(out).values())
    assert interrupted.get("eventsProcessed", 0) < on_disk
    second = _worker(mongodb_uri, db_name, out, kind, max_events, max_wait, 0, save_every_n)
    try:
        _wait_ready(second)
        batches = ChildLog(second.stdout)
        # The last event is in a batch the restart writes: the first run died before its
        # checkpoint moved past that batch (or before it was written at all).
        wait_until(
            lambda: any(total - 1 in json.loads(line) for line in batches.lines()),
            timeout=120,
            what="the restart to write the batch with the last event",
        )
    finally:
        # A graceful stop hands over what is pending, so a duplicate would be on disk once it exits.
        second.send_signal(signal.SIGTERM)
        stopped = second.wait(timeout=60)
    assert stopped == 0, second.stderr.read() if second.stderr else ""
    written = _written(out)
    assert sorted(written) == list(range(total))
    assert [key for key, times in written.items() if times > 1] == []


@pytest.mark.slow
def test_batches_cut_by_count_come_back_whole_after_a_kill(mongodb_uri, client, db_name, tmp_path):
    # Counts saves every 2 events would store positions inside a 3-event batch if batches
    # were not committed as one; the kill lands after the 2nd batch's write.
    _crash_then_finish(
        mongodb_uri,
        client,
        db_name,
        tmp_path / "out",
        kind="batch",
        max_events=3,
        max_wait=30,
        kill_at=2,
        save_every_n=2,
        bursts=[10],
        gap=0,
    )


@pytest.mark.slow
def test_batches_cut_by_time_come_back_whole_after_a_kill(mongodb_uri, client, db_name, tmp_path):
    # Bursts of 3, 5 and 2 events make three batches by time; the restart finds all 10 waiting,
    # which would make one batch by time, and must form the 3rd one again as it was.
    _crash_then_finish(
        mongodb_uri,
        client,
        db_name,
        tmp_path / "out",
        kind="batch",
        max_events=100,
        max_wait=0.3,
        kill_at=3,
        save_every_n=0,
        bursts=[3, 5, 2],
        gap=0.2,
    )


@pytest.mark.slow
@pytest.mark.spark
def test_dataframe_batches_cut_by_count_come_back_whole_after_a_kill(mongodb_uri, client, db_name, tmp_path):
    _crash_then_finish(
        mongodb_uri,
        client,
        db_name,
        tmp_path / "out",
        kind="dataframe",
        max_events=3,
        max_wait=30,
        kill_at=2,
        save_every_n=2,
        bursts=[10],
        gap=0,
    )


@pytest.mark.slow
@pytest.mark.spark
def test_dataframe_batches_cut_by_time_come_back_whole_after_a_kill(mongodb_uri, client, db_name, tmp_path):
    _crash_then_finish(
        mongodb_uri,
        client,
        db_name,
        tmp_path / "out",
        kind="dataframe",
        max_events=100,
        max_wait=0.3,
        kill_at=3,
        save_every_n=0,
        bursts=[3, 5, 2],
        gap=0.2,
    )
