"""single_leader deployment: one active instance per stream, fenced takeover."""

from __future__ import annotations

import time

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
            wait_until(lambda: len(seen) == 20, what="20 events")
            time.sleep(0.3)
            assert {who for who, _ in seen} == {"a"}
            a.stop()
            wait_until(
                lambda: b.status()["orders"].state == StreamState.RUNNING, timeout=10, what="b takes over"
            )
            orders.insert_many([{"_id": i} for i in range(20, 30)])
            wait_until(lambda: len(seen) >= 30, what="events after the takeover")
    assert [k for _, k in seen] == list(range(30))  # no double processing, nothing lost
    assert {who for who, k in seen if k >= 20} == {"b"}
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
        # in the lease and in the checkpoint.
        lock = client[db_name]["_fw_locks"].find_one({"_id": "orders"})
        client[db_name]["_fw_locks"].update_one(
            {"_id": "orders"}, {"$set": {"owner": "z"}, "$inc": {"epoch": 1}}
        )
        client[db_name]["_fw_checkpoints"].update_one(
            {"_id": "orders"}, {"$set": {"epoch": lock["epoch"] + 1}}
        )
        wait_until(lambda: a.status()["orders"].state == StreamState.STANDBY, timeout=5, what="a to stand by")
        orders.insert_one({"_id": 1})
        time.sleep(0.5)
    assert seen == [("a", 0)]
    assert checkpoint_doc(client, db_name, "orders")["epoch"] == lock["epoch"] + 1
