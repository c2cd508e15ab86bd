"""The embedded oplog: cluster times, entries, retention, local.oplog.rs documents."""

from __future__ import annotations

import asyncio
import itertools
import time

import bson
import pytest
from bson import Binary, Int64, Timestamp

from flowwarden_embedded.oplog import Oplog, OplogOp
from flowwarden_embedded.tokens import ts_key


def insert(i: int, coll: str = "c", db: str = "db") -> OplogOp:
    return OplogOp("insert", db, coll, {"_id": i}, after={"_id": i, "v": i})


def test_cluster_times_are_strictly_increasing_and_follow_the_wall_clock() -> None:
    oplog = Oplog()
    before = int(time.time())
    stamps = [oplog.append([insert(i)]) for i in range(50)]
    after = int(time.time())
    assert all(ts_key(a) < ts_key(b) for a, b in itertools.pairwise(stamps))
    assert all(before <= ts.time <= after for ts in stamps)
    assert oplog.cluster_time == stamps[-1]


def test_a_transaction_is_one_entry_at_one_cluster_time() -> None:
    oplog = Oplog()
    ts = oplog.append([insert(1), insert(2, coll="d")], lsid={"id": Binary(b"\x01" * 16, 4)}, txn_number=7)
    records, _base = oplog.view()
    assert [(r.ts, r.index, r.count) for r in records] == [(ts, 0, 2), (ts, 1, 2)]
    (entry,) = oplog.oplog_rs_find(-1, 1)
    assert entry["op"] == "c" and entry["ns"] == "admin.$cmd" and entry["txnNumber"] == Int64(7)
    assert [op["ns"] for op in entry["o"]["applyOps"]] == ["db.c", "db.d"]
    assert entry["ts"] == ts


def test_updates_that_change_nothing_are_not_logged() -> None:
    oplog = Oplog()
    first = oplog.append([insert(1)])
    same = OplogOp("update", "db", "c", {"_id": 1}, before={"_id": 1, "v": 1}, after={"_id": 1, "v": 1})
    assert oplog.append([same]) == first
    assert oplog.end_seq == 1


def test_drop_database_drops_each_live_collection_first() -> None:
    oplog = Oplog()
    oplog.append([insert(1, coll="a")])
    oplog.append([insert(1, coll="b")])
    oplog.append([insert(1, coll="x", db="other")])
    oplog.append([OplogOp("drop", "db", "a")])
    oplog.append([OplogOp("dropDatabase", "db", None)])
    records, _ = oplog.view()
    assert [(r.kind, r.db, r.coll) for r in records[3:]] == [
        ("drop", "db", "a"),
        ("drop", "db", "b"),
        ("dropDatabase", "db", None),
    ]
    assert records[-1].uuid is None


def test_collection_uuids_survive_renames_and_change_after_drops() -> None:
    oplog = Oplog()
    oplog.append([insert(1)])
    uuid = oplog.collection_uuid("db", "c")
    oplog.append([OplogOp("rename", "db", "c", to=("db", "d"))])
    assert oplog.collection_uuid("db", "d") == uuid
    oplog.append([OplogOp("drop", "db", "d")])
    oplog.append([insert(2, coll="d")])
    assert oplog.collection_uuid("db", "d") != uuid


def test_uuids_come_from_the_uuid_source_on_first_sight() -> None:
    oplog = Oplog()
    oplog.uuid_source = lambda db, coll: Binary(b"\x09" * 16, 4)
    oplog.append([insert(1)])
    records, _ = oplog.view()
    assert records[0].uuid == b"\x09" * 16


def test_retention_keeps_the_newest_entries() -> None:
    oplog = Oplog(max_events=3)
    stamps = [oplog.append([insert(i)]) for i in range(10)]
    assert [d["ts"] for d in oplog.oplog_rs_find(1, None)] == stamps[-3:]
    assert oplog.oplog_rs_find(1, 1)[0]["ts"] == stamps[-3]
    assert oplog.oplog_rs_find(-1, 1)[0]["ts"] == stamps[-1]
    assert oplog.history_lost_before(ts_key(stamps[-4]))
    assert not oplog.history_lost_before(ts_key(stamps[-3]))
    assert oplog.first_seq == 7 and oplog.end_seq == 10


def test_retention_compacts_a_long_oplog() -> None:
    oplog = Oplog(max_events=5)
    for i in range(20_000):
        oplog.append([insert(i)])
    records, base = oplog.view()
    assert len(records) < 10_000 and base > 0
    assert [r.op.document_key for r in records[oplog.first_seq - base :]] == [
        {"_id": i} for i in range(19_995, 20_000)
    ]
    assert oplog.seek(records[-1].key) == oplog.end_seq - 1


def test_nothing_is_lost_without_retention() -> None:
    oplog = Oplog()
    oplog.append([insert(1)])
    assert not oplog.history_lost_before(0)


def test_max_events_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Oplog(max_events=0)


def test_unknown_operations_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown oplog operation"):
        Oplog().append([OplogOp("upsert", "db", "c")])


def test_oplog_rs_documents_describe_each_write() -> None:
    oplog = Oplog()
    oplog.append([insert(1)])
    oplog.append(
        [OplogOp("update", "db", "c", {"_id": 1}, before={"_id": 1, "v": 1}, after={"_id": 1, "v": 2})]
    )
    oplog.append([OplogOp("replace", "db", "c", {"_id": 1}, before={"_id": 1, "v": 2}, after={"_id": 1})])
    oplog.append([OplogOp("delete", "db", "c", {"_id": 1}, before={"_id": 1})])
    oplog.append([OplogOp("rename", "db", "c", to=("db", "e"))])
    oplog.append([OplogOp("dropDatabase", "db", None)])
    docs = oplog.oplog_rs_find(1, None)
    assert [(d["op"], d["ns"]) for d in docs] == [
        ("i", "db.c"),
        ("u", "db.c"),
        ("u", "db.c"),
        ("d", "db.c"),
        ("c", "db.$cmd"),
        ("c", "db.$cmd"),
        ("c", "db.$cmd"),
    ]
    assert docs[1]["o"] == {"$v": 2, "diff": {"u": {"v": 2}}} and docs[1]["o2"] == {"_id": 1}
    assert docs[2]["o"] == {"_id": 1}
    assert docs[3]["o"] == {"_id": 1}
    assert docs[4]["o"] == {"renameCollection": "db.c", "to": "db.e", "stayTemp": False}
    assert docs[5]["o"] == {"drop": "e"}
    assert docs[6]["o"] == {"dropDatabase": 1} and "ui" not in docs[6]
    assert all(isinstance(d["ui"], Binary) for d in docs[:6])
    assert all({"ts", "t", "v", "wall"} <= d.keys() for d in docs)
    assert [d["ts"] for d in oplog.oplog_rs_find(-1, None)] == [d["ts"] for d in reversed(docs)]


async def test_wait_returns_on_append() -> None:
    oplog = Oplog()
    waiter = asyncio.ensure_future(oplog.wait(30))
    await asyncio.sleep(0)
    assert not waiter.done()
    oplog.append([insert(1)])
    await asyncio.wait_for(waiter, 5)


async def test_wait_returns_after_its_timeout() -> None:
    oplog = Oplog()
    await asyncio.wait_for(oplog.wait(0.01), 5)
    await oplog.wait(0)


def test_seek_finds_positions_inside_a_transaction() -> None:
    oplog = Oplog()
    oplog.append([insert(0)])
    ts = oplog.append([insert(1), insert(2), insert(3)], lsid={"id": 1}, txn_number=1)
    assert oplog.seek(ts_key(ts)) == 1
    assert oplog.seek(ts_key(ts), 2) == 3
    assert oplog.seek(ts_key(ts) + 1) == oplog.end_seq
    assert oplog.seek(0) == 0


def test_timestamps_are_bson_timestamps() -> None:
    oplog = Oplog()
    ts = oplog.append([insert(1)])
    assert isinstance(ts, Timestamp) and ts.inc >= 1


async def test_document_events_are_encoded_in_the_background() -> None:
    oplog = Oplog()
    for i in range(600):
        oplog.append([insert(i)])
    oplog.append([OplogOp("drop", "db", "c")])
    records, _ = oplog.view()
    assert all(r.raw is None for r in records)  # nothing happens inside the writes themselves
    for _ in range(5):
        await asyncio.sleep(0)
    assert all(r.raw is not None for r in records[:600])
    assert records[600].raw is None  # commands are encoded by the streams that show them
    assert bson.decode(records[5].raw.raw)["documentKey"] == {"_id": 5}


def test_a_bare_oplog_encodes_nothing_by_itself() -> None:
    oplog = Oplog()
    oplog.append([insert(1)])
    records, _ = oplog.view()
    assert records[0].raw is None
