"""Sessions, multi-document transactions and retryable writes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pymongo
import pytest
from bson import Int64
from pymongo.errors import DuplicateKeyError, ExecutionTimeout, OperationFailure
from wire_helpers import command, connect, new_lsid


def test_transaction_is_invisible_until_commit(
    client: pymongo.MongoClient, db_name: str, mongodb_uri: str
) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": "pre"})
    with pymongo.MongoClient(mongodb_uri) as other:
        other_coll = other[db_name].c
        with client.start_session() as session:
            session.start_transaction()
            coll.insert_one({"_id": "t1"}, session=session)
            coll.update_one({"_id": "pre"}, {"$set": {"touched": True}}, session=session)
            # The transaction reads its own writes...
            assert coll.count_documents({}, session=session) == 2
            assert coll.find_one({"_id": "pre"}, session=session)["touched"] is True
            # ...and nobody else sees them yet.
            assert other_coll.find_one({"_id": "t1"}) is None
            assert "touched" not in other_coll.find_one({"_id": "pre"})
            session.commit_transaction()
        assert other_coll.find_one({"_id": "t1"}) == {"_id": "t1"}
        assert other_coll.find_one({"_id": "pre"})["touched"] is True


def test_aborted_transaction_leaves_nothing(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "v": 1})
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": 2}, session=session)
        coll.delete_one({"_id": 1}, session=session)
        session.abort_transaction()
    assert list(coll.find()) == [{"_id": 1, "v": 1}]


async def test_transaction_commit_and_abort_async(
    async_client: pymongo.AsyncMongoClient, db_name: str
) -> None:
    coll = async_client[db_name].c
    async with async_client.start_session() as session:
        await session.start_transaction()
        await coll.insert_many([{"_id": 1}, {"_id": 2}], session=session)
        assert await coll.count_documents({}) == 0
        await session.commit_transaction()
    assert await coll.count_documents({}) == 2
    async with async_client.start_session() as session:
        await session.start_transaction()
        await coll.delete_many({}, session=session)
        await session.abort_transaction()
    assert await coll.count_documents({}) == 2


def test_with_transaction_commits_once(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": "acct", "balance": 10})
    calls = []

    def transfer(session: pymongo.client_session.ClientSession) -> None:
        calls.append(1)
        coll.update_one({"_id": "acct"}, {"$inc": {"balance": -3}}, session=session)
        coll.insert_one({"_id": "ledger", "amount": 3}, session=session)

    with client.start_session() as session:
        session.with_transaction(transfer)
    assert calls == [1]
    assert coll.find_one({"_id": "acct"})["balance"] == 7
    assert coll.find_one({"_id": "ledger"})["amount"] == 3


def test_transaction_creates_collection_on_commit(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    with client.start_session() as session:
        session.start_transaction()
        db.brand_new.insert_one({"_id": 1}, session=session)
        assert "brand_new" not in db.list_collection_names()
        session.commit_transaction()
    assert db.brand_new.find_one() == {"_id": 1}


def test_write_conflict_between_transactions(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": 1, "v": 0})
    with client.start_session() as first, client.start_session() as second:
        first.start_transaction()
        second.start_transaction()
        coll.update_one({"_id": 1}, {"$set": {"v": 1}}, session=first)
        with pytest.raises(OperationFailure) as info:
            coll.update_one({"_id": 1}, {"$set": {"v": 2}}, session=second)
        assert info.value.code == 112
        assert info.value.has_error_label("TransientTransactionError")
        first.commit_transaction()
        # The failed write aborted the second transaction.
        with pytest.raises(OperationFailure) as aborted:
            second.commit_transaction()
        assert aborted.value.code == 251
    assert coll.find_one({"_id": 1})["v"] == 1


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    """Start ``work`` in a thread; the dict gets its ``result`` or its ``error``."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except Exception as exc:  # handed to the test, which asserts on it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _finished(thread: threading.Thread) -> None:
    thread.join(timeout=30)
    assert not thread.is_alive(), "the plain write was still waiting 30s after the transaction ended"


def test_a_plain_write_waits_for_the_transaction_that_wrote_its_document(
    client: pymongo.MongoClient, db_name: str
) -> None:
    db = client[db_name]
    db.c.insert_one({"_id": 1, "v": 0})
    plain_update = {"q": {"_id": 1}, "u": {"$set": {"v": "plain"}}}
    with client.start_session() as session:
        session.start_transaction()
        db.c.update_one({"_id": 1}, {"$set": {"v": "txn"}}, session=session)
        # The write waits for the transaction instead of failing at once: here, until its
        # maxTimeMS runs out.
        with pytest.raises(ExecutionTimeout) as timed_out:
            db.command("update", "c", updates=[plain_update], maxTimeMS=200)
        assert timed_out.value.code == 50
        assert db.c.find_one({"_id": 1}) == {"_id": 1, "v": 0}
        thread, outcome = _in_thread(lambda: db.c.update_one({"_id": 1}, {"$inc": {"n": 1}}))
        session.commit_transaction()
    _finished(thread)
    # The plain write ran after the commit, on the committed document.
    assert "error" not in outcome
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "v": "txn", "n": 1}


def test_a_plain_insert_runs_after_the_transaction_that_inserted_its_id(
    client: pymongo.MongoClient, db_name: str
) -> None:
    db = client[db_name]
    db.create_collection("c")
    with client.start_session() as session:
        session.start_transaction()
        db.c.insert_one({"_id": 1}, session=session)
        with pytest.raises(ExecutionTimeout):
            db.command("insert", "c", documents=[{"_id": 1, "plain": True}], maxTimeMS=200)
        thread, outcome = _in_thread(lambda: db.c.insert_one({"_id": 1, "plain": True}))
        session.commit_transaction()
    _finished(thread)
    # Serialized after the commit, the insert meets the transaction's document.
    assert isinstance(outcome.get("error"), DuplicateKeyError)
    assert list(db.c.find()) == [{"_id": 1}]

    with client.start_session() as session:
        session.start_transaction()
        db.c.insert_one({"_id": 2}, session=session)
        thread, outcome = _in_thread(lambda: db.c.insert_one({"_id": 2, "plain": True}))
        session.abort_transaction()
    _finished(thread)
    assert "error" not in outcome
    assert list(db.c.find({"_id": 2})) == [{"_id": 2, "plain": True}]


def test_a_transaction_cannot_write_what_a_plain_write_changed_after_its_snapshot(
    client: pymongo.MongoClient, db_name: str
) -> None:
    db = client[db_name]
    db.c.insert_one({"_id": 0})
    with client.start_session() as session:
        session.start_transaction()
        # The transaction's first read fixes its snapshot.
        assert db.c.find_one({"_id": 0}, session=session) == {"_id": 0}
        db.c.insert_one({"_id": 1, "plain": True})
        with pytest.raises(OperationFailure) as info:
            db.c.insert_one({"_id": 1}, session=session)
        assert info.value.code == 112
        assert info.value.has_error_label("TransientTransactionError")
        # The conflict aborted the transaction.
        with pytest.raises(OperationFailure) as aborted:
            session.commit_transaction()
        assert aborted.value.code == 251
    assert list(db.c.find({"_id": 1})) == [{"_id": 1, "plain": True}]


def test_errors_inside_a_transaction(mongodb_uri: str, db_name: str) -> None:
    lsid = new_lsid()
    with connect(mongodb_uri) as sock:
        unknown = command(
            sock, {"find": "c", "lsid": lsid, "txnNumber": Int64(5), "autocommit": False, "$db": db_name}
        )
        assert unknown["ok"] == 0 and unknown["code"] == 251
        assert unknown["codeName"] == "NoSuchTransaction"
        assert "TransientTransactionError" in unknown["errorLabels"]

        started = command(
            sock,
            {
                "insert": "c",
                "documents": [{"_id": 1}],
                "lsid": lsid,
                "txnNumber": Int64(6),
                "startTransaction": True,
                "autocommit": False,
                "$db": db_name,
            },
        )
        assert started["ok"] == 1.0 and started["n"] == 1
        refused = command(
            sock, {"count": "c", "lsid": lsid, "txnNumber": Int64(6), "autocommit": False, "$db": db_name}
        )
        assert refused["ok"] == 0 and refused["code"] == 263
        # The refused command aborted the transaction.
        commit = command(
            sock,
            {
                "commitTransaction": 1,
                "lsid": lsid,
                "txnNumber": Int64(6),
                "autocommit": False,
                "$db": "admin",
            },
        )
        assert commit["ok"] == 0 and commit["code"] == 251
        assert "TransientTransactionError" in commit["errorLabels"]

        command(
            sock,
            {
                "insert": "c",
                "documents": [{"_id": 2}],
                "lsid": lsid,
                "txnNumber": Int64(7),
                "startTransaction": True,
                "autocommit": False,
                "$db": db_name,
            },
        )
        first = command(
            sock,
            {
                "commitTransaction": 1,
                "lsid": lsid,
                "txnNumber": Int64(7),
                "autocommit": False,
                "$db": "admin",
            },
        )
        assert first["ok"] == 1.0
        # A retried commit of a committed transaction succeeds again.
        again = command(
            sock,
            {
                "commitTransaction": 1,
                "lsid": lsid,
                "txnNumber": Int64(7),
                "autocommit": False,
                "$db": "admin",
            },
        )
        assert again["ok"] == 1.0
        abort_late = command(
            sock,
            {"abortTransaction": 1, "lsid": lsid, "txnNumber": Int64(7), "autocommit": False, "$db": "admin"},
        )
        assert abort_late["ok"] == 0 and abort_late["code"] == 256
        older = command(
            sock,
            {
                "find": "c",
                "lsid": lsid,
                "txnNumber": Int64(3),
                "startTransaction": True,
                "autocommit": False,
                "$db": db_name,
            },
        )
        assert older["ok"] == 0 and older["code"] == 225


@pytest.mark.usefixtures("replica_set_member")
def test_transaction_commits_at_one_cluster_time(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    coll.insert_one({"_id": "warmup"})
    newest = client.local["oplog.rs"].find_one(sort=[("$natural", -1)])
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_many([{"_id": i} for i in range(3)], session=session)
        coll.update_one({"_id": "warmup"}, {"$set": {"x": 1}}, session=session)
        session.commit_transaction()
    entries = list(client.local["oplog.rs"].find({"ts": {"$gt": newest["ts"]}}))
    assert len(entries) == 1
    [entry] = entries
    assert entry["op"] == "c" and len(entry["o"]["applyOps"]) == 4
    assert "lsid" in entry and "txnNumber" in entry


def test_retryable_write_is_applied_once(mongodb_uri: str, db_name: str, client: pymongo.MongoClient) -> None:
    lsid = new_lsid()
    insert = {
        "insert": "c",
        "documents": [{"_id": "once"}],
        "lsid": lsid,
        "txnNumber": Int64(1),
        "$db": db_name,
    }
    update = {
        "update": "c",
        "updates": [{"q": {"_id": "once"}, "u": {"$inc": {"n": 1}}}],
        "lsid": lsid,
        "txnNumber": Int64(2),
        "$db": db_name,
    }
    with connect(mongodb_uri) as sock:
        first = command(sock, insert)
        assert first["ok"] == 1.0 and first["n"] == 1
        retried = command(sock, insert)
        assert retried["ok"] == 1.0 and retried["n"] == 1 and "writeErrors" not in retried
        assert command(sock, update)["nModified"] == 1
        assert command(sock, update)["nModified"] == 1
        stale = command(sock, {**insert, "documents": [{"_id": "late"}]})
        assert stale["ok"] == 0 and stale["code"] == 225
    assert list(client[db_name].c.find()) == [{"_id": "once", "n": 1}]


def test_retryable_writes_through_pymongo(client: pymongo.MongoClient, db_name: str) -> None:
    coll = client[db_name].c
    with client.start_session() as session:
        coll.insert_one({"_id": 1}, session=session)
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=session)
        coll.find_one_and_update({"_id": 1}, {"$inc": {"n": 1}}, session=session)
        coll.delete_one({"_id": 1}, session=session)
    assert coll.count_documents({}) == 0
