"""single_leader deployment: one active instance per stream, fenced takeover."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from flowwarden import ChangeEvent, StreamState, change_stream, checkpoint, on_batch, on_change
from helpers import checkpoint_doc, running, wait_until


def leader_handler(db: str, seen: list[tuple[str, int]], instance: str) -> type:
    @change_stream(
        "orders", db, name="orders", deployment="single_leader", lease_ttl_seconds=1.5, max_await_time_ms=50
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Leader:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append((instance, event.document_key["_id"]))

    return Leader


def take_the_lease(locks: Any) -> int:
    """Another instance, "z", takes the orders lease with the next epoch (as after a long pause of
    the holder), for longer than a test needs it; returns that epoch."""
    taken = int(locks.find_one({"_id": "orders"})["epoch"]) + 1
    locks.update_one(
        {"_id": "orders"},
        {
            "$set": {
                "owner": "z",
                "ownerToken": "host-z:1:0000",
                "epoch": taken,
                "expiresAt": datetime.now(timezone.utc) + timedelta(hours=1),
            }
        },
    )
    return taken


def test_one_instance_processes_and_a_standby_takes_over_after_a_graceful_stop(mongodb_uri, client, db_name):
    seen: list[tuple[str, int]] = []
    orders = client[db_name]["orders"]
    with running(mongodb_uri, [leader_handler(db_name, seen, "a")], instance_id="a") as a:
        wait_until(lambda: a.status()["orders"].state == StreamState.RUNNING, what="a leads")
        with running(mongodb_uri, [leader_handler(db_name, seen, "b")], instance_id="b") as b:
            wait_until(lambda: b.status()["orders"].state == StreamState.STANDBY, what="b stands by")
            orders.insert_many([{"_id": i} for i in range(20)])
            wait_until(lambda: ("a", 19) in seen, what="a to handle the 20 events")
            # b never held the lease, so it never read: it stands by having handled nothing.
            assert b.status()["orders"].state == StreamState.STANDBY
            assert b.status()["orders"].events_processed == 0
            assert client[db_name]["_fw_locks"].find_one({"_id": "orders"})["owner"] == "a"
            assert seen == [("a", i) for i in range(20)]
            a.stop()
            wait_until(
                lambda: b.status()["orders"].state == StreamState.RUNNING, timeout=10, what="b takes over"
            )
            orders.insert_many([{"_id": i} for i in range(20, 30)])
            wait_until(lambda: ("b", 29) in seen, what="events after the takeover")
    # b resumed from a's final save: nothing twice (b's events come in order, so any event b
    # handled again would be in the list before its 29), nothing lost.
    assert seen == [("a", i) for i in range(20)] + [("b", i) for i in range(20, 30)]
    lock = client[db_name]["_fw_locks"].find_one({"_id": "orders"})
    assert lock["epoch"] >= 2
    assert checkpoint_doc(client, db_name, "orders")["epoch"] == lock["epoch"]


def test_a_leader_whose_lease_was_taken_is_fenced_and_stands_by(mongodb_uri, client, db_name):
    seen: list[tuple[str, int]] = []
    orders = client[db_name]["orders"]
    with running(mongodb_uri, [leader_handler(db_name, seen, "a")], instance_id="a") as a:
        wait_until(lambda: a.status()["orders"].state == StreamState.RUNNING, what="a leads")
        orders.insert_one({"_id": 0})
        wait_until(lambda: seen, what="the first event")
        wait_until(
            lambda: (checkpoint_doc(client, db_name, "orders") or {}).get("eventsProcessed") == 1,
            what="the first event's checkpoint",
        )
        # Another instance took the stream over (as after a long pause of this one): a newer epoch
        # in the lease and in the checkpoint, and a lease that stays live while this test needs it.
        locks = client[db_name]["_fw_locks"]
        taken = take_the_lease(locks)
        client[db_name]["_fw_checkpoints"].update_one({"_id": "orders"}, {"$set": {"epoch": taken}})
        wait_until(lambda: a.status()["orders"].state == StreamState.STANDBY, what="a to stand by")
        orders.insert_one({"_id": 1})
        # Standing by, a wrote nothing under its old epoch.
        assert checkpoint_doc(client, db_name, "orders")["epoch"] == taken
        assert locks.find_one({"_id": "orders"})["owner"] == "z"
        # "z" goes away: a leads again, from the checkpoint, which is still before 1.
        locks.update_one(
            {"_id": "orders", "owner": "z"},
            {
                "$set": {
                    "owner": None,
                    "ownerToken": None,
                    "expiresAt": datetime.fromtimestamp(0, timezone.utc),
                }
            },
        )
        wait_until(lambda: a.status()["orders"].state == StreamState.RUNNING, what="a to lead again")
        orders.insert_one({"_id": 2})
        wait_until(lambda: ("a", 2) in seen, what="the event written after a leads again")
    # 1 was handled once, after a led again: had a handled it while standing by, its fenced
    # checkpoint could not have moved past it, and it would be in the list twice.
    assert seen == [("a", 0), ("a", 1), ("a", 2)]
    assert locks.find_one({"_id": "orders"})["epoch"] == taken + 1
    assert checkpoint_doc(client, db_name, "orders")["epoch"] == taken + 1


def test_two_connectors_with_one_instance_id_hold_the_lease_one_at_a_time(
    mongodb_uri, client, db_name, caplog
):
    """The lease belongs to a connector, not to its configured name: a second connector with
    the same instance id stands by, says why, and never takes the live lease over."""
    seen: list[tuple[str, int]] = []
    orders = client[db_name]["orders"]
    locks = client[db_name]["_fw_locks"]
    caplog.set_level(logging.INFO, logger="flowwarden")
    with running(mongodb_uri, [leader_handler(db_name, seen, "first")], instance_id="orders-1") as first:
        wait_until(lambda: first.status()["orders"].state == StreamState.RUNNING, what="the first leads")
        second_handler = leader_handler(db_name, seen, "second")
        with running(mongodb_uri, [second_handler], instance_id="orders-1") as second:
            wait_until(
                lambda: second.status()["orders"].state == StreamState.STANDBY, what="the second stands by"
            )
            assert first.instance_token != second.instance_token
            why = second.status()["orders"].reason
            assert why is not None and "same instance id 'orders-1'" in why, why
            warning = wait_until(
                lambda: next(
                    (r.getMessage() for r in caplog.records if "same instance id" in r.getMessage()), None
                ),
                what="the line saying why the second stands by",
            )
            assert "'orders-1'" in warning and "another process" in warning and "holds the lease" in warning
            # Over several renewals (a new expiresAt each, every third of the 1.5 s TTL) and as
            # many attempts of the second to acquire, the lease stays with the first, same epoch.
            lock = locks.find_one({"_id": "orders"})
            epoch, renewals = lock["epoch"], {lock["expiresAt"]}

            def renewed_four_times() -> bool:
                now = locks.find_one({"_id": "orders"})
                assert now["epoch"] == epoch, f"the lease changed hands: epoch {epoch} -> {now['epoch']}"
                renewals.add(now["expiresAt"])
                return len(renewals) >= 5

            wait_until(renewed_four_times, what="four renewals of the first's lease")
            assert lock["owner"] == "orders-1" and lock["ownerToken"] == first.instance_token
            orders.insert_many([{"_id": i} for i in range(20)])
            wait_until(lambda: ("first", 19) in seen, what="the first to handle the 20 events")
            assert second.status()["orders"].state == StreamState.STANDBY
            assert second.status()["orders"].events_processed == 0
            first.stop()
            wait_until(
                lambda: second.status()["orders"].state == StreamState.RUNNING, what="the second takes over"
            )
            assert second.status()["orders"].reason is None
            orders.insert_many([{"_id": i} for i in range(20, 30)])
            wait_until(lambda: ("second", 29) in seen, what="events after the takeover")
    assert seen == [("first", i) for i in range(20)] + [("second", i) for i in range(20, 30)]
    assert locks.find_one({"_id": "orders"})["epoch"] == epoch + 1


def test_a_lease_lost_during_the_initial_snapshot_stands_by_instead_of_stopping(mongodb_uri, client, db_name):
    import threading

    from flowwarden import Snapshot

    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i} for i in range(8)])
    holding, release = threading.Event(), threading.Event()

    @change_stream(
        "orders",
        db_name,
        name="orders",
        deployment="single_leader",
        lease_ttl_seconds=1.5,
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=2,
        max_await_time_ms=50,
    )
    class Copier:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            if event.document_key["_id"] == 3 and not release.is_set():
                holding.set()
                release.wait(30)

    locks = client[db_name]["_fw_locks"]
    with running(mongodb_uri, [Copier]) as connector:
        try:
            assert holding.wait(20), "the copy never reached _id 3"
            # Another instance takes the lease over while the copy runs (as after a long pause).
            lease = locks.find_one({"_id": "orders"})
            later = datetime.now(timezone.utc) + timedelta(hours=1)
            locks.update_one(
                {"_id": "orders"},
                {
                    "$set": {
                        "owner": "b",
                        "ownerToken": "b:1:0",
                        "epoch": lease["epoch"] + 1,
                        "expiresAt": later,
                    }
                },
            )
        finally:
            release.set()
        status = wait_until(
            lambda: (s := connector.status()["orders"]).state == StreamState.STANDBY and s.reason and s,
            what="the stream to stand by, saying why",
        )
    assert "instance 'b'" in status.reason


def test_a_batch_stream_whose_lease_was_taken_stands_by_without_a_restart(mongodb_uri, client, db_name):
    batches: list[list[int]] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        deployment="single_leader",
        lease_ttl_seconds=1.5,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Leader:
        @on_batch(max_events=10, max_wait_seconds=0.1)
        def handle(self, events: list[ChangeEvent]) -> None:
            batches.append([event.document_key["_id"] for event in events])

    with running(mongodb_uri, [Leader], instance_id="a") as a:
        wait_until(lambda: a.status()["orders"].state == StreamState.RUNNING, what="a leads")
        client[db_name]["orders"].insert_one({"_id": 0})
        wait_until(lambda: batches, what="the first batch")
        take_the_lease(client[db_name]["_fw_locks"])
        wait_until(lambda: a.status()["orders"].state == StreamState.STANDBY, what="a to stand by")
        status = a.status()["orders"]
    # Losing the lease is no failure of the stream: it stood by at once, with no error to report.
    assert status.restarts == 0 and status.last_error is None
    assert batches == [[0]]
