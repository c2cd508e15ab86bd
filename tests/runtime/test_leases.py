"""single_leader deployment: one active instance per stream, fenced takeover."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from flowwarden import ChangeEvent, StreamState, change_stream, checkpoint, on_change

from .conftest import checkpoint_doc, running, wait_until


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
        lock = locks.find_one({"_id": "orders"})
        taken = lock["epoch"] + 1
        locks.update_one(
            {"_id": "orders"},
            {
                "$set": {
                    "owner": "z",
                    "epoch": taken,
                    "expiresAt": datetime.now(timezone.utc) + timedelta(hours=1),
                }
            },
        )
        client[db_name]["_fw_checkpoints"].update_one({"_id": "orders"}, {"$set": {"epoch": taken}})
        wait_until(lambda: a.status()["orders"].state == StreamState.STANDBY, what="a to stand by")
        orders.insert_one({"_id": 1})
        # Standing by, a wrote nothing under its old epoch.
        assert checkpoint_doc(client, db_name, "orders")["epoch"] == taken
        assert locks.find_one({"_id": "orders"})["owner"] == "z"
        # "z" goes away: a leads again, from the checkpoint, which is still before 1.
        locks.update_one(
            {"_id": "orders", "owner": "z"},
            {"$set": {"owner": None, "expiresAt": datetime.fromtimestamp(0, timezone.utc)}},
        )
        wait_until(lambda: a.status()["orders"].state == StreamState.RUNNING, what="a to lead again")
        orders.insert_one({"_id": 2})
        wait_until(lambda: ("a", 2) in seen, what="the event written after a leads again")
    # 1 was handled once, after a led again: had a handled it while standing by, its fenced
    # checkpoint could not have moved past it, and it would be in the list twice.
    assert seen == [("a", 0), ("a", 1), ("a", 2)]
    assert locks.find_one({"_id": "orders"})["epoch"] == taken + 1
    assert checkpoint_doc(client, db_name, "orders")["epoch"] == taken + 1
