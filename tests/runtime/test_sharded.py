"""The connector through a mongos: positions that need the oplog (EARLIEST, RESUME_FROM_OPLOG_START,
the oplog-window metric) read it on the shards, and say which shard and privilege when they cannot.

Each server test runs its own ``EmbeddedReplicaSet(topology="sharded")``: a mongos whose
``config.shards`` names a shard replica set reachable on a port of its own. The last tests check,
without Docker, that docker-compose.yml's ``sharded`` profile describes a cluster whose shards the
suite can reach the same way.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import motor.motor_asyncio
import pymongo
import pytest
import yaml

from flowwarden import OnHistoryLost, StartPosition, StreamError, StreamState
from flowwarden.positions import oplog_edge, oplog_edge_async, oplog_window_async, shard_client_for
from flowwarden.testing import EmbeddedReplicaSet

from .conftest import checkpoint_doc, running, wait_until
from .handlers import recording_handler

ROOT = Path(__file__).resolve().parents[2]


def shard_oplog_edge(cluster: EmbeddedReplicaSet, direction: int) -> object:
    assert cluster.shard_uri is not None
    with pymongo.MongoClient(cluster.shard_uri, serverSelectionTimeoutMS=10_000) as shard:
        return shard.local["oplog.rs"].find_one({}, sort=[("$natural", direction)])["ts"]


def fail_on_shard(cluster: EmbeddedReplicaSet, mode: object, **data: object) -> None:
    assert cluster.shard_uri is not None
    with pymongo.MongoClient(cluster.shard_uri, serverSelectionTimeoutMS=10_000) as shard:
        shard.admin.command("configureFailPoint", "failCommand", mode=mode, data=data)


@pytest.mark.embedded_only
def test_the_oplog_edges_are_read_on_the_shard_by_every_kind_of_client(
    cluster: EmbeddedReplicaSet, mongos: pymongo.MongoClient
) -> None:
    mongos.shop.orders.insert_many([{"_id": i} for i in range(3)])
    oldest, newest = shard_oplog_edge(cluster, 1), shard_oplog_edge(cluster, -1)
    assert (oplog_edge(mongos, 1), oplog_edge(mongos, -1)) == (oldest, newest)

    async def read_with_async_clients() -> list[object]:
        asyncio_client: pymongo.AsyncMongoClient = pymongo.AsyncMongoClient(cluster.uri)
        motor_client = motor.motor_asyncio.AsyncIOMotorClient(cluster.uri)
        try:
            return [
                await oplog_edge_async(asyncio_client, 1),
                await oplog_window_async(asyncio_client),
                await oplog_edge_async(motor_client, -1),
            ]
        finally:
            await asyncio_client.close()
            motor_client.close()

    assert asyncio.run(read_with_async_clients()) == [oldest, (oldest, newest), newest]


@pytest.mark.embedded_only
def test_earliest_through_a_mongos_starts_at_the_shards_oldest_entry(
    cluster: EmbeddedReplicaSet, mongos: pymongo.MongoClient
) -> None:
    mongos.shop.orders.insert_many([{"_id": i} for i in range(5)])
    handler, seen = recording_handler("shop", start_position=StartPosition.EARLIEST)
    with running(cluster.uri, [handler]):
        wait_until(lambda: len(seen) >= 5, what="the events written before the first start")
    assert seen[:5] == [("insert", i) for i in range(5)]


@pytest.mark.embedded_only
def test_resume_from_oplog_start_through_a_mongos_replays_what_the_shard_kept() -> None:
    strategy = OnHistoryLost.RESUME_FROM_OPLOG_START
    with (
        EmbeddedReplicaSet(topology="sharded", oplog_max_events=20) as cluster,
        pymongo.MongoClient(cluster.uri) as mongos,
    ):
        orders = mongos.shop.orders
        first, _ = recording_handler("shop", on_history_lost=strategy)
        with running(cluster.uri, [first]):
            wait_until(lambda: checkpoint_doc(mongos, "shop", "orders"), what="initial checkpoint")
            orders.insert_many([{"_id": i} for i in range(3)])
            wait_until(lambda: (checkpoint_doc(mongos, "shop", "orders") or {}).get("eventsProcessed") == 3)
        orders.insert_many([{"_id": i} for i in range(3, 40)])  # 37 entries: the shard keeps 20
        handler, seen = recording_handler("shop", on_history_lost=strategy)
        with running(cluster.uri, [handler]):
            wait_until(lambda: ("insert", 39) in seen, what="the surviving oplog entries")
        assert seen == [("insert", i) for i in range(20, 40)]
        audit = checkpoint_doc(mongos, "shop", "orders")["metadata"]["historyLost"]
        assert audit["strategy"] == "RESUME_FROM_OPLOG_START" and audit["lostTo"] is not None


@pytest.mark.embedded_only
def test_earliest_without_read_on_the_shard_fails_naming_the_shard_and_the_privileges(
    cluster: EmbeddedReplicaSet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flowwarden.positions")
    # What a user without read on the shard's local database gets (MongoDB's Unauthorized).
    fail_on_shard(
        cluster,
        "alwaysOn",
        failCommands=["find"],
        namespace="local.oplog.rs",
        errorCode=13,
        errmsg='not authorized on local to execute command { find: "oplog.rs" }',
    )
    handler, seen = recording_handler("shop", start_position=StartPosition.EARLIEST)
    with running(cluster.uri, [handler]) as connector:
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
        error = connector.stream_errors()["orders"]
    assert isinstance(error, StreamError) and "start_position=EARLIEST" in str(error)
    assert seen == []
    [warning] = [r.getMessage() for r in caplog.records if r.name == "flowwarden.positions"]
    assert f"on shard 'shard0' (shard0/127.0.0.1:{cluster.shard_port})" in warning
    assert "not authorized on local" in warning and "(Unauthorized 13)" in warning
    assert "read on config.shards" in warning and "shard-local user with read on 'local'" in warning


@pytest.mark.embedded_only
def test_without_read_on_config_shards_the_edge_is_unknown_and_the_warning_says_why(
    mongos: pymongo.MongoClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flowwarden.positions")
    mongos.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={"failCommands": ["find"], "namespace": "config.shards", "errorCode": 13},
    )
    assert oplog_edge(mongos, 1) is None
    [warning] = [r.getMessage() for r in caplog.records if r.name == "flowwarden.positions"]
    assert warning.startswith("cannot list the shards in config.shards:") and "(Unauthorized 13)" in warning


@pytest.mark.embedded_only
def test_the_oplog_window_metric_is_read_through_a_mongos(
    cluster: EmbeddedReplicaSet, mongos: pymongo.MongoClient
) -> None:
    mongos.shop.orders.insert_one({"_id": 0})
    handler, _ = recording_handler("shop")
    with running(cluster.uri, [handler], metrics_port=0) as connector:
        wait_until(lambda: connector.oplog_window_hours is not None, what="the oplog window")
        assert connector.oplog_window_hours >= 0


def test_a_shard_client_keeps_the_clients_options_and_credentials() -> None:
    given = pymongo.MongoClient(
        "mongodb://fw%40ops:p%3Ass@mongos1:27017,mongos2:27017/shop?authSource=admin&tls=true"
        "&tlsAllowInvalidCertificates=true&appname=fw&loadBalanced=false&serverSelectionTimeoutMS=1500",
        connect=False,
        tz_aware=True,
        maxPoolSize=7,
        directConnection=False,
    )
    with shard_client_for(given, "shard1/db1:27018,db2:27018") as shard:
        options = shard.options
        assert shard._init_kwargs["host"] == (
            "mongodb://fw%40ops:p%3Ass@db1:27018,db2:27018/shop?authSource=admin&tls=true"
            "&tlsAllowInvalidCertificates=true&appname=fw&serverSelectionTimeoutMS=1500"
        )
        credentials = options.pool_options._credentials
        assert (credentials.username, credentials.password, credentials.source) == ("fw@ops", "p:ss", "admin")
        assert options.replica_set_name == "shard1" and not options.direct_connection
        assert "directConnection" not in shard._init_kwargs
        assert options.server_selection_timeout == 1.5 and options.pool_options.max_pool_size == 7
        assert options.codec_options.tz_aware is True and options.pool_options._ssl_context is not None
    given.close()


def test_a_shard_client_of_an_srv_client_keeps_tls_and_drops_the_srv_options() -> None:
    given = pymongo.MongoClient(
        "mongodb+srv://reader:pw@cluster.example.com/?srvMaxHosts=2&authSource=admin", connect=False
    )
    with shard_client_for(given, "shard0/db1.example.com:27018") as shard:
        assert shard._init_kwargs["host"] == "mongodb://reader:pw@db1.example.com:27018/?authSource=admin"
        assert shard.options.pool_options._ssl_context is not None
        assert shard.options.replica_set_name == "shard0"
    given.close()


def _sharded_services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return {name: svc for name, svc in compose["services"].items() if "sharded" in svc.get("profiles", [])}


def _option(service: dict[str, Any], name: str) -> str:
    command = service["command"]
    return str(command[command.index(name) + 1])


def test_the_compose_sharded_profile_listens_on_the_hosts_loopback_only() -> None:
    services = _sharded_services()
    assert set(services) == {"configsvr", "shard0", "shard1", "mongos"}
    for name, service in services.items():
        assert service["network_mode"] == "host" and "ports" not in service, name
        assert _option(service, "--bind_ip") == "127.0.0.1", name
        # The healthcheck talks to the process it checks.
        check = service["healthcheck"]["test"]
        assert check[check.index("--port") + 1] == _option(service, "--port"), name


def test_the_compose_sharded_profile_adds_the_shards_at_the_addresses_they_were_initiated_with() -> None:
    services = _sharded_services()
    initiated = {}
    for name in ("configsvr", "shard0", "shard1"):
        script = services[name]["healthcheck"]["test"][-1]
        set_name = _option(services[name], "--replSet")
        host = f"127.0.0.1:{_option(services[name], '--port')}"
        assert f'_id: "{set_name}"' in script and f'host: "{host}"' in script, name
        initiated[set_name] = host
    mongos = services["mongos"]
    assert _option(mongos, "--configdb") == f"cfg/{initiated['cfg']}"
    added = re.findall(r'\["(shard\d)", (\d+)\]', mongos["healthcheck"]["test"][-1])
    assert {name: f"127.0.0.1:{port}" for name, port in added} == {
        name: host for name, host in initiated.items() if name != "cfg"
    }
    assert set(mongos["depends_on"]) == {"configsvr", "shard0", "shard1"}
