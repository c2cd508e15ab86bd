"""examples/orders_view.py (the handler docker-compose.yml's connector runs): the view follows
the orders, and handling every change a second time leaves it as it was."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from helpers import checkpoint_doc, running, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def orders_view(monkeypatch, mongodb_uri, db_name):
    monkeypatch.setenv("FLOWWARDEN_URI", mongodb_uri)
    monkeypatch.setenv("ORDERS_DATABASE", db_name)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("orders_view", None)  # its database is read from the environment on import
    yield importlib.import_module("orders_view").OrdersView
    sys.modules.pop("orders_view", None)


def test_the_view_follows_the_orders_and_a_replay_changes_nothing(orders_view, mongodb_uri, client, db_name):
    orders, view = client[db_name].orders, client[db_name].orders_view
    with running(mongodb_uri, [orders_view]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "OrdersView"), what="the opening position")
        opening = checkpoint_doc(client, db_name, "OrdersView")
        orders.insert_many([{"_id": i, "status": "new", "amount": 10 * i} for i in range(5)])
        orders.update_one({"_id": 1}, {"$set": {"status": "paid"}})
        orders.replace_one({"_id": 2}, {"status": "void", "amount": 0})
        orders.delete_one({"_id": 3})
        orders.insert_one({"_id": 3, "status": "new", "amount": 35})  # the same key, a new order
        orders.delete_one({"_id": 4})
        wait_until(lambda: connector.status()["OrdersView"].events_processed == 10, what="ten changes")
    expected = {
        0: ("new", 0, False),
        1: ("paid", 10, False),
        2: ("void", 0, False),
        3: ("new", 35, False),
        4: (None, None, True),
    }

    def current() -> dict[int, tuple[object, object, bool]]:
        return {d["_id"]: (d["status"], d["amount"], d["deleted"]) for d in view.find()}

    assert current() == expected
    settled = list(view.find())
    # Put the checkpoint back where the stream opened: every change comes a second time.
    client[db_name]["_fw_checkpoints"].replace_one({"_id": "OrdersView"}, opening)
    with running(mongodb_uri, [orders_view]) as connector:
        wait_until(lambda: connector.status()["OrdersView"].events_processed == 10, what="the replay")
    assert list(view.find()) == settled


def test_an_older_change_never_overwrites_a_newer_one(orders_view, client, db_name):
    from flowwarden import ChangeEvent

    orders, view = client[db_name].orders, client[db_name].orders_view
    with orders.watch(full_document="updateLookup") as stream:
        orders.insert_one({"_id": 1, "status": "new", "amount": 5})
        orders.update_one({"_id": 1}, {"$set": {"status": "paid"}})
        orders.delete_one({"_id": 1})
        events = [ChangeEvent(stream.next()) for _ in range(3)]
    handler = orders_view()
    for event in reversed(events):  # newest first: each older one finds a newer position stored
        (handler.tombstone if event.operation_type == "delete" else handler.upsert)(event)
    (only,) = view.find()
    assert only["deleted"] is True and only["position"] == events[-1].token["_data"]
