"""DeltaSink: each batch's last change per document MERGEd into a Delta table, exactly once.

The crash tests run tests/sinks/delta_worker.py twice: a first process that SIGKILLs itself
right after a committed write (before its checkpoint moves past the batch), then a second that
runs until the table holds what the collection holds. The table must equal the collection (no
duplicate, no missing key, deletes applied) and every batch must be in exactly one commit: the
batch delivered again after the kill is skipped by the table, not written twice.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bson
import pyarrow as pa
import pytest
from bson import ObjectId

from flowwarden.errors import ConfigurationError
from flowwarden.sinks import DeltaSink
from flowwarden.sinks.delta import BATCH_METADATA, batch_version
from flowwarden.spark import events_to_arrow
from flowwarden.spark.infer import spec_of_documents
from helpers import checkpoint_doc, wait_until

deltalake = pytest.importorskip("deltalake")

WORKER = Path(__file__).with_name("delta_worker.py")


def token(seconds: int, inc: int, extra: int = 0) -> str:
    return f"82{seconds:08X}{inc:08X}{extra:04X}"


def event(data: str, operation: str, key: Any, document: dict[str, Any] | None) -> dict[str, Any]:
    change: dict[str, Any] = {"_id": {"_data": data}, "operationType": operation, "documentKey": {"_id": key}}
    if document is not None:
        change["fullDocument"] = document
    return change


SPEC = spec_of_documents([{"_id": ObjectId(), "qty": 1, "sku": "a"}])


def write(sink: DeltaSink, events: list[dict[str, Any]]) -> bool:
    table = events_to_arrow(events, schema=SPEC, rescued_data=True).table
    return sink.write(table, SimpleNamespace(batch_id=events[0]["_id"]["_data"], stream="orders"))


def rows(uri: str) -> list[dict[str, Any]]:
    table = deltalake.DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted(table, key=lambda row: (str(type(row["_id"])), row["_id"]))


def commits_per_batch(uri: str) -> Counter[str]:
    return Counter(c[BATCH_METADATA] for c in deltalake.DeltaTable(uri).history() if BATCH_METADATA in c)


def test_the_last_change_of_each_document_is_merged_and_a_batch_again_is_skipped(tmp_path: Path) -> None:
    a, b, c = ObjectId(), ObjectId(), ObjectId()
    first = [
        event(token(100, 1), "insert", a, {"_id": a, "qty": 1, "sku": "a"}),
        event(token(100, 2), "insert", b, {"_id": b, "qty": 2, "sku": "b", "new": True}),
        event(token(100, 3), "update", a, {"_id": a, "qty": 5, "sku": "a"}),
    ]
    second = [
        event(token(101, 1), "delete", b, None),
        event(token(101, 2), "insert", c, {"_id": c, "qty": "many", "sku": "c"}),
        event(token(101, 3), "update", a, None),  # its lookup found nothing: left out
    ]
    uri = str(tmp_path / "orders")
    sink = DeltaSink(uri)
    assert write(sink, first) and write(sink, second)
    assert not write(sink, second), "the batch the table has was written again"
    assert not write(sink, first)
    assert rows(uri) == sorted(
        [
            {"_id": str(a), "qty": 5, "sku": "a", "_rescued_data": None},
            {"_id": str(c), "qty": None, "sku": "c", "_rescued_data": '{"full_document":{"qty":"many"}}'},
        ],
        key=lambda row: row["_id"],
    )
    assert commits_per_batch(uri) == {token(100, 1): 1, token(101, 1): 1}
    assert deltalake.DeltaTable(uri).transaction_version("orders") == batch_version(token(101, 1))


def test_batches_that_start_at_one_cluster_time_are_both_applied(tmp_path: Path) -> None:
    # A transaction's events share one cluster time; a batch boundary inside it gives two
    # batches whose first events have the same time: the second is new, not a batch again.
    keys = [ObjectId() for _ in range(3)]
    batches = [
        [event(token(200, 7, i), "insert", keys[i], {"_id": keys[i], "qty": i, "sku": "t"})] for i in range(3)
    ]
    uri = str(tmp_path / "orders")
    sink = DeltaSink(uri)
    assert [write(sink, batch) for batch in batches] == [True, True, True]
    assert [write(sink, batch) for batch in batches] == [False, False, False]
    assert [row["qty"] for row in sorted(rows(uri), key=lambda row: row["qty"])] == [0, 1, 2]


def test_a_write_without_a_batch_context_is_refused(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "t"))
    with pytest.raises(ConfigurationError, match="batch_id"):
        sink.write(pa.table({"a": [1]}), None)
    with pytest.raises(ConfigurationError, match="top-level document field"):
        DeltaSink(str(tmp_path / "t"), key="a.b")


def _worker(uri: str, db: str, table: str, kind: str, kill_at: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), uri, db, table, kind, str(kill_at)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line == "ready", process.stderr.read() if process.stderr else ""


def _documents(client: Any, db: str) -> list[dict[str, Any]]:
    return sorted(client[db].orders.find({}), key=lambda doc: doc["_id"])


def _crash_then_match(mongodb_uri: str, client: Any, db: str, tmp_path: Path, kind: str) -> None:
    orders = client[db].orders
    # Seed documents to sample: the schema is inferred when the stream starts.
    orders.insert_many([{"_id": i, "sku": f"s{i}", "qty": i} for i in range(3)])
    table = str(tmp_path / "orders")
    first = _worker(mongodb_uri, db, table, kind, kill_at=2)
    _wait_ready(first)
    wait_until(lambda: checkpoint_doc(client, db, "orders"), timeout=120, what="the opening position")
    orders.insert_many([{"_id": i, "sku": f"s{i}", "qty": i} for i in range(3, 12)])
    orders.update_many({"_id": {"$lt": 6}}, {"$inc": {"qty": 100}})
    orders.update_one({"_id": 7}, {"$set": {"qty": "seven", "note": "rescued"}})
    orders.delete_many({"_id": {"$in": [1, 4, 9]}})
    assert first.wait(timeout=180) == -signal.SIGKILL, first.stderr.read() if first.stderr else ""
    killed_after = first.stdout.read().split() if first.stdout else []
    assert killed_after, "the first run wrote nothing"
    redelivered = killed_after[-2]  # the batch id of the write the kill followed
    checkpoint = checkpoint_doc(client, db, "orders")
    assert checkpoint is not None and checkpoint.get("batchEndToken") is not None
    orders.insert_one({"_id": 99, "sku": "last", "qty": 1})
    second = _worker(mongodb_uri, db, table, kind, kill_at=0)
    try:
        _wait_ready(second)
        wait_until(lambda: 99 in [r["_id"] for r in rows(table)], timeout=180, what="the last document")
    except AssertionError:
        second.kill()
        raise AssertionError(second.stderr.read() if second.stderr else "") from None
    finally:
        second.send_signal(signal.SIGTERM)
        stopped = second.wait(timeout=120)
    assert stopped == 0, second.stderr.read() if second.stderr else ""
    again = second.stdout.read().split() if second.stdout else []
    # The interrupted batch came again and the table skipped it: one commit per batch.
    assert [again[i + 1] for i in range(0, len(again), 2) if again[i] == redelivered] == ["False"]
    assert set(commits_per_batch(table).values()) == {1}
    # Every document of the collection changed after the stream started (the seeds too), so
    # the table holds them all: no duplicate, none missing, deletes applied.
    expected = {
        doc["_id"]: (doc["sku"], doc["qty"] if isinstance(doc["qty"], int) else None)
        for doc in _documents(client, db)
    }
    got = [(row["_id"], (row["sku"], row["qty"])) for row in rows(table)]
    assert len(got) == len(dict(got))
    assert dict(got) == expected
    # qty "seven" does not fit the pinned BIGINT: rescued. "note" is rescued when the first run
    # wrote doc 7, a column when the restart (whose sample saw it) did: kept either way.
    (seven,) = [row for row in rows(table) if row["_rescued_data"]]
    rescued = bson.json_util.loads(seven["_rescued_data"])["full_document"]
    assert seven["_id"] == 7 and rescued["qty"] == "seven"
    assert rescued.get("note", seven.get("note")) == "rescued"


@pytest.mark.slow
def test_a_kill_between_the_commit_and_the_checkpoint_leaves_the_table_equal_to_the_collection(
    mongodb_uri: str, client: Any, db_name: str, tmp_path: Path
) -> None:
    _crash_then_match(mongodb_uri, client, db_name, tmp_path, "batch")


@pytest.mark.slow
@pytest.mark.spark
def test_dataframe_batches_with_an_inferred_schema_reach_the_table_exactly_once(
    mongodb_uri: str, client: Any, db_name: str, tmp_path: Path
) -> None:
    _crash_then_match(mongodb_uri, client, db_name, tmp_path, "dataframe")
