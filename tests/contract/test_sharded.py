"""A mongos as clients see it: its hello, the topology drivers make of it, what it refuses, the
shards it lists, which a client can reach directly to read their oplogs, and a collection sharded
over two shards: where its writes are logged, and the one change stream the mongos merges from the
shards' (in resume-token order, resumable from any shard's event, with a post-batch resume token
no shard is behind).

These run against the embedded sharded cluster (two shards), or against
FLOWWARDEN_TEST_MONGODB_URI when that names a mongos (docker-compose.yml's ``sharded`` profile: two
shards); the tests of a collection sharded over two shards skip on a cluster of one. The
change-stream, resume-token and CRUD contracts run through the mongos too (``through_mongos``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from bson import ObjectId, Timestamp
from pymongo.collection import Collection
from pymongo.errors import OperationFailure

from flowwarden.events import token_cluster_time
from flowwarden.mongo.positions import oplog_edge

REPLICA_SET_FIELDS = (
    "setName",
    "setVersion",
    "hosts",
    "primary",
    "me",
    "electionId",
    "lastWrite",
    "secondary",
)


@pytest.fixture
def shards(mongos: pymongo.MongoClient) -> Iterator[list[tuple[dict[str, Any], pymongo.MongoClient]]]:
    """Every shard ``config.shards`` lists, with a client connected to it directly."""
    listed = list(mongos.config.shards.find())
    clients = []
    for shard in listed:
        set_name, _, seeds = shard["host"].rpartition("/")
        clients.append(
            pymongo.MongoClient(f"mongodb://{seeds}/?replicaSet={set_name}", serverSelectionTimeoutMS=10_000)
        )
    try:
        yield list(zip(listed, clients, strict=True))
    finally:
        for client in clients:
            client.close()


@pytest.fixture
def two_shards(
    shards: list[tuple[dict[str, Any], pymongo.MongoClient]],
) -> list[tuple[dict[str, Any], pymongo.MongoClient]]:
    if len(shards) < 2:
        pytest.skip(f"needs a sharded cluster of two shards or more; the one tested has {len(shards)}")
    return shards


@pytest.fixture
def hashed(mongos: pymongo.MongoClient, two_shards: object, db_name: str) -> Collection:
    """``<db_name>.orders``, sharded by ``{_id: "hashed"}`` over every shard."""
    mongos.admin.command("shardCollection", f"{db_name}.orders", key={"_id": "hashed"})
    return mongos[db_name].orders


def logged(shard: pymongo.MongoClient, ns: str) -> list[dict[str, Any]]:
    """The shard's oplog entries of the document writes on ``ns``, oldest first."""
    return list(shard.local["oplog.rs"].find({"ns": ns, "op": {"$in": ["i", "u", "d"]}}))


def drain(stream: Any, count: int, what: str) -> list[dict[str, Any]]:
    """The next ``count`` events of ``stream``; fails naming ``what`` if they do not come in 30 s
    (a real cluster's idle shard moves on every periodicNoopIntervalSecs, 10 s by default)."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(events) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(events)} of the {count} events of {what} came in 30 s")
        event = stream.try_next()
        if event is not None:
            events.append(event)
    return events


def test_hello_says_isdbgrid_and_names_no_replica_set(mongos: pymongo.MongoClient) -> None:
    hello = mongos.admin.command("hello", helloOk=True)
    assert hello["msg"] == "isdbgrid"
    assert hello["isWritablePrimary"] is True and hello["helloOk"] is True
    assert not [field for field in REPLICA_SET_FIELDS if field in hello]
    assert isinstance(hello["topologyVersion"]["processId"], ObjectId) and hello["maxWireVersion"] >= 21
    legacy = mongos.admin.command("isMaster")
    assert legacy["ismaster"] is True and legacy["msg"] == "isdbgrid" and "isWritablePrimary" not in legacy


def test_pymongo_sees_a_sharded_topology_of_mongos_servers(mongos: pymongo.MongoClient) -> None:
    mongos.admin.command("ping")
    description = mongos.topology_description
    assert description.topology_type_name == "Sharded"
    assert {server.server_type_name for server in description.server_descriptions().values()} == {"Mongos"}


@pytest.mark.parametrize(
    "command",
    [
        {"find": "oplog.rs", "filter": {}},
        {"listCollections": 1},
        {"aggregate": "oplog.rs", "pipeline": [], "cursor": {}},
    ],
)
def test_the_local_database_is_refused(mongos: pymongo.MongoClient, command: dict[str, Any]) -> None:
    with pytest.raises(OperationFailure) as refused:
        mongos.local.command(command)
    assert refused.value.code == 20
    assert refused.value.details["codeName"] == "IllegalOperation"
    assert refused.value.details["errmsg"] == "Can't use 'local' database through mongos"


def test_replica_set_status_is_not_served_through_mongos(mongos: pymongo.MongoClient) -> None:
    with pytest.raises(OperationFailure) as refused:
        mongos.admin.command("replSetGetStatus")
    assert refused.value.details["errmsg"] == "replSetGetStatus is not supported through mongos"
    assert refused.value.details["info"] == "mongos"


def test_write_replies_carry_no_replica_set_op_time(mongos: pymongo.MongoClient, db_name: str) -> None:
    """A mongos builds its own reply from the shards': n, errors, upserts, never a member's
    opTime or electionId."""
    reply = mongos[db_name].command("insert", "c", documents=[{"_id": 1}])
    assert reply["n"] == 1 and "opTime" not in reply and "electionId" not in reply
    assert isinstance(reply["operationTime"], Timestamp)


def test_config_shards_lists_shards_a_client_can_connect_to(
    shards: list[tuple[dict[str, Any], pymongo.MongoClient]],
) -> None:
    assert shards
    for shard, client in shards:
        assert shard["state"] == 1
        set_name = shard["host"].partition("/")[0]
        hello = client.admin.command("hello")
        assert hello["setName"] == set_name and "msg" not in hello
        newest = client.local["oplog.rs"].find_one({}, sort=[("$natural", -1)])
        assert isinstance(newest["ts"], Timestamp)


def test_list_shards_answers_what_config_shards_holds(mongos: pymongo.MongoClient) -> None:
    listed = mongos.admin.command("listShards")["shards"]
    held = list(mongos.config.shards.find())
    assert [(s["_id"], s["host"]) for s in listed] == [(s["_id"], s["host"]) for s in held]


def test_a_write_through_mongos_is_in_a_shard_oplog(
    mongos: pymongo.MongoClient, shards: list[tuple[dict[str, Any], pymongo.MongoClient]], db_name: str
) -> None:
    with mongos.start_session() as session:
        mongos[db_name].c.insert_one({"_id": "routed"}, session=session)
        written = session.operation_time
    found = [
        entry
        for _, client in shards
        if (entry := client.local["oplog.rs"].find_one({"ns": f"{db_name}.c", "op": "i"})) is not None
    ]
    assert [(entry["o"], entry["ts"]) for entry in found] == [({"_id": "routed"}, written)]


def test_the_oplog_edge_through_mongos_is_the_newest_of_the_shards_edges(
    mongos: pymongo.MongoClient, shards: list[tuple[dict[str, Any], pymongo.MongoClient]], db_name: str
) -> None:
    mongos[db_name].c.insert_many([{"_id": i} for i in range(3)])

    def newest_of_the_shards(direction: int) -> Timestamp:
        return max(
            client.local["oplog.rs"].find_one({}, sort=[("$natural", direction)])["ts"]
            for _, client in shards
        )

    assert oplog_edge(mongos, 1) == newest_of_the_shards(1)
    # A real shard writes a no-op entry every few seconds, so the newest end is read between two
    # readings of the shards' own.
    before = newest_of_the_shards(-1)
    newest = oplog_edge(mongos, -1)
    assert newest is not None and before <= newest <= newest_of_the_shards(-1)


def test_a_change_stream_opens_at_the_oldest_safe_start(mongos: pymongo.MongoClient, db_name: str) -> None:
    """What start_position EARLIEST does through a mongos: open at the newest of the shards' oldest
    entries, which every shard still has."""
    coll = mongos[db_name].c
    coll.insert_one({"_id": "early"})
    oldest = oplog_edge(mongos, 1)
    assert oldest is not None
    with coll.watch(start_at_operation_time=oldest, max_await_time_ms=100) as stream:
        change = None
        for _ in range(100):
            change = stream.try_next()
            if change is not None:
                break
    assert change is not None and change["documentKey"] == {"_id": "early"}


def test_the_documents_of_a_hashed_collection_are_logged_on_every_shard(
    hashed: Collection, two_shards: list[tuple[dict[str, Any], pymongo.MongoClient]]
) -> None:
    hashed.insert_many([{"_id": i} for i in range(200)])
    per_shard = [{e["o"]["_id"] for e in logged(client, hashed.full_name)} for _, client in two_shards]
    assert all(per_shard), [len(ids) for ids in per_shard]
    assert sum(len(ids) for ids in per_shard) == 200 and set().union(*per_shard) == set(range(200))


def test_the_mongos_merges_the_shards_events_in_resume_token_order(
    hashed: Collection, two_shards: list[tuple[dict[str, Any], pymongo.MongoClient]]
) -> None:
    with hashed.watch(max_await_time_ms=100) as stream:
        hashed.insert_many([{"_id": i, "v": 0} for i in range(40)])
        for i in range(0, 40, 3):
            hashed.update_one({"_id": i}, {"$set": {"v": 1}})
        hashed.delete_many({"_id": {"$lt": 10}})
        events = drain(stream, 40 + 14 + 10, "the writes on both shards")
    tokens = [event["_id"]["_data"] for event in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    times = [event["clusterTime"] for event in events]
    assert times == sorted(times)
    # Every entry of every shard, and nothing else, once each.
    kinds = {"insert": "i", "update": "u", "delete": "d"}
    seen = sorted((kinds[e["operationType"]], e["documentKey"]["_id"], e["clusterTime"]) for e in events)
    entries = [
        (entry["op"], (entry.get("o2") or entry["o"])["_id"], entry["ts"])
        for _, client in two_shards
        for entry in logged(client, hashed.full_name)
    ]
    assert seen == sorted(entries)
    # Each document's events in the order they were written.
    for key in (0, 3, 12, 39):
        ops = [e["operationType"] for e in events if e["documentKey"]["_id"] == key]
        expected = ["insert", *(["update"] if key % 3 == 0 else []), *(["delete"] if key < 10 else [])]
        assert ops == expected, key


def test_a_token_of_any_shards_event_resumes_the_stream_on_every_shard(
    hashed: Collection, two_shards: list[tuple[dict[str, Any], pymongo.MongoClient]]
) -> None:
    with hashed.watch(max_await_time_ms=100) as stream:
        hashed.insert_many([{"_id": i} for i in range(30)])
        events = drain(stream, 30, "the inserts")
    keys = [event["documentKey"]["_id"] for event in events]
    ns = hashed.full_name
    owner = {e["o"]["_id"]: shard["_id"] for shard, client in two_shards for e in logged(client, ns)}
    # The first and a middle event of each shard (never the last event: something must follow).
    positions = set()
    for shard, _ in two_shards:
        mine = [position for position, key in enumerate(keys[:-1]) if owner[key] == shard["_id"]]
        positions |= {mine[0], mine[len(mine) // 2]}
    for position in sorted(positions):
        for option in ("resume_after", "start_after"):
            with hashed.watch(max_await_time_ms=100, **{option: events[position]["_id"]}) as resumed:
                rest = drain(resumed, len(events) - position - 1, f"the stream {option} event {position}")
            assert [e["documentKey"]["_id"] for e in rest] == keys[position + 1 :], (option, position)


def test_the_post_batch_resume_token_is_behind_no_shard(
    hashed: Collection, two_shards: list[tuple[dict[str, Any], pymongo.MongoClient]]
) -> None:
    with hashed.watch(max_await_time_ms=100) as stream:
        hashed.insert_many([{"_id": i} for i in range(20)])
        last = drain(stream, 20, "the inserts")[-1]
        assert stream.try_next() is None
        drained = stream.resume_token
    assert drained["_data"] >= last["_id"]["_data"]
    # No shard has a cluster time before it: nothing it has still to log can sort before it.
    shard_times = [client.admin.command("ping")["operationTime"] for _, client in two_shards]
    assert token_cluster_time(drained) <= min(shard_times)
    hashed.insert_many([{"_id": i} for i in range(20, 40)])
    with hashed.watch(max_await_time_ms=100, resume_after=drained) as resumed:
        later = drain(resumed, 20, "the inserts after the token")
        assert resumed.try_next() is None
    assert sorted(e["documentKey"]["_id"] for e in later) == list(range(20, 40))
