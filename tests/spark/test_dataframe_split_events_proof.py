"""An event over 32 MB, split into three fragments, is one whole row: through an ``@on_dataframe``
method (the connector reads it as ``RawEvent`` fragments and joins their bytes) and through the
Spark source's reader (``split_large_events``, a PyMongo stream of ``RawEvent``).

The event is an update, watched with its pre-image and looked-up post-image, that removes a field
of :data:`SIZE` characters and sets another of that size: ``fullDocumentBeforeChange``,
``fullDocument`` and ``updateDescription`` each hold one, so each goes in a fragment of its own.
Each row is compared column by column with the documents written and the update, so a join that
loses the middle fragment fails. tests/runtime/test_split_events_proof.py holds the same claims
for the decoded path and for events cut into more fragments.
"""

from __future__ import annotations

import functools
import random
import time
from typing import Any

import pyarrow as pa
import pymongo
import pytest
from bson import json_util
from pymongo.collection import Collection
from pyspark.sql.streaming.datasource import ReadMaxRows

import helpers
from flowwarden import Connector, change_stream, checkpoint, on_dataframe
from flowwarden.spark import change_event_struct_type
from flowwarden.spark.source.parsing import parse_source_options
from flowwarden.spark.source.reader import FlowWardenStreamReader

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MiB = 1024 * 1024
SIZE = 11_500_000  # three fields of it: an event over 32 MiB, one field per fragment
IMAGES: dict[str, Any] = {"full_document": "updateLookup", "full_document_before_change": "required"}
SPLIT = [{"$changeStreamSplitLargeEvent": {}}]


def text(seed: int, size: int) -> str:
    """``size`` characters no other seed gives: a join that swaps, cuts or repeats a field shows."""
    return random.Random(seed).randbytes(size // 2).hex()


# Spark jobs on events this large take their time: every wait here allows two minutes.
wait_until = functools.partial(helpers.wait_until, timeout=120.0)


@pytest.fixture
def huge(client: pymongo.MongoClient[Any], db_name: str) -> Collection[Any]:
    """``orders``, recording pre-images, holding ``{_id: 1, a: <SIZE characters>}``."""
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"needs MongoDB 7.0+ ($changeStreamSplitLargeEvent); the deployment runs {found}")
    db = client[db_name]
    db.create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    db.orders.insert_one({"_id": 1, "a": text(1, SIZE)})
    return db.orders


def update_and_insert(orders: Collection[Any]) -> list[dict[str, Any]]:
    """Make the large update, then an insert; the update's fragments as the server sends them."""
    with orders.watch(SPLIT, **IMAGES) as split:
        orders.update_one({"_id": 1}, {"$unset": {"a": ""}, "$set": {"b": text(2, SIZE)}})
        orders.insert_one({"_id": 2})
        fragments = [split.next()]
        while fragments[-1]["splitEvent"]["fragment"] < fragments[-1]["splitEvent"]["of"]:
            fragments.append(split.next())
    return fragments


def assert_the_update_row(rows: list[Any], fragments: list[dict[str, Any]]) -> None:
    """The rows are the update then the insert; the update's row holds every fragment's part."""
    assert [f["splitEvent"] for f in fragments] == [{"fragment": n, "of": 3} for n in (1, 2, 3)]
    assert [(r["operation_type"], json_util.loads(r["document_key"])["_id"]) for r in rows] == [
        ("update", 1),
        ("insert", 2),
    ]
    update = rows[0]
    assert update["_id"] == fragments[-1]["_id"]["_data"]  # the last fragment's token
    columns = ["full_document_before_change", "full_document", "updated_fields"]
    assert [column for column in columns if update[column] is None] == [], "a fragment's fields are lost"
    assert json_util.loads(update["full_document_before_change"]) == {"_id": 1, "a": text(1, SIZE)}
    assert json_util.loads(update["full_document"]) == {"_id": 1, "b": text(2, SIZE)}
    assert json_util.loads(update["updated_fields"]) == {"b": text(2, SIZE)}
    assert list(update["removed_fields"]) == ["a"]
    assert sum(len(update[column]) for column in columns) > 32 * MiB


def test_a_dataframe_method_gets_an_event_of_three_fragments_over_32_mb_as_one_row(
    spark: Any, mongodb_uri: str, huge: Collection[Any], db_name: str
) -> None:
    rows: list[Any] = []

    @change_stream("orders", db_name, name="huge", max_await_time_ms=50, split_large_events=True, **IMAGES)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Frames:
        @on_dataframe(max_events=10, max_wait_seconds=0.2)
        def write(self, df: Any) -> None:
            rows.extend(df.collect())

    connector = Connector(mongodb_uri, [Frames], spark=spark)
    connector.start()
    try:
        checkpoints = huge.database["_fw_checkpoints"]
        wait_until(lambda: checkpoints.find_one({"_id": "huge"}), what="the opening position")
        fragments = update_and_insert(huge)
        wait_until(lambda: len(rows) >= 2, what="two rows")
        wait_until(
            lambda: (checkpoints.find_one({"_id": "huge"}) or {}).get("eventsProcessed") == 2,
            what="both events checkpointed",
        )
    finally:
        connector.stop(timeout=60)
    assert connector.stream_errors() == {}
    assert_the_update_row(rows, fragments)


def test_the_spark_source_reads_an_event_of_three_fragments_over_32_mb_as_one_row(
    mongodb_uri: str, huge: Collection[Any], db_name: str
) -> None:
    options = {"uri": mongodb_uri, "database": db_name, "collection": "orders", "split_large_events": "true"}
    reader = FlowWardenStreamReader(parse_source_options({**options, **IMAGES}), change_event_struct_type())
    rows: list[dict[str, Any]] = []
    try:
        offset = reader.initialOffset()
        fragments = update_and_insert(huge)
        deadline = time.monotonic() + 120
        while len(rows) < 2:
            assert time.monotonic() < deadline, f"timed out waiting for two rows, got {len(rows)}"
            end = reader.latestOffset(offset, ReadMaxRows(10))
            for part in reader.partitions(offset, end):
                batches = list(reader.read(part))
                rows += pa.Table.from_batches(batches).to_pylist() if batches else []
            offset = end
    finally:
        reader.stop()
    assert_the_update_row(rows, fragments)
