"""Keep ``shop.orders_view`` in step with ``shop.orders``: one document per order, written so that a
change handled twice, or an older change handled after a newer one, leaves the view as it was.

    FLOWWARDEN_URI="mongodb://mongo:27017/?replicaSet=rs0" \\
        flowwarden run orders_view:OrdersView --metrics-port 9464

(run from this folder, or with it on PYTHONPATH). This is the handler docker-compose.yml's
``connector`` service runs. ``ORDERS_DATABASE`` names the database (default ``shop``) and
``ORDERS_VIEW_URI`` the deployment the view is written to (default: ``FLOWWARDEN_URI``).

flowwarden delivers each change at least once: after a crash, the changes handled since the last
checkpoint save come again. Each view document therefore carries the resume token of the change
that wrote it (``position``; tokens of one stream sort in stream order as strings), and a write
only lands where the stored position is older. Deletes leave a tombstone for the same reason: a
replayed insert must not bring a deleted order back.
"""

from __future__ import annotations

import os
from typing import Any

import pymongo
from pymongo.errors import DuplicateKeyError

from flowwarden import ChangeEvent, change_stream, checkpoint, on_delete, on_insert, on_replace, on_update

DATABASE = os.environ.get("ORDERS_DATABASE", "shop")


@change_stream("orders", DATABASE, full_document="updateLookup")
@checkpoint(save_every_n=100, save_interval_seconds=5)
class OrdersView:
    def __init__(self) -> None:
        uri = os.environ.get("ORDERS_VIEW_URI") or os.environ["FLOWWARDEN_URI"]
        self._view = pymongo.MongoClient(uri, appname="orders-view")[DATABASE]["orders_view"]

    @on_insert
    @on_update
    @on_replace
    def upsert(self, event: ChangeEvent) -> None:
        order = event.full_document
        if order is None:  # deleted before the update was looked up: its delete follows
            return
        self._write(event, {"status": order.get("status"), "amount": order.get("amount"), "deleted": False})

    @on_delete
    def tombstone(self, event: ChangeEvent) -> None:
        self._write(event, {"status": None, "amount": None, "deleted": True})

    def _write(self, event: ChangeEvent, fields: dict[str, Any]) -> None:
        assert event.document_key is not None
        key = event.document_key["_id"]
        position = event.token["_data"]
        try:
            self._view.update_one(
                {"_id": key, "position": {"$lt": position}},
                {"$set": {**fields, "position": position}},
                upsert=True,
            )
        except DuplicateKeyError:
            pass  # the view holds this order at a newer position already: nothing to do
