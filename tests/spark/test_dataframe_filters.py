"""@on_dataframe streams with an @event_filter, exclude_fields and hash_fields: the DataFrames hold
only the events kept, no excluded field, and hashed values (events are raw BSON there)."""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import pymongo
import pytest
from bson import json_util

import helpers
from flowwarden import ChangeEvent, Connector, Snapshot, change_stream, checkpoint, event_filter, on_dataframe

pytestmark = pytest.mark.spark

# Spark jobs take their time: every wait here allows a minute.
wait_until = functools.partial(helpers.wait_until, timeout=60.0)

SALT = "frames-pepper"
SSN = "SSN-555-12-3456"


def test_dataframes_hold_the_kept_events_without_excluded_and_with_hashed_fields(
    spark: Any,
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FW_FRAMES_SALT", SALT)
    people = client[db_name].people
    people.insert_one({"_id": 0, "ssn": SSN, "email": "zero@example.com"})
    rows: list[dict[str, Any]] = []

    @change_stream(
        "people",
        db_name,
        name="people",
        exclude_fields=["ssn"],
        hash_fields=["email"],
        hash_salt_env="FW_FRAMES_SALT",
        snapshot=Snapshot.INITIAL,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Frames:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return event.document_key["_id"] % 2 == 0

        @on_dataframe(max_events=10, max_wait_seconds=0.2)
        def write(self, df: Any) -> None:
            rows.extend(row.asDict() for row in df.collect())

    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        wait_until(lambda: len(rows) == 1, what="the copied document")
        people.insert_many([{"_id": i, "ssn": SSN, "email": f"{i}@example.com"} for i in range(1, 5)])
        wait_until(lambda: len(rows) == 3, what="the kept inserts")
        status = connector.status()["people"]
    finally:
        connector.stop()
    assert [(row["operation_type"], json_util.loads(row["document_key"])["_id"]) for row in rows] == [
        ("snapshot", 0),
        ("insert", 2),
        ("insert", 4),
    ]
    documents = [json_util.loads(row["full_document"]) for row in rows]
    assert [document.get("email") for document in documents] == [
        hashlib.sha256(SALT.encode() + f"{i}@example.com".encode()).hexdigest() for i in ("zero", 2, 4)
    ]
    assert SSN not in json_util.dumps(rows) and not any("ssn" in document for document in documents)
    assert status.events_filtered == 2
