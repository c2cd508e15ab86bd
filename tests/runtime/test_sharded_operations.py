"""Snapshots on demand and a fleet through the mongos of two shards, from the command line: a
``flowwarden run`` process copies what ``flowwarden snapshot request`` asked for while a writer
changes a collection sharded over both shards, and is killed -9 in the middle of the copy; two
connectors share a partitioned stream's buckets there.

The same features on a replica set: test_incremental_crashes.py and test_fleet.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bson import json_util

from flowwarden import Connector
from helpers import checkpoint_doc, wait_until

from .test_fleet import Handled, fleet_class, running, start
from .test_incremental_crashes import _lines, _rebuild, _Writer, copy_with_kills
from .test_partition_crashes import bucket_names
from .test_sharded import two_shards

DOCUMENTS = 5_000
CHUNK = 250


@pytest.mark.slow
@pytest.mark.embedded_only
def test_a_copy_requested_from_the_command_line_rebuilds_a_collection_sharded_over_two_shards(
    tmp_path: Path,
) -> None:
    with two_shards() as (cluster, mongos):
        orders = mongos.shop.orders
        orders.insert_many([{"_id": i, "qty": 0} for i in range(DOCUMENTS)])
        assert {shard["shard"] for shard in orders.aggregate([{"$collStats": {"count": {}}}])} == {
            "shard0",
            "shard1",
        }, "the documents are not spread over both shards"
        log = tmp_path / "delivered.jsonl"
        # Each chunk's window held open 50 ms: the writer changes documents of the chunk within it,
        # so a copied row handed over after such a change would show in the rebuild.
        env = {"FW_TEST_CHUNK": str(CHUNK), "FW_TEST_WINDOW_SECONDS": "0.05"}
        writer = _Writer(mongos, "shop", seed=20261127)
        kills_during_copy = copy_with_kills(
            cluster.uri, mongos, "shop", log, "incremental_handlers:Orders", env, writer, [610]
        )
        lines = _lines(log)
        truth = {json_util.dumps(document["_id"]): document for document in orders.find()}
    assert kills_during_copy == 1, "the kill came after the copy ended"
    assert writer.writes > 200, f"the writer hardly wrote ({writer.writes} writes)"
    copied = [json_util.dumps(key) for operation, key, _ in lines if operation == "snapshot"]
    assert len(copied) - len(set(copied)) <= CHUNK, "more than the chunk the kill came in was copied twice"
    assert _rebuild(lines) == truth


@pytest.mark.embedded_only
def test_two_connectors_share_the_buckets_of_a_collection_sharded_over_two_shards() -> None:
    connectors: list[Connector] = []
    with two_shards() as (cluster, mongos):
        orders = mongos.shop.orders
        handled: Handled = []
        try:
            first = start(connectors, cluster.uri, fleet_class("shop", "a", handled), "a")
            assert running(first) == bucket_names(2)
            second = start(connectors, cluster.uri, fleet_class("shop", "b", handled), "b")
            wait_until(
                lambda: len(running(first)) == 1 and len(running(second)) == 1,
                what="each connector to run one bucket",
            )
            assert set(running(first) + running(second)) == set(bucket_names(2))
            orders.insert_many([{"_id": key} for key in range(200)])
            orders.update_many({}, {"$set": {"seen": True}})
            wait_until(lambda: len(handled) >= 400, what="400 events handled")
        finally:
            for connector in connectors:
                connector.stop(timeout=30)
        saved = {name: checkpoint_doc(mongos, "shop", name) for name in bucket_names(2)}
    # Every event once, each document's events in order, both connectors at work.
    assert len(handled) == 400
    assert len({token for *_, token in handled}) == 400
    by_key: dict[Any, list[str]] = {}
    for _, _, key, token in handled:
        by_key.setdefault(key, []).append(token)
    assert sorted(by_key) == list(range(200))
    assert all(len(tokens) == 2 and tokens[0] < tokens[1] for tokens in by_key.values())
    assert {tag for tag, *_ in handled} == {"a", "b"}
    assert all(doc is not None and doc["eventsProcessed"] > 0 for doc in saved.values()), saved
