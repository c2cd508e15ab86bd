"""The connector through a mongos: positions that need the oplog (EARLIEST, RESUME_FROM_OPLOG_START,
the oplog-window metric, ``flowwarden status``) read it on every shard, and say which shard and
privilege when they cannot.

Each server test runs its own ``EmbeddedReplicaSet(topology="sharded")``: a mongos whose
``config.shards`` names shard replica sets reachable on ports of their own. On two shards whose
oplogs keep different spans (one rolled by writes of its own), every reading takes the newest of the
shards' oldest entries, and a connector process killed with SIGKILL and started again delivers
every event of a collection sharded over both. The last tests check, without Docker, that
docker-compose.yml's ``sharded`` profile describes a cluster whose shards the suite can reach the
same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import motor.motor_asyncio
import pymongo
import pytest
import yaml
from bson import Timestamp
from prometheus_client.parser import text_string_to_metric_families

from flowwarden import OnHistoryLost, StartPosition, StreamError, StreamState
from flowwarden.checkpoints import InMemoryCheckpointStore
from flowwarden.cli import ExitCode, main
from flowwarden.events import token_cluster_time
from flowwarden.mongo import positions
from flowwarden.mongo.positions import oplog_edge, oplog_edge_async, oplog_window_async, shard_client_for
from flowwarden.testing import EmbeddedReplicaSet
from helpers import checkpoint_doc, running, wait_until

from .conftest import run_connector
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
        # The shard kept 20..39; the record that the connector runs the stream (_fw_locks),
        # written as it starts on the same shard, pushed 20 out.
        assert seen == [("insert", i) for i in range(21, 40)]
        audit = checkpoint_doc(mongos, "shop", "orders")["metadata"]["historyLost"]
        assert audit["strategy"] == "RESUME_FROM_OPLOG_START" and audit["lostTo"] is not None


@pytest.mark.embedded_only
def test_earliest_without_read_on_the_shard_fails_naming_the_shard_and_the_privileges(
    cluster: EmbeddedReplicaSet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flowwarden.mongo.positions")
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
    [warning] = [r.getMessage() for r in caplog.records if r.name == "flowwarden.mongo.positions"]
    assert f"on shard 'shard0' (shard0/127.0.0.1:{cluster.shard_port})" in warning
    assert "not authorized on local" in warning and "(Unauthorized 13)" in warning
    assert "read on config.shards" in warning and "shard-local user with read on 'local'" in warning


@pytest.mark.embedded_only
def test_without_read_on_config_shards_the_edge_is_unknown_and_the_warning_says_why(
    mongos: pymongo.MongoClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warning comes once per process and reason: forget any earlier test's.
    monkeypatch.setattr(positions, "_REPORTED", set())
    caplog.set_level(logging.WARNING, logger="flowwarden.mongo.positions")
    mongos.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={"failCommands": ["find"], "namespace": "config.shards", "errorCode": 13},
    )
    assert oplog_edge(mongos, 1) is None
    [warning] = [r.getMessage() for r in caplog.records if r.name == "flowwarden.mongo.positions"]
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


# -- two shards whose oplogs keep different spans ------------------------------------------------


@contextmanager
def two_shards(
    oplog_max_events: int | None = None,
) -> Iterator[tuple[EmbeddedReplicaSet, pymongo.MongoClient]]:
    """A cluster of two shards and a client of its mongos. ``shop``'s primary shard is shard0 and
    ``shop.orders`` is sharded by the hash of ``_id`` over both; ``fill``'s primary shard is
    shard1, so that writes to it (:func:`roll_shard1`) roll shard1's oplog alone."""
    with (
        EmbeddedReplicaSet(topology="sharded", shards=2, oplog_max_events=oplog_max_events) as cluster,
        pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=10_000) as mongos,
    ):
        mongos.admin.command("enableSharding", "shop", primaryShard="shard0")
        mongos.admin.command("enableSharding", "fill", primaryShard="shard1")
        mongos.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
        yield cluster, mongos


def roll_shard1(mongos: pymongo.MongoClient, entries: int) -> None:
    start = mongos.fill.c.estimated_document_count()
    mongos.fill.c.insert_many([{"_id": start + i} for i in range(entries)])


def shard_edges(cluster: EmbeddedReplicaSet, direction: int) -> list[Timestamp]:
    """Each shard's oldest (1) or newest (-1) oplog entry's ts, read on the shard itself."""
    edges = []
    with ExitStack() as stack:
        for uri in cluster.shard_uris:
            shard = stack.enter_context(pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000))
            edges.append(shard.local["oplog.rs"].find_one({}, sort=[("$natural", direction)])["ts"])
    return edges


def insert_orders(mongos: pymongo.MongoClient, keys: range) -> None:
    """One insert per order, each after the one before in cluster time, whichever shard logs it."""
    for key in keys:
        mongos.shop.orders.insert_one({"_id": key})


@pytest.mark.embedded_only
def test_earliest_on_two_shards_starts_at_the_newest_of_their_oldest_entries() -> None:
    with two_shards(oplog_max_events=50) as (cluster, mongos):
        insert_orders(mongos, range(10))  # on both shards
        roll_shard1(mongos, 70)  # shard1 keeps 50 entries, all of them fill's: its orders are gone
        insert_orders(mongos, range(10, 20))
        oldest = shard_edges(cluster, 1)
        assert oldest[0] < oldest[1]  # shard0 still has the cluster's first entries
        assert oplog_edge(mongos, 1) == max(oldest)
        handler, seen = recording_handler("shop", start_position=StartPosition.EARLIEST)
        with running(cluster.uri, [handler]) as connector:
            wait_until(lambda: len(seen) >= 10, what="the orders written after shard1's oldest entry")
            assert connector.status()["orders"].state == StreamState.RUNNING
    # The orders shard0 still has from before shard1's oldest entry are not delivered: shard1's
    # are gone, and a stream through the mongos starts only where every shard has its history.
    assert seen == [("insert", i) for i in range(10, 20)]


@pytest.mark.embedded_only
def test_resume_from_oplog_start_on_two_shards_goes_on_at_the_newest_of_their_oldest_entries() -> None:
    strategy = OnHistoryLost.RESUME_FROM_OPLOG_START
    with two_shards(oplog_max_events=50) as (cluster, mongos):
        first, _ = recording_handler("shop", on_history_lost=strategy)
        with running(cluster.uri, [first]):
            wait_until(lambda: checkpoint_doc(mongos, "shop", "orders"), what="initial checkpoint")
            insert_orders(mongos, range(3))
            wait_until(lambda: (checkpoint_doc(mongos, "shop", "orders") or {}).get("eventsProcessed") == 3)
        stored = checkpoint_doc(mongos, "shop", "orders")["lastProcessedToken"]
        insert_orders(mongos, range(3, 10))  # lost with shard1's history: skipped, on both shards
        roll_shard1(mongos, 70)
        insert_orders(mongos, range(10, 20))
        oldest = shard_edges(cluster, 1)
        assert oldest[0] <= token_cluster_time(stored) < oldest[1]  # shard0 alone still has it
        handler, seen = recording_handler("shop", on_history_lost=strategy)
        with running(cluster.uri, [handler]):
            wait_until(lambda: ("insert", 19) in seen, what="the orders after shard1's oldest entry")
        assert seen == [("insert", i) for i in range(10, 20)]
        audit = checkpoint_doc(mongos, "shop", "orders")["metadata"]["historyLost"]
        assert audit["strategy"] == "RESUME_FROM_OPLOG_START"
        assert audit["lostTo"].replace(tzinfo=None) == max(oldest).as_datetime().replace(tzinfo=None)


@pytest.mark.embedded_only
def test_status_on_two_shards_judges_a_position_by_the_newest_of_their_oldest_entries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def status() -> tuple[int, dict[str, Any]]:
        code = main(["status", "--uri", cluster.uri, "--database", "shop", "--json"])
        [row] = json.loads(capsys.readouterr().out)
        return code, row

    with two_shards(oplog_max_events=50) as (cluster, mongos):
        handler, _ = recording_handler("shop")
        with running(cluster.uri, [handler]):
            wait_until(lambda: checkpoint_doc(mongos, "shop", "orders"), what="initial checkpoint")
            insert_orders(mongos, range(3))
            wait_until(lambda: (checkpoint_doc(mongos, "shop", "orders") or {}).get("eventsProcessed") == 3)
        code, row = status()
        assert (code, row["inOplog"]) == (ExitCode.CLEAN_STOP, True)
        roll_shard1(mongos, 70)
        stored = checkpoint_doc(mongos, "shop", "orders")["lastProcessedToken"]
        oldest = shard_edges(cluster, 1)
        assert oldest[0] <= token_cluster_time(stored) < oldest[1]  # shard0 alone still has it
        code, row = status()
    assert (code, row["inOplog"]) == (ExitCode.USAGE, False)


def wait_for_the_second(second: int) -> None:
    """Until this machine's clock, which the embedded cluster's cluster times follow, reaches
    ``second``: the oplog window counts whole seconds."""
    wait_until(lambda: time.time() >= second, timeout=5, what=f"the second {second}")


@pytest.mark.embedded_only
def test_the_oplog_window_metric_on_two_shards_spans_from_the_newest_oldest_to_the_newest_entry() -> None:
    with two_shards(oplog_max_events=20) as (cluster, mongos):
        # shard1 rolls after shard0's last entry, then writes two seconds after its new oldest
        # entry: its window is longer than shard0's, so which oldest entry is taken shows.
        wait_for_the_second(max(shard_edges(cluster, -1)).time + 1)
        roll_shard1(mongos, 30)
        with pymongo.MongoClient(cluster.shard_uris[1]) as shard1:
            # The entry that is shard1's oldest once the next write has rolled the present oldest.
            [next_oldest] = shard1.local["oplog.rs"].find({}, sort=[("$natural", 1)], skip=1, limit=1)
        wait_for_the_second(next_oldest["ts"].time + 2)
        roll_shard1(mongos, 1)
        oldest, newest = shard_edges(cluster, 1), shard_edges(cluster, -1)
        assert newest[0] < oldest[1] < newest[1]
        window = (max(newest).time - max(oldest).time) / 3600
        assert window > (newest[0].time - oldest[0].time) / 3600
        handler, _ = recording_handler("shop")
        # Checkpoints kept in memory: nothing the connector writes moves the shards' edges.
        with running(
            cluster.uri, [handler], metrics_port=0, checkpoint_store=InMemoryCheckpointStore()
        ) as connector:
            address = connector.metrics_address
            assert address is not None

            def gauge() -> float | None:
                with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=5) as reply:
                    body = reply.read().decode()
                for family in text_string_to_metric_families(body):
                    if family.name == "flowwarden_oplog_window_hours":
                        return float(family.samples[0].value)
                return None

            wait_until(lambda: gauge() is not None, what="the oplog window gauge on /metrics")
            assert gauge() == window
        assert shard_edges(cluster, 1) == oldest and shard_edges(cluster, -1) == newest


def handled_events(log: Path) -> list[tuple[str, str, str]]:
    """The child's ``(_id, operationType, token)`` lines (cli_handlers.py with FW_TEST_LOG_EVENTS)."""
    if not log.exists():
        return []
    return [(key, op, token) for key, op, token in (line.split() for line in log.read_text().splitlines())]


@pytest.mark.embedded_only
@pytest.mark.slow
def test_sigkill_on_two_shards_then_restart_delivers_every_event_each_documents_in_order(
    tmp_path: Path,
) -> None:
    """`flowwarden run` on a collection sharded over two shards is SIGKILLed while a writer inserts,
    updates and deletes documents through the mongos, and started again. Every event is handled;
    each document's in the order written; the only events handled twice are those the killed
    process handled after its last saved position, which the restart resumes after on both
    shards."""
    log = tmp_path / "handled.log"
    env = {"FW_TEST_LOG_EVENTS": "1", "FW_TEST_SAVE_EVERY_N": "5", "FW_TEST_SAVE_INTERVAL": "0.2"}
    documents = 60
    with two_shards() as (cluster, mongos):
        orders = mongos.shop.orders
        child = run_connector(cluster.uri, "shop", log, **env)
        restart = None
        stop = threading.Event()

        def write() -> None:
            # Each document inserted, updated, then deleted, interleaved with the others'.
            for key in range(documents + 2):
                if stop.is_set():
                    return
                if key < documents:
                    orders.insert_one({"_id": key, "v": 0})
                if 0 < key <= documents:
                    orders.update_one({"_id": key - 1}, {"$set": {"v": 1}})
                if 1 < key:
                    orders.delete_one({"_id": key - 2})
                time.sleep(0.01)

        writer = threading.Thread(target=write)
        try:
            opened = wait_until(lambda: checkpoint_doc(mongos, "shop", "orders"), timeout=30, what="the open")
            # What the stream must deliver: every event after the opening position, in the mongos's order.
            with orders.watch(resume_after=opened["lastSeenToken"], max_await_time_ms=50) as reference:
                writer.start()
                wait_until(lambda: len(handled_events(log)) >= 40, timeout=30, what="40 events handled")
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=10)
                killed = handled_events(log)
                stored = checkpoint_doc(mongos, "shop", "orders")
                restart = run_connector(cluster.uri, "shop", log, **env)
                writer.join(timeout=60)
                expected = [
                    (str(e["documentKey"]["_id"]), e["operationType"], e["_id"]["_data"])
                    for e in _events(reference, 3 * documents)
                ]
            wait_until(
                lambda: handled_events(log)[len(killed) :][-1:] == expected[-1:],
                timeout=60,
                what="the restart to handle the last event",
            )
            inserted = [len(logged_inserts(uri)) for uri in cluster.shard_uris]
        finally:
            stop.set()
            if writer.is_alive():
                writer.join(timeout=60)
            for process in (child, restart):
                if process is not None and process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=30)
    assert len(killed) < len(expected), "the kill came after every event was handled"
    assert all(inserted) and sum(inserted) == documents  # the documents live on both shards
    assert len({token for *_, token in expected}) == 3 * documents
    after_kill = handled_events(log)[len(killed) :]
    # The killed run handled a prefix of the stream; the restart goes on right after the stored
    # position, a token of one shard's event resuming the stream on both, with nothing skipped.
    assert killed == expected[: len(killed)]
    resume = max(stored[field]["_data"] for field in ("lastProcessedToken", "lastSeenToken") if stored[field])
    start = sum(1 for *_, token in expected if token <= resume)
    assert 0 < start <= len(killed), "the killed process saved no event's position"
    assert after_kill == expected[start:]
    handled_once = {event[2] for event in killed} | {event[2] for event in after_kill}
    assert handled_once == {token for *_, token in expected}
    for key in range(documents):
        ops = [op for k, op, _ in expected if k == str(key)]
        assert ops == ["insert", "update", "delete"], key


def logged_inserts(shard_uri: str) -> list[Any]:
    with pymongo.MongoClient(shard_uri, serverSelectionTimeoutMS=10_000) as shard:
        return list(shard.local["oplog.rs"].find({"ns": "shop.orders", "op": "i"}))


def _events(stream: Any, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(events) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"the reference stream got {len(events)} of {count} events in 60 s")
        event = stream.try_next()
        if event is not None:
            events.append(event)
    return events


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


def test_a_shard_client_of_a_host_list_client_connects_to_the_shards_hosts() -> None:
    given = pymongo.MongoClient(
        ["mongos1:27017", "mongos2:27017"],
        connect=False,
        replicaSet="mongos",
        directConnection=False,
        appname="fw",
    )
    with shard_client_for(given, "shard1/db1:27018,db2:27018") as shard:
        assert shard._init_kwargs["host"] == ["db1:27018", "db2:27018"]
        assert shard.options.replica_set_name == "shard1" and "directConnection" not in shard._init_kwargs
        assert shard._init_kwargs["appname"] == "fw"
    # config.shards names a shard that is not a replica set by its host alone.
    with shard_client_for(given, "db3:27018") as shard:
        assert shard._init_kwargs["host"] == ["db3:27018"]
        assert shard.options.replica_set_name is None and "replicaSet" not in shard._init_kwargs
    given.close()


def test_a_shard_client_keeps_the_uris_own_tls_and_authentication_database() -> None:
    given = pymongo.MongoClient(
        "mongodb+srv://reader:pw@cluster.example.com/?tls=false;srvServiceName=db;appname=fw", connect=False
    )
    with shard_client_for(given, "shard0/db1.example.com:27018") as shard:
        assert shard._init_kwargs["host"] == "mongodb://reader:pw@db1.example.com:27018/?tls=false&appname=fw"
        assert "tls" not in shard._init_kwargs and shard.options.pool_options._ssl_context is None
    given.close()
    given = pymongo.MongoClient("mongodb://reader:pw@mongos1:27017/shop", connect=False)
    with shard_client_for(given, "shard0/db1:27018") as shard:
        assert shard._init_kwargs["host"] == "mongodb://reader:pw@db1:27018/shop"
        assert shard._init_kwargs["authSource"] == "shop"
        assert shard.options.pool_options._credentials.source == "shop"
    given.close()
    given = pymongo.MongoClient("mongodb://reader:pw@mongos1:27017/shop", connect=False, authsource="users")
    with shard_client_for(given, "shard0/db1:27018") as shard:
        assert "authSource" not in shard._init_kwargs
        assert shard.options.pool_options._credentials.source == "users"
    given.close()


@pytest.mark.parametrize(
    ("uri", "options"),
    [
        ("mongodb+srv://reader:pw@cluster.example.com/", {"tls": False}),
        ("mongodb+srv://reader:pw@cluster.example.com/", {"ssl": False}),
        ("mongodb+srv://reader:pw@cluster.example.com/?ssl=false", {}),
    ],
    ids=["tls argument", "ssl argument", "ssl in the uri"],
)
def test_a_shard_client_of_an_srv_client_that_turned_tls_off_has_it_off(
    uri: str, options: dict[str, Any]
) -> None:
    given = pymongo.MongoClient(uri, connect=False, **options)
    with shard_client_for(given, "shard0/db1.example.com:27018") as shard:
        assert shard.options.pool_options._ssl_context is None
        assert shard._init_kwargs["host"].startswith("mongodb://reader:pw@db1.example.com:27018/")
    given.close()


def test_a_shard_client_keeps_a_uri_given_in_a_host_list_and_option_values_with_slashes() -> None:
    given = pymongo.MongoClient(
        ["mongodb://reader:pw@mongos1:27017/shop?appname=fw/orders://1"], connect=False
    )
    with shard_client_for(given, "shard0/db1:27018") as shard:
        assert shard._init_kwargs["host"] == "mongodb://reader:pw@db1:27018/shop?appname=fw/orders://1"
        assert shard.options.pool_options._credentials.username == "reader"
        assert shard.options.pool_options.metadata["application"] == {"name": "fw/orders://1"}
    given.close()


def test_a_shard_client_cannot_be_derived_from_a_client_that_forgot_its_arguments() -> None:
    class Forgetful:
        pass

    with pytest.raises(pymongo.errors.ConfigurationError) as raised:
        shard_client_for(Forgetful(), "shard0/db1:27018")
    assert str(raised.value) == (
        "cannot derive a client for the shard from a Forgetful "
        "(it does not keep the arguments it was created with)"
    )


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
