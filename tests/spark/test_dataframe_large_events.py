"""@on_dataframe with ``split_large_events``: an event over 16 MB, read as raw BSON in fragments,
is one row of the method's DataFrame, positioned at its last fragment's token."""

from __future__ import annotations

import functools
from typing import Any

import pymongo
import pytest
from bson import json_util

import helpers
from flowwarden import Connector, change_stream, checkpoint, on_dataframe

pytestmark = pytest.mark.spark

# Spark jobs take their time: every wait here allows a minute.
wait_until = functools.partial(helpers.wait_until, timeout=60.0)

HALF = 8_400_000
IMAGES: dict[str, Any] = {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"}


def test_a_dataframe_method_gets_a_large_event_as_one_row(
    spark: Any, mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"needs MongoDB 7.0+ ($changeStreamSplitLargeEvent); the deployment runs {found}")
    db = client[db_name]
    db.create_collection("big", changeStreamPreAndPostImages={"enabled": True})
    db.big.insert_one({"_id": 1, "a": "x" * HALF})
    rows: list[Any] = []

    @change_stream("big", db_name, name="big", max_await_time_ms=50, split_large_events=True, **IMAGES)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Frames:
        @on_dataframe(max_events=10, max_wait_seconds=0.2)
        def write(self, df: Any) -> None:
            rows.extend(df.collect())

    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        with db.big.watch([{"$changeStreamSplitLargeEvent": {}}], **IMAGES) as split:
            wait_until(lambda: db["_fw_checkpoints"].find_one({"_id": "big"}), what="the opening position")
            db.big.update_one({"_id": 1}, {"$set": {"b": 1}})
            db.big.insert_one({"_id": 2})
            last = [split.next(), split.next()][-1]["_id"]
        wait_until(lambda: len(rows) >= 2, what="two rows")
        wait_until(
            lambda: (db["_fw_checkpoints"].find_one({"_id": "big"}) or {}).get("eventsProcessed") == 2,
            what="both events checkpointed",
        )
    finally:
        connector.stop(timeout=30)

    assert [(r["operation_type"], json_util.loads(r["document_key"])["_id"]) for r in rows] == [
        ("update", 1),
        ("insert", 2),
    ]
    update = rows[0]
    assert update["_id"] == last["_data"]
    assert json_util.loads(update["full_document"]) == {"_id": 1, "a": "x" * HALF, "b": 1}
    assert json_util.loads(update["full_document_before_change"]) == {"_id": 1, "a": "x" * HALF}
