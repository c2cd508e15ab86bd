"""Database and cluster streams leave out flowwarden's own collections: a stream that saw its own
checkpoint saves would handle each as an event, and save again, without end."""

from __future__ import annotations

from flowwarden import ChangeEvent, change_stream, checkpoint, on_change
from helpers import checkpoint_doc, running, wait_until


def recorder(database: str | None, seen: list[tuple[str, str, str]]) -> type:
    @change_stream(database=database, name="everything", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Everything:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            ns = event.raw.get("ns") or {}
            seen.append((event.operation_type, ns.get("db", ""), ns.get("coll", "")))

    return Everything


def test_a_database_stream_never_sees_its_own_checkpoint_saves(mongodb_uri, client, db_name):
    seen: list[tuple[str, str, str]] = []
    with running(mongodb_uri, [recorder(db_name, seen)]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "everything"), what="its opening position")
        client[db_name].orders.insert_many([{"_id": i} for i in range(3)])
        client[db_name]["_fw_dlq"].insert_one({"note": "written by someone else, still ours"})
        client[db_name].marker.insert_one({"_id": "last"})
        wait_until(lambda: ("insert", db_name, "marker") in seen, what="the marker")
        wait_until(lambda: connector.status()["everything"].events_processed >= 4, what="the count")
        processed = connector.status()["everything"].events_processed
    assert seen == [("insert", db_name, "orders")] * 3 + [("insert", db_name, "marker")]
    assert processed == 4


def test_a_cluster_stream_never_sees_the_checkpoint_database(mongodb_uri, client, db_name):
    seen: list[tuple[str, str, str]] = []
    with running(mongodb_uri, [recorder(None, seen)], checkpoint_database=f"{db_name}_fw") as connector:
        wait_until(lambda: checkpoint_doc(client, f"{db_name}_fw", "everything"), what="its opening position")
        client[db_name].orders.insert_one({"_id": 1})
        client[db_name].marker.insert_one({"_id": "last"})
        wait_until(lambda: ("insert", db_name, "marker") in seen, what="the marker")
        # An event counts once its save (save_every_n=1) is through, just after its method ran.
        wait_until(
            lambda: connector.status()["everything"].events_processed >= len(seen), what="the count"
        )
        processed = connector.status()["everything"].events_processed
    ours = [event for event in seen if event[1] in (db_name, f"{db_name}_fw")]
    assert ours == [("insert", db_name, "orders"), ("insert", db_name, "marker")]
    assert not [event for event in seen if event[2].startswith("_fw_")]
    assert processed == len(seen)
    client.drop_database(f"{db_name}_fw")
