"""EmbeddedReplicaSet(topology="sharded"): a mongos and its one shard's member, two processes on two
ports serving one deployment's data, each with its own identity and fail points; the mongos's
writes and change streams are the shard's oplog's. Clusters of more shards:
test_sharded_cluster.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pymongo
import pytest
from pymongo.errors import OperationFailure

from flowwarden_embedded import EmbeddedReplicaSet


@pytest.fixture
def shard(cluster: EmbeddedReplicaSet) -> Iterator[pymongo.MongoClient]:
    assert cluster.shard_uri is not None
    with pymongo.MongoClient(cluster.shard_uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


def test_topology_and_shard_port_are_validated() -> None:
    with pytest.raises(ValueError, match="topology must be one of 'replica_set', 'sharded'"):
        EmbeddedReplicaSet(topology="standalone")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shard_port is for topology='sharded'"):
        EmbeddedReplicaSet(shard_port=27018)


def test_a_replica_set_has_no_shard() -> None:
    rs = EmbeddedReplicaSet()
    assert rs.topology == "replica_set" and rs.shard_port is None and rs.shard_uri is None


def test_uris_name_the_mongos_and_the_shard_set(cluster: EmbeddedReplicaSet) -> None:
    assert cluster.topology == "sharded"
    assert cluster.uri == f"mongodb://127.0.0.1:{cluster.port}/"
    assert cluster.shard_uri == f"mongodb://127.0.0.1:{cluster.shard_port}/?replicaSet=shard0"
    assert cluster.port != cluster.shard_port
    assert repr(cluster) == (
        f"EmbeddedReplicaSet(uri={cluster.uri!r}, shard_uri={cluster.shard_uri!r}, running)"
    )


def test_both_processes_serve_one_deployment(mongos: pymongo.MongoClient, shard: pymongo.MongoClient) -> None:
    with mongos.start_session() as session:
        mongos.t.c.insert_one({"_id": "routed"}, session=session)
        written = session.operation_time
    assert shard.t.c.find_one() == {"_id": "routed"}
    newest = shard.local["oplog.rs"].find_one({}, sort=[("$natural", -1)])
    assert newest["ts"] == written and newest["o"] == {"_id": "routed"}
    shard_hello = shard.admin.command("hello")
    assert shard_hello["setName"] == "shard0" and shard_hello["me"] == f"127.0.0.1:{shard.address[1]}"
    assert (
        shard_hello["topologyVersion"]["processId"]
        != mongos.admin.command("hello")["topologyVersion"]["processId"]
    )


def test_each_process_has_its_own_fail_points(
    mongos: pymongo.MongoClient, shard: pymongo.MongoClient
) -> None:
    shard.admin.command(
        "configureFailPoint", "failCommand", mode="alwaysOn", data={"failCommands": ["find"], "errorCode": 13}
    )
    try:
        assert mongos.t.c.find_one() is None
        with pytest.raises(OperationFailure) as failed:
            shard.t.c.find_one()
        assert failed.value.code == 13
    finally:
        shard.admin.command("configureFailPoint", "failCommand", mode="off")
    mongos.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={"failCommands": ["find"], "errorCode": 2},
    )
    assert shard.t.c.find_one() is None
    with pytest.raises(OperationFailure) as failed:
        mongos.t.c.find_one()
    assert failed.value.code == 2


def test_what_each_process_reports_about_itself(
    mongos: pymongo.MongoClient, shard: pymongo.MongoClient
) -> None:
    routed = mongos.admin.command("serverStatus")
    assert routed["process"] == "mongos" and "repl" not in routed
    member = shard.admin.command("serverStatus")
    assert member["process"] == "mongod" and member["repl"]["setName"] == "shard0"
    assert shard.admin.command("replSetGetStatus")["set"] == "shard0"
    options = shard.admin.command("getCmdLineOpts")
    assert options["parsed"]["sharding"] == {"clusterRole": "shardsvr"} and "--shardsvr" in options["argv"]
    assert mongos.admin.command("getCmdLineOpts")["argv"][0] == "mongos"


def test_list_shards_is_a_mongos_command(mongos: pymongo.MongoClient, shard: pymongo.MongoClient) -> None:
    assert [s["_id"] for s in mongos.admin.command("listShards")["shards"]] == ["shard0"]
    with pytest.raises(OperationFailure) as missing:
        shard.admin.command("listShards")
    assert missing.value.code == 59
    with pytest.raises(OperationFailure) as not_admin:
        mongos.t.command("listShards")
    assert not_admin.value.code == 13


def test_config_shards_is_the_mongos_view_only(
    mongos: pymongo.MongoClient, shard: pymongo.MongoClient
) -> None:
    assert [s["_id"] for s in mongos.config.shards.find({"state": 1}, {"_id": 1})] == ["shard0"]
    assert list(mongos.config.shards.find({"state": 2})) == []
    assert list(shard.config.shards.find()) == []


def test_restart_keeps_both_ports_and_the_data() -> None:
    cluster = EmbeddedReplicaSet(topology="sharded").start()
    uri, shard_uri = cluster.uri, cluster.shard_uri
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20_000) as mongos:
        mongos.t.c.insert_one({"_id": "kept"})
        cluster.stop()
        cluster.start()
        assert (cluster.uri, cluster.shard_uri) == (uri, shard_uri)
        assert mongos.t.c.find_one() == {"_id": "kept"}
    cluster.stop()


def test_a_taken_shard_port_fails_the_start_and_frees_the_mongos_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cluster = EmbeddedReplicaSet(topology="sharded", shard_port=taken.getsockname()[1])
        with pytest.raises(OSError):
            cluster.start()
    mongos_port = cluster.port
    assert not cluster.running and mongos_port > 0
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", mongos_port))
