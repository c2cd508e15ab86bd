"""EmbeddedReplicaSet(topology="sharded", shards=N): N shards, each a replica set member on a port of
its own with its own oplog, retention and cluster time; where the mongos logs each write; what a
shard's own change stream sees; and a mongos stream that loses its history when one shard's oplog
rolls past it.

What a real cluster of two shards must show as well (documents spread by the hash of ``_id``, the
merged order, resuming on every shard, the post-batch resume token) is in
tests/contract/test_sharded.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pymongo
import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure

from flowwarden_embedded import EmbeddedReplicaSet


@pytest.fixture
def two() -> Iterator[EmbeddedReplicaSet]:
    with EmbeddedReplicaSet(topology="sharded", shards=2) as cluster:
        yield cluster


@pytest.fixture
def mongos2(two: EmbeddedReplicaSet) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(two.uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


@pytest.fixture
def shards2(two: EmbeddedReplicaSet) -> Iterator[list[pymongo.MongoClient]]:
    """A client of each shard, connected to it directly, shard0's first."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000))
            for uri in two.shard_uris
        ]


def logged(shard: pymongo.MongoClient, ns: str, op: str = "i") -> list[Any]:
    """The ``_id`` of each ``op`` entry the shard logged on ``ns``, oldest first."""
    return [
        (entry.get("o2") or entry["o"])["_id"] for entry in shard.local["oplog.rs"].find({"ns": ns, "op": op})
    ]


def newest(shard: pymongo.MongoClient) -> dict[str, Any]:
    entry: dict[str, Any] = shard.local["oplog.rs"].find_one({}, sort=[("$natural", -1)])
    return entry


def drain(stream: Any, count: int, what: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(events) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(events)} of the {count} events of {what} came in 20 s")
        event = stream.try_next()
        if event is not None:
            events.append(event)
    return events


def shard_of(mongos: pymongo.MongoClient, ns: str, keys: list[Any], shards: int) -> dict[Any, int]:
    """The shard each ``_id`` belongs to: its share of the range of mongod's hash, read with the
    server's own ``$toHashedIndexKey``."""
    db, _, coll = ns.partition(".")
    hashes = mongos[db][coll].aggregate(
        [{"$match": {"_id": {"$in": keys}}}, {"$project": {"h": {"$toHashedIndexKey": "$_id"}}}]
    )
    return {doc["_id"]: ((doc["h"] + (1 << 63)) * shards) >> 64 for doc in hashes}


def test_shards_are_validated() -> None:
    with pytest.raises(ValueError, match="shards must be an integer of at least 1, got 0"):
        EmbeddedReplicaSet(topology="sharded", shards=0)
    with pytest.raises(ValueError, match="shards is for topology='sharded'"):
        EmbeddedReplicaSet(shards=2)


def test_each_shard_is_a_replica_set_of_its_own_on_a_port_of_its_own() -> None:
    with (
        EmbeddedReplicaSet(topology="sharded", shards=3) as cluster,
        pymongo.MongoClient(cluster.uri) as mongos,
    ):
        names = ["shard0", "shard1", "shard2"]
        assert len(set(cluster.shard_ports)) == 3 and cluster.port not in cluster.shard_ports
        assert cluster.shard_uris == tuple(
            f"mongodb://127.0.0.1:{port}/?replicaSet={name}"
            for port, name in zip(cluster.shard_ports, names, strict=True)
        )
        assert (cluster.shard_port, cluster.shard_uri) == (cluster.shard_ports[0], cluster.shard_uris[0])
        uris = cluster.shard_uris
        assert repr(cluster) == f"EmbeddedReplicaSet(uri={cluster.uri!r}, shard_uris={uris!r}, running)"
        listed = list(mongos.config.shards.find())
        assert [(s["_id"], s["host"]) for s in listed] == [
            (name, f"{name}/127.0.0.1:{port}") for name, port in zip(names, cluster.shard_ports, strict=True)
        ]
        assert [s["_id"] for s in mongos.admin.command("listShards")["shards"]] == names
        for name, uri in zip(names, cluster.shard_uris, strict=True):
            with pymongo.MongoClient(uri) as shard:
                assert shard.admin.command("hello")["setName"] == name
                # A shard's oplog starts with replSetInitiate's no-op, as MongoDB's does.
                first = shard.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
                assert (first["op"], first["o"]) == ("n", {"msg": "initiating set"})


def test_a_restart_keeps_every_port_and_every_shards_oplog(two: EmbeddedReplicaSet) -> None:
    uris = (two.uri, two.shard_uris)
    with pymongo.MongoClient(two.uri, serverSelectionTimeoutMS=20_000) as mongos:
        mongos.admin.command("enableSharding", "a", primaryShard="shard0")
        mongos.admin.command("enableSharding", "b", primaryShard="shard1")
        mongos.a.c.insert_one({"_id": "a"})
        mongos.b.c.insert_one({"_id": "b"})
        two.stop()
        two.start()
        assert (two.uri, two.shard_uris) == uris
        assert mongos.a.c.find_one() == {"_id": "a"}
    for uri, written in zip(two.shard_uris, ("a", "b"), strict=True):
        with pymongo.MongoClient(uri) as shard:
            assert logged(shard, f"{written}.c") == [written]


def test_databases_get_their_primary_shards_in_turn_unless_one_is_named(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    for db in ("first", "second", "third"):
        mongos2[db].c.insert_one({"_id": db})
    mongos2.admin.command("enableSharding", "named", primaryShard="shard1")
    mongos2.named.c.insert_one({"_id": "named"})
    primaries = {doc["_id"]: doc["primary"] for doc in mongos2.config.databases.find()}
    assert primaries == {"first": "shard0", "second": "shard1", "third": "shard0", "named": "shard1"}
    # A database's unsharded collections, and its DDL, are logged on its primary shard only.
    for db, primary in primaries.items():
        for index, shard in enumerate(shards2):
            expected = [db] if f"shard{index}" == primary else []
            assert logged(shard, f"{db}.c") == expected, (db, index)
            creates = list(shard.local["oplog.rs"].find({"ns": f"{db}.$cmd", "o.create": "c"}))
            assert len(creates) == len(expected), (db, index)
    with pytest.raises(OperationFailure) as moved:
        mongos2.admin.command("enableSharding", "first", primaryShard="shard1")
    assert moved.value.code == 48 and "movePrimary" in str(moved.value)
    with pytest.raises(OperationFailure) as unknown:
        mongos2.admin.command("enableSharding", "other", primaryShard="shard7")
    assert unknown.value.code == 70
    with pytest.raises(OperationFailure) as not_admin:
        mongos2.first.command("enableSharding", "first")
    assert not_admin.value.code == 13


def test_a_hashed_collection_is_logged_by_the_shard_its_id_hashes_to(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    reply = mongos2.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    assert reply["collectionsharded"] == "shop.orders"
    [config] = mongos2.config.collections.find()
    assert config["_id"] == "shop.orders" and config["key"] == {"_id": "hashed"}
    assert "_id_hashed" in mongos2.shop.orders.index_information()
    keys = [*range(60), *(f"order-{i}" for i in range(20))]
    mongos2.shop.orders.insert_many([{"_id": key} for key in keys])
    expected = shard_of(mongos2, "shop.orders", keys, 2)
    for index, shard in enumerate(shards2):
        mine = [key for key in keys if expected[key] == index]
        assert mine and logged(shard, "shop.orders") == mine, index
    # Updates and deletes go where the document is, one entry each, even when one command
    # changes documents of both shards.
    mongos2.shop.orders.update_many({"_id": {"$in": list(range(10))}}, {"$set": {"v": 1}})
    mongos2.shop.orders.delete_many({"_id": {"$lt": 5}})
    for index, shard in enumerate(shards2):
        assert logged(shard, "shop.orders", "u") == [k for k in range(10) if expected[k] == index]
        assert logged(shard, "shop.orders", "d") == [k for k in range(5) if expected[k] == index]
    # Sharding it again with the same key is a no-op; any other key is refused.
    mongos2.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    with pytest.raises(OperationFailure) as other_key:
        mongos2.admin.command("shardCollection", "shop.items", key={"sku": 1})
    assert other_key.value.code == 2 and "{_id: 'hashed'} only" in str(other_key.value)


def test_a_dropped_sharded_collection_comes_back_unsharded_on_its_primary(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    mongos2.admin.command("enableSharding", "shop", primaryShard="shard1")
    mongos2.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    mongos2.shop.orders.drop()
    assert list(mongos2.config.collections.find()) == []
    mongos2.shop.orders.insert_many([{"_id": i} for i in range(20)])
    assert (logged(shards2[0], "shop.orders"), logged(shards2[1], "shop.orders")) == ([], list(range(20)))
    mongos2.drop_database("shop")
    assert [doc["_id"] for doc in mongos2.config.databases.find()] == []


def test_an_idle_shard_lags_until_the_mongos_tells_it_the_clusters_time(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    mongos2.admin.command("enableSharding", "busy", primaryShard="shard0")
    idle_entry = newest(shards2[1])
    with mongos2.start_session() as session:
        for i in range(5):
            mongos2.busy.c.insert_one({"_id": i}, session=session)
        written = session.operation_time

    def cluster_time(shard: pymongo.MongoClient) -> Timestamp:
        now: Timestamp = shard.admin.command("ping")["operationTime"]
        return now

    assert cluster_time(shards2[0]) == written == newest(shards2[0])["ts"]
    assert cluster_time(shards2[1]) < written
    # A change stream through the mongos reads every shard: the idle one is told the time (what
    # its periodic no-op writer does on a real cluster), and logs nothing for it.
    with mongos2.busy.c.watch(max_await_time_ms=50) as stream:
        stream.try_next()
    assert cluster_time(shards2[1]) >= written
    assert newest(shards2[1]) == idle_entry
    # The mongos's own cluster time is the newest of its shards'.
    assert mongos2.admin.command("ping")["operationTime"] == max(map(cluster_time, shards2))


def test_a_write_after_another_is_logged_after_it_whatever_the_shards(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    mongos2.admin.command("enableSharding", "a", primaryShard="shard0")
    mongos2.admin.command("enableSharding", "b", primaryShard="shard1")
    with mongos2.start_session() as session:
        stamps = []
        for i in range(30):
            mongos2["ab"[i % 2]].c.insert_one({"_id": i}, session=session)
            stamps.append(session.operation_time)
    assert stamps == sorted(stamps) and len(set(stamps)) == 30
    entries = [
        (entry["ts"], entry["o"]["_id"])
        for db, shard in zip("ab", shards2, strict=True)
        for entry in shard.local["oplog.rs"].find({"ns": f"{db}.c", "op": "i"})
    ]
    assert [key for _, key in sorted(entries)] == list(range(30))


def test_events_of_one_cluster_time_on_two_shards_come_in_resume_token_order(
    mongos2: pymongo.MongoClient,
) -> None:
    """One insert_many through the mongos is a sub-batch per shard, each stamped by its shard from
    the same cluster time: events of the two shards share cluster times, and the mongos orders
    them by their tokens (here, their document keys)."""
    mongos2.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    with mongos2.shop.orders.watch() as stream:
        mongos2.shop.orders.insert_many([{"_id": i} for i in range(40)])
        events = drain(stream, 40, "the inserts")
    times = [event["clusterTime"] for event in events]
    shared = {t for t in times if times.count(t) > 1}
    assert shared, "no two shards logged an insert at one cluster time"
    for moment in shared:
        tied = [event for event in events if event["clusterTime"] == moment]
        keys = [event["documentKey"]["_id"] for event in tied]
        tokens = [event["_id"]["_data"] for event in tied]
        assert keys == sorted(keys) and tokens == sorted(tokens)


def test_a_transaction_on_two_shards_is_logged_on_each_at_one_commit_time(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    mongos2.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    mongos2.shop.orders.insert_one({"_id": "seed"})
    with mongos2.shop.orders.watch() as stream:
        with mongos2.start_session() as session, session.start_transaction():
            mongos2.shop.orders.insert_many([{"_id": i} for i in range(8)], session=session)
        events = drain(stream, 8, "the transaction")
    applied = [shard.local["oplog.rs"].find_one({"o.applyOps": {"$exists": True}}) for shard in shards2]
    assert all(applied) and applied[0]["ts"] == applied[1]["ts"]
    expected = shard_of(mongos2, "shop.orders", list(range(8)), 2)
    for index, entry in enumerate(applied):
        mine = [k for k in range(8) if expected[k] == index]
        assert [op["o"]["_id"] for op in entry["o"]["applyOps"]] == mine
    assert {event["clusterTime"] for event in events} == {applied[0]["ts"]}
    assert {event["txnNumber"] for event in events} == {applied[0]["txnNumber"]}
    tokens = [event["_id"]["_data"] for event in events]
    assert tokens == sorted(tokens)


def test_a_shard_stream_sees_that_shards_events_and_the_mongos_stream_all(
    mongos2: pymongo.MongoClient, shards2: list[pymongo.MongoClient]
) -> None:
    mongos2.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    with ExitStack() as stack:
        streams = [stack.enter_context(shard.shop.orders.watch(max_await_time_ms=50)) for shard in shards2]
        routed = stack.enter_context(mongos2.shop.orders.watch(max_await_time_ms=50))
        mongos2.shop.orders.insert_many([{"_id": i} for i in range(30)])
        # A write sent to a shard directly is logged by that shard, wherever its document belongs.
        shards2[1].shop.orders.insert_one({"_id": "direct"})
        expected = shard_of(mongos2, "shop.orders", list(range(30)), 2)
        for index, stream in enumerate(streams):
            mine = [k for k in range(30) if expected[k] == index] + (["direct"] if index == 1 else [])
            got = [event["documentKey"]["_id"] for event in drain(stream, len(mine), f"shard{index}")]
            assert got == mine, index
            assert stream.try_next() is None
        everything = [event["documentKey"]["_id"] for event in drain(routed, 31, "the mongos stream")]
        assert sorted(everything[:30]) == list(range(30)) and everything[30] == "direct"


def test_a_stream_through_the_mongos_loses_its_history_when_one_shard_rolls_past_it() -> None:
    with (
        EmbeddedReplicaSet(topology="sharded", shards=2, oplog_max_events=20) as cluster,
        pymongo.MongoClient(cluster.uri) as mongos,
    ):
        mongos.admin.command("enableSharding", "shop", primaryShard="shard1")
        mongos.admin.command("enableSharding", "fill", primaryShard="shard0")
        mongos.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
        with mongos.shop.orders.watch() as stream:
            mongos.shop.orders.insert_many([{"_id": i} for i in range(6)])
            first = drain(stream, 6, "the inserts")[0]["_id"]
        # Shard1 kept everything; shard0 drops its part of the stream's history.
        mongos.fill.c.insert_many([{"_id": i} for i in range(25)])
        with pytest.raises(OperationFailure) as at_open:
            mongos.shop.orders.watch(resume_after=first)
        assert at_open.value.code == 286
        assert at_open.value.details["codeName"] == "ChangeStreamHistoryLost"
        # A stream that falls behind one shard's retention loses it at its next getMore.
        with mongos.shop.orders.watch(max_await_time_ms=50) as stream:
            mongos.fill.c.insert_many([{"_id": i} for i in range(25, 50)])
            with pytest.raises(OperationFailure) as at_get_more:
                stream.try_next()
        assert at_get_more.value.code == 286
