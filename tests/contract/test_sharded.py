"""A mongos as clients see it: its hello, the topology drivers make of it, what it refuses, and the
shards it lists, which a client can reach directly to read their oplogs.

These run against the embedded sharded cluster, or against FLOWWARDEN_TEST_MONGODB_URI when that
names a mongos (docker-compose.yml's ``sharded`` profile); the change-stream, resume-token and
CRUD contracts run through the mongos too (``through_mongos``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from bson import ObjectId, Timestamp
from pymongo.errors import OperationFailure

from flowwarden.positions import oplog_edge

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
