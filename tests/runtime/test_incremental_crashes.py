"""An incremental snapshot copied while a writer inserts, updates and deletes, across three kill -9.

A ``flowwarden run`` (tests/runtime/incremental_handlers.py) streams ``orders`` (10,000
documents) while a writer changes them; mid-stream the test requests a snapshot with
``flowwarden snapshot request``, then SIGKILLs the connector three times while the copy runs,
each time in the middle of a chunk's rows, and restarts it. The writer favours the documents of
the chunk being copied (read from the stored progress), so changes keep landing between a
chunk's watermarks. Once the copy is done and the writer stopped, every row the runs delivered
is applied in order (copied rows, inserts, updates and replaces as upserts of their document,
deletes as deletes): that rebuilds the collection exactly. With the watermark rule switched off
in the child (a monkeypatch there, ``FW_TEST_NO_WATERMARK``), the same run rebuilds it wrong: a
copied row read before a change lands after it and brings back the old document.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import json_util

from helpers import checkpoint_doc, complete_lines, flowwarden_command, wait_until

from .conftest import ChildLog, run_connector

DOCUMENTS = 10_000
CHUNK = 250
KILLS = 3
# Rows handed over by each run before the kill: never a multiple of the chunk size, so each kill
# lands in the middle of a chunk's rows.
ROWS_BEFORE_KILL = (610, 1_135, 865)


class _Writer:
    """Inserts, updates and deletes ``orders`` until stopped; half of its writes go to the
    documents of the chunk the stream copies next (after the stored ``lastId``)."""

    def __init__(self, client: pymongo.MongoClient[Any], db: str, seed: int) -> None:
        self._orders = client[db].orders
        self._checkpoints = client[db]["_fw_checkpoints"]
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.writes = 0
        self.error: BaseException | None = None

    def _copying_from(self) -> int | None:
        record = self._checkpoints.find_one({"_id": "orders"}, {"incrementalSnapshot.lastId": 1})
        progress = (record or {}).get("incrementalSnapshot") or {}
        last = progress.get("lastId")
        return last if isinstance(last, int) else (0 if progress else None)

    def _run(self) -> None:
        next_id = DOCUMENTS
        copying_from = None
        try:
            while not self._stop.is_set():
                if self.writes % 25 == 0:
                    copying_from = self._copying_from()
                if copying_from is not None and self._random.random() < 0.5:
                    key = copying_from + 1 + self._random.randrange(CHUNK)
                else:
                    key = self._random.randrange(next_id)
                choice = self._random.random()
                if choice < 0.15:
                    self._orders.insert_one({"_id": next_id, "qty": 0, "by": "writer"})
                    next_id += 1
                elif choice < 0.8:
                    self._orders.update_one({"_id": key}, {"$inc": {"qty": 1}, "$set": {"w": self.writes}})
                elif choice < 0.9:
                    self._orders.replace_one({"_id": key}, {"qty": -1, "replaced": self.writes})
                else:
                    self._orders.delete_one({"_id": key})
                self.writes += 1
                self._stop.wait(0.001)
        except BaseException as error:  # reported by stop()
            self.error = error

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the writer did not stop"
        assert self.error is None, f"the writer failed: {self.error!r}"


def _lines(log: Path) -> list[list[Any]]:
    return [json_util.loads(line) for line in complete_lines(log)]


def _rows(lines: list[list[Any]]) -> int:
    return sum(1 for operation, _, _ in lines if operation == "snapshot")


def _rebuild(lines: list[list[Any]]) -> dict[str, Any]:
    """Every delivered row applied in order: upserts of their document, deletes as deletes."""
    state: dict[str, Any] = {}
    for operation, key, document in lines:
        name = json_util.dumps(key)
        if operation == "delete":
            state.pop(name, None)
        elif operation in ("snapshot", "insert", "update", "replace") and document is not None:
            state[name] = document
    return state


def _progress(client: pymongo.MongoClient[Any], db: str) -> dict[str, Any]:
    record = checkpoint_doc(client, db, "orders") or {}
    progress: dict[str, Any] = record.get("incrementalSnapshot") or {}
    return progress


def _stop(child: Any) -> int:
    child.send_signal(signal.SIGTERM)
    code: int = child.wait(timeout=60)
    return code


def copy_with_kills(
    uri: str,
    client: pymongo.MongoClient[Any],
    db: str,
    log: Path,
    target: str,
    env: dict[str, str],
    writer: _Writer,
    rows_before_kill: Sequence[int],
) -> int:
    """Runs ``flowwarden run`` of ``target`` on ``db``.orders with ``writer`` writing, asks for a
    copy of the collection from the command line, kills the process with SIGKILL after each
    number of ``rows_before_kill`` more copied rows and starts it again, then waits for the copy
    to end and a last insert to arrive, and stops the process. Returns how many kills came while
    the copy ran (the others came after it ended)."""
    child = run_connector(uri, db, log, target, **env)
    children = [child]
    errors = [ChildLog(child.stderr)]
    ChildLog(child.stdout)
    kills_during_copy = 0
    try:
        writer.start()
        wait_until(lambda: _lines(log), timeout=60, what="the stream's first change")
        requested = flowwarden_command("snapshot", "request", "orders", "--database", db, "--uri", uri)
        assert requested.returncode == 0, requested.stderr
        for run, rows in enumerate(rows_before_kill):
            wanted = _rows(_lines(log)) + rows
            wait_until(
                lambda wanted=wanted: _rows(_lines(log)) >= wanted,
                timeout=120,
                what=f"{rows} copied rows in run {run + 1}",
            )
            child.kill()
            assert child.wait(timeout=30) == -signal.SIGKILL, errors[-1].finish()
            kills_during_copy += _progress(client, db).get("state") == "running"
            child = run_connector(uri, db, log, target, **env)
            children.append(child)
            errors.append(ChildLog(child.stderr))
            ChildLog(child.stdout)
        wait_until(
            lambda: _progress(client, db).get("state") == "done",
            timeout=240,
            what=f"the copy to end after restart {len(rows_before_kill)}",
        )
        writer.stop()
        client[db].orders.insert_one({"_id": "end"})
        wait_until(lambda: any(key == "end" for _, key, _ in _lines(log)), timeout=60, what="the last insert")
        assert _stop(child) == 0, errors[-1].finish()
    finally:
        writer.stop()
        for each in children:
            if each.poll() is None:
                each.kill()
                each.wait(30)
    return kills_during_copy


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "watermarks"),
    [("incremental_handlers:Orders", True), ("incremental_handlers:OrdersBatch", True),
     ("incremental_handlers:Orders", False)],
    ids=["per-event", "on_batch", "per-event-without-the-watermark-rule"],
)
def test_three_kills_during_the_copy_still_rebuild_the_collection_exactly(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    tmp_path: Path,
    target: str,
    watermarks: bool,
) -> None:
    orders = client[db_name].orders
    orders.insert_many([{"_id": i, "qty": 0, "sku": f"s{i % 97}"} for i in range(DOCUMENTS)])
    log = tmp_path / "delivered.jsonl"
    env = {
        "FW_TEST_CHUNK": str(CHUNK),
        "FW_TEST_NO_WATERMARK": "0" if watermarks else "1",
        # Each chunk's window held open 50 ms, so the writer surely changes documents within it.
        "FW_TEST_WINDOW_SECONDS": "0.05",
    }
    writer = _Writer(client, db_name, seed=20261126)
    kills_during_copy = copy_with_kills(
        mongodb_uri, client, db_name, log, target, env, writer, ROWS_BEFORE_KILL
    )

    progress = _progress(client, db_name)
    lines = _lines(log)
    assert kills_during_copy == KILLS, "a kill came after the copy ended"
    assert writer.writes > 2_000, f"the writer hardly wrote ({writer.writes} writes)"
    # Each kill hands over again at most the chunk it came in: no more repeated rows than that.
    copied = [json_util.dumps(key) for operation, key, _ in lines if operation == "snapshot"]
    assert len(copied) - len(set(copied)) <= KILLS * CHUNK
    truth = {json_util.dumps(document["_id"]): document for document in orders.find()}
    rebuilt = _rebuild(lines)
    wrong = sorted(key for key in truth.keys() | rebuilt.keys() if truth.get(key) != rebuilt.get(key))
    if watermarks:
        assert progress["dropped"] > 0, "no change came between a chunk's watermarks: the rule was idle"
        assert not wrong, (
            f"{len(wrong)} of {len(truth)} documents rebuilt wrong, e.g. {wrong[:3]}: "
            f"{[(truth.get(key), rebuilt.get(key)) for key in wrong[:3]]}"
        )
    else:
        assert wrong, "without the watermark rule the collection was still rebuilt exactly"
