"""The TTL monitor: deletes documents past the expiry of their collection's TTL index.

Like MongoDB's, it runs every ``ttlMonitorSleepSecs`` (the host calls it from its housekeeping),
reads only single-field indexes with ``expireAfterSeconds``, and logs each expired document as an
ordinary delete, so change streams see the deletes as they would on a real server.
"""

from __future__ import annotations

import datetime
from typing import Any

from flowwarden_embedded import crud
from flowwarden_embedded.crud import Scope


def expire_ttl_documents(scope: Scope) -> int:
    """Delete the documents of ``scope``'s catalog past their TTL index's expiry; returns how many."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    removed = 0
    catalog = scope.catalog
    for db in catalog.databases():
        for coll in catalog.collections(db):
            for index in list(coll.indexes.values()):
                seconds = index.spec.get("expireAfterSeconds")
                if seconds is None or len(index.key) != 1:
                    continue
                (path,) = index.key
                cutoff = now - datetime.timedelta(seconds=float(seconds))
                for doc in list(coll.docs.values()):
                    if _expired(doc.get(path) if "." not in path else None, cutoff):
                        try:
                            query = {"_id": doc["_id"]}
                            deleted = crud.delete_statement(scope, db, coll.name, query, limit=1)
                        except crud.TransactionLocked:
                            continue  # an open transaction holds it: a later pass deletes it
                        removed += len(deleted)
    return removed


def _expired(value: Any, cutoff: datetime.datetime) -> bool:
    values = value if isinstance(value, list) else [value]
    dates = [v.replace(tzinfo=None) if v.tzinfo else v for v in values if isinstance(v, datetime.datetime)]
    return bool(dates) and min(dates) <= cutoff
