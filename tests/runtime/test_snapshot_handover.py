"""The hand-over from the initial snapshot to the change stream holds across a kill -9 landing on it.

A ``flowwarden run`` (tests/runtime/snapshot_handover_handlers.py) copies 1,500 documents while a
writer inserts, updates and deletes, and SIGKILLs itself at the hand-over: once the copy's end was
saved and before the change stream opens, or as its first or its fourth change is handled.
Restarted, it streams on while the writer goes on. The changes both runs delivered are compared,
event by event, with a plain change stream the test opens right after the snapshot's position T
(read from the stored progress): each of its events up to the last write was delivered, each run
delivered a document's changes in their order, and nothing else was delivered as a change. Events
are told apart by their resume token, so a lost update shows even when its document is updated
again later.

With ``start_position=LATEST`` (a stored position is ignored at process start) the run that
finishes the copy still streams from T: the writes made while it copied arrive as changes.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pymongo
import pytest

from flowwarden import ChangeEvent, Snapshot, StartPosition, change_stream, checkpoint, on_change, on_snapshot
from helpers import checkpoint_doc, running, wait_until

from .conftest import ChildLog, run_connector

TARGET = "snapshot_handover_handlers:Orders"
DOCUMENTS = 1_500

Change = tuple[str, Any, str]
"""(operationType, documentKey._id, resume token _data): one event, told apart from every other."""


class _Writer:
    """Inserts, updates and deletes in ``orders`` until stopped, a write every few milliseconds."""

    def __init__(self, collection: pymongo.collection.Collection[Any], seed: int) -> None:
        self._collection = collection
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.writes = 0

    def _run(self) -> None:
        next_id = DOCUMENTS
        while not self._stop.is_set():
            choice, key = self._random.random(), self._random.randrange(next_id)
            if choice < 0.3:
                self._collection.insert_one({"_id": next_id, "qty": 0})
                next_id += 1
            elif choice < 0.85:
                self._collection.update_one({"_id": key}, {"$inc": {"qty": 1}})
            else:
                self._collection.delete_one({"_id": key})
            self.writes += 1
            self._stop.wait(0.004)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the writer did not stop"


def _lines(log: Path) -> list[list[Any]]:
    """The log's complete lines (a running child may be half-way through writing the last one)."""
    text = log.read_text() if log.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def _changes(lines: list[list[Any]]) -> list[Change]:
    return [(op, key, data) for kind, *rest in lines if kind == "change" for op, key, data in [rest]]


def _truth(collection: pymongo.collection.Collection[Any], after: dict[str, Any]) -> list[Change]:
    """Every change of ``collection`` after ``after`` up to the insert of ``_id`` "end", read by a
    change stream of the test's own."""
    events: list[Change] = []
    deadline = time.monotonic() + 60
    with collection.watch(resume_after=after, max_await_time_ms=100) as stream:
        while not events or events[-1][1] != "end":
            assert time.monotonic() < deadline, f"the test's change stream read {len(events)} events, no end"
            event = stream.try_next()
            if event is not None:
                events.append((event["operationType"], event["documentKey"]["_id"], event["_id"]["_data"]))
    return events


def _out_of_order(run: list[Change], truth: list[Change]) -> list[tuple[Any, list[int]]]:
    """The documents whose changes ``run`` delivered out of their order in ``truth`` (or twice)."""
    position = {change: index for index, change in enumerate(truth)}
    per_key: dict[Any, list[int]] = defaultdict(list)
    for change in run:
        per_key[change[1]].append(position[change])
    return [(key, order) for key, order in per_key.items() if order != sorted(set(order))]


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["done", "change:1", "change:4"])
def test_a_kill_at_the_hand_over_loses_no_change_after_the_snapshot_position(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, tmp_path: Path, kill_at: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(DOCUMENTS)])
    log = tmp_path / "handled.jsonl"
    writer = _Writer(orders, seed=20261201)
    writer.start()
    restart, stopped = None, None
    try:
        first = run_connector(mongodb_uri, db_name, log, TARGET, FW_TEST_KILL_AT=kill_at)
        first_err = ChildLog(first.stderr)
        ChildLog(first.stdout)
        try:
            wait_until(lambda: _lines(log), timeout=60, what="the copy's first row")
            writes_at_copy = writer.writes
            code = first.wait(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(30)
        assert code == -signal.SIGKILL, first_err.finish()
        assert writer.writes - writes_at_copy >= 50, "the writer hardly wrote while the copy ran"

        killed_run = _lines(log)
        stored = checkpoint_doc(client, db_name, "orders")
        assert stored is not None and stored["snapshot"]["done"], "the kill came before the copy's end"
        position = stored["snapshot"]["token"]
        handled_changes = len(_changes(killed_run))
        if kill_at == "done":  # between the copy and the change stream: no change handled yet
            assert handled_changes == 0 and stored["lastProcessedToken"] is None
            assert stored["lastSeenToken"] == position
        else:
            assert handled_changes == int(kill_at.partition(":")[2]) - 1

        restart = run_connector(mongodb_uri, db_name, log, TARGET)
        ChildLog(restart.stdout)
        ChildLog(restart.stderr)
        wait_until(
            lambda: _changes(_lines(log)[len(killed_run) :]), timeout=60, what="the restart's first change"
        )
        # The writer goes on after the restart opened: changes also come after those it owes.
        after_open = writer.writes
        wait_until(lambda: writer.writes >= after_open + 100, timeout=60, what="100 writes after the restart")
        writer.stop()
        orders.insert_one({"_id": "end"})
        wait_until(
            lambda: any(key == "end" for _, key, _ in _changes(_lines(log)[len(killed_run) :])),
            timeout=120,
            what="the restart to deliver the last write",
        )
    finally:
        writer.stop()
        if restart is not None:
            restart.send_signal(signal.SIGTERM)
            stopped = restart.wait(timeout=60)
    assert stopped == 0

    truth = _truth(orders, position)
    runs = [_changes(killed_run), _changes(_lines(log)[len(killed_run) :])]
    delivered = set(runs[0]) | set(runs[1])
    assert {op for op, _, _ in truth} == {"insert", "update", "delete"}
    assert len(truth) > 200, f"only {len(truth)} changes after the snapshot's position"
    missing = [change for change in truth if change not in delivered]
    assert not missing, f"{len(missing)} of {len(truth)} changes after T were never delivered: {missing[:5]}"
    # Nothing before T (those are in the copy) and nothing the server never wrote.
    assert not delivered - set(truth), sorted(delivered - set(truth), key=str)[:5]
    for run in runs:
        assert not _out_of_order(run, truth), _out_of_order(run, truth)[:3]


def test_start_position_latest_streams_the_changes_from_the_snapshot_position(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0} for i in range(20)])
    delivered: list[Change] = []

    @change_stream(
        "orders", db_name, name="orders", snapshot=Snapshot.INITIAL, snapshot_chunk_size=5,
        max_await_time_ms=50,
    )
    @checkpoint(start_position=StartPosition.LATEST, save_every_n=1)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            if event.document_key["_id"] == 0:  # the copy has begun: these are changes after T
                orders.insert_one({"_id": 100, "qty": 0})  # past the copy's bound: a change only
                orders.update_one({"_id": 3}, {"$inc": {"qty": 1}})  # already read with its chunk
                orders.delete_one({"_id": 17})

        @on_change
        def changed(self, event: ChangeEvent) -> None:
            delivered.append((event.operation_type, event.document_key["_id"], event.token["_data"]))

    with running(mongodb_uri, [Orders]):
        wait_until(
            lambda: any(op == "delete" for op, _, _ in delivered),
            what="the changes written while the copy ran",
        )
        orders.insert_one({"_id": "end"})
        wait_until(lambda: any(key == "end" for _, key, _ in delivered), what="the last insert")
    stored = checkpoint_doc(client, db_name, "orders")
    assert stored is not None
    truth = _truth(orders, stored["snapshot"]["token"])
    written = [("insert", 100), ("update", 3), ("delete", 17), ("insert", "end")]
    assert [(op, key) for op, key, _ in truth] == written
    assert delivered == truth
