"""`flowwarden status`: every stream's position, lag, instance and lease, checked against what a
connector did; exit 2 once a position left the oplog."""

from __future__ import annotations

import json
import re

import pymongo
import pytest

from flowwarden import change_stream, checkpoint, on_change
from flowwarden.cli import ExitCode, main
from flowwarden.testing import EmbeddedReplicaSet
from helpers import checkpoint_doc, running, wait_until


def orders_handler(db: str, **stream: object) -> type:
    @change_stream("orders", db, name="orders", max_await_time_ms=50, **stream)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def handle(self, event: object) -> None:
            pass

    return Orders


def status_json(capsys, uri: str, db: str) -> tuple[int, list[dict]]:
    code = main(["status", "--uri", uri, "--database", db, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_status_shows_each_stream_as_the_connector_left_it(capsys, mongodb_uri, client, db_name):
    with running(
        mongodb_uri, [orders_handler(db_name, deployment="single_leader")], instance_id="east-1"
    ) as c:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="the opening position")
        client[db_name].orders.insert_many([{"_id": i} for i in range(7)])
        wait_until(lambda: c.status()["orders"].events_processed == 7)
        wait_until(lambda: checkpoint_doc(client, db_name, "orders").get("eventsProcessed") == 7)
        code, rows = status_json(capsys, mongodb_uri, db_name)
    assert code == ExitCode.CLEAN_STOP
    (row,) = rows
    stored = checkpoint_doc(client, db_name, "orders")
    assert row["stream"] == "orders" and row["eventsProcessed"] == 7 and row["instanceId"] == "east-1"
    assert row["leaseHolder"] == "east-1"  # single_leader: the running instance holds the lease
    # The token names the connector itself, which another process given "east-1" would not share.
    assert row["instanceToken"] == row["leaseHolderToken"] == c.instance_token
    assert row["lastProcessed"].startswith(stored["lastProcessedTimestamp"].isoformat()[:19])
    assert 0 <= row["secondsBehind"] < 60 and row["inOplog"] is True and row["unreadable"] is None
    # Stopped, the lease was given back; the table says the same as the JSON.
    code = main(["status", "--uri", mongodb_uri, "--database", db_name])
    table = capsys.readouterr().out
    assert code == ExitCode.CLEAN_STOP
    line = next(line for line in table.splitlines() if "orders" in line and "│" in line)
    cells = [cell.strip() for cell in line.strip("│").split("│")]
    assert cells[0] == "orders" and cells[4] == "7" and cells[6] == "-"
    assert cells[5] == f"east-1 ({c.instance_token})"
    assert cells[7] == "yes"


def test_an_unreadable_document_is_marked_and_the_rest_still_shown(capsys, mongodb_uri, client, db_name):
    with running(mongodb_uri, [orders_handler(db_name)]):
        wait_until(lambda: checkpoint_doc(client, db_name, "orders"), what="the opening position")
    client[db_name]["_fw_checkpoints"].insert_one({"_id": "broken", "lastProcessedToken": "not a token"})
    code, rows = status_json(capsys, mongodb_uri, db_name)
    assert code == ExitCode.FAILED
    assert [row["stream"] for row in rows] == ["broken", "orders"]
    assert rows[0]["unreadable"] and rows[1]["unreadable"] is None


@pytest.mark.embedded_only
def test_a_position_that_left_the_oplog_exits_2(capsys, tmp_path):
    with EmbeddedReplicaSet(oplog_max_events=20) as rs, pymongo.MongoClient(rs.uri) as client:
        with running(rs.uri, [orders_handler("shop")]) as connector:
            wait_until(lambda: checkpoint_doc(client, "shop", "orders"), what="the opening position")
            client.shop.orders.insert_one({"_id": 0})
            wait_until(lambda: connector.status()["orders"].events_processed == 1)
        assert status_json(capsys, rs.uri, "shop")[0] == ExitCode.CLEAN_STOP
        client.shop.other.insert_many([{"_id": i} for i in range(50)])  # the oplog rolls over
        code, rows = status_json(capsys, rs.uri, "shop")
        assert code == ExitCode.USAGE
        assert rows[0]["inOplog"] is False
        code = main(["status", "--uri", rs.uri, "--database", "shop"])
        out, err = capsys.readouterr()
        assert code == ExitCode.USAGE and "NO: history lost" in out
        assert re.search(r"'orders' is older than the oplog's oldest entry", err)


@pytest.mark.usefixtures("needs_hashed_index_key")
def test_status_shows_the_holder_of_each_bucket_and_the_members_sharing_them(
    capsys, mongodb_uri, client, db_name
):
    """Two connectors share a stream of 4 buckets: each bucket's row names the connector holding
    it, and the members table lists each connector with the 2 buckets it holds."""
    handler = orders_handler(db_name, deployment="single_leader", partitions=4, lease_ttl_seconds=10)
    names = [f"orders[{i}/4]" for i in range(4)]
    with running(mongodb_uri, [handler], instance_id="east-1") as east:
        with running(mongodb_uri, [handler], instance_id="west-1") as west:

            def runs(connector) -> list[str]:
                return sorted(n for n, s in connector.status().items() if s.state.value == "RUNNING")

            wait_until(lambda: len(runs(east)) == len(runs(west)) == 2, what="2 buckets each")
            code, rows = status_json(capsys, mongodb_uri, db_name)
            assert code == ExitCode.CLEAN_STOP
            holders = {row["stream"]: row["leaseHolderToken"] for row in rows}
            assert holders == {
                **{name: east.instance_token for name in runs(east)},
                **{name: west.instance_token for name in runs(west)},
            }
            assert sorted(holders) == names
            code = main(["status", "--uri", mongodb_uri, "--database", db_name])
            table = capsys.readouterr().out
            assert code == ExitCode.CLEAN_STOP
            members = {}
            for line in table.split("members sharing partitioned streams")[1].splitlines():
                cells = [cell.strip() for cell in line.strip("│").split("│")]
                if "│" in line and cells[0] == "orders":
                    members[cells[1]] = cells[2]
            assert members == {
                f"east-1 ({east.instance_token})": "2: " + ", ".join(runs(east)),
                f"west-1 ({west.instance_token})": "2: " + ", ".join(runs(west)),
            }
