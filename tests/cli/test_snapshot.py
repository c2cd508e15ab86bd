"""`flowwarden snapshot request|list|cancel`: requests written where the stream looks, the streams'
progress listed, cancels, and one-line errors for what cannot be done."""

from __future__ import annotations

import json
from typing import Any

import pymongo
from bson import ObjectId

from flowwarden import ChangeEvent, change_stream, checkpoint, on_change
from flowwarden.cli import ExitCode, main
from helpers import checkpoint_doc, flowwarden_command, one_error_line, running, wait_until


def orders_handler(db: str, delivered: list[Any], **stream: Any) -> type:
    @change_stream("orders", db, name="orders", max_await_time_ms=50, snapshot_chunk_size=7, **stream)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            delivered.append((event.operation_type, event.document_key["_id"]))

    return Orders


def listed(capsys: Any, uri: str, db: str) -> list[dict[str, Any]]:
    assert main(["snapshot", "list", "--uri", uri, "--database", db, "--json"]) == ExitCode.CLEAN_STOP
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_request_then_list_follows_the_copy_of_a_partitioned_stream(
    capsys: Any, mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i, "region": "eu" if i % 2 else "us"} for i in range(40)])
    delivered: list[Any] = []
    with running(mongodb_uri, [orders_handler(db_name, delivered, partitions=2)]) as connector:
        wait_until(lambda: checkpoint_doc(client, db_name, "orders[1/2]"), what="the buckets' positions")
        code = main(
            [
                "snapshot", "request", "orders", "--uri", mongodb_uri, "--database", db_name,
                "--filter", '{"region": "eu"}', "--chunk-size", "5",
            ]
        )
        out = capsys.readouterr().out
        assert code == ExitCode.CLEAN_STOP, out
        request = out.split("request ")[1].split(".")[0]
        wait_until(
            lambda: all(
                (p := connector.status()[name].incremental_snapshot) is not None and p.state.value == "done"
                for name in ("orders[0/2]", "orders[1/2]")
            ),
            what="both buckets' copies",
        )
        (row,) = listed(capsys, mongodb_uri, db_name)
    assert sorted(key for op, key in delivered if op == "snapshot") == list(range(1, 40, 2))
    assert row["id"] == request and row["stream"] == "orders" and row["state"] == "done"
    assert row["filter"] == {"region": "eu"} and row["chunkSize"] == 5 and row["copied"] == 20
    assert set(row["streams"]) == {"orders[0/2]", "orders[1/2]"}
    assert sum(bucket["chunks"] for bucket in row["streams"].values()) >= 4  # chunks of 5
    # The table says the same.
    assert main(["snapshot", "list", "--uri", mongodb_uri, "--database", db_name]) == ExitCode.CLEAN_STOP
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if request in line)
    assert "orders" in line and "done" in line and "20" in line


def test_a_waiting_request_is_listed_and_cancelled_once(
    capsys: Any, mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name]["_fw_checkpoints"].insert_one({"_id": "orders"})  # a stream that is not running
    assert main(["snapshot", "request", "orders", "--uri", mongodb_uri, "--database", db_name]) == 0
    request = capsys.readouterr().out.split("request ")[1].split(".")[0]
    (row,) = listed(capsys, mongodb_uri, db_name)
    assert row["state"] == "waiting" and row["collections"] is None and row["copied"] == 0
    assert main(["snapshot", "cancel", request, "--uri", mongodb_uri, "--database", db_name]) == 0
    assert "cancelled snapshot request" in capsys.readouterr().out
    (row,) = listed(capsys, mongodb_uri, db_name)
    assert row["state"] == "cancelled"
    stored = client[db_name]["_fw_signals"].find_one({"_id": ObjectId(request)})
    assert stored["state"] == "cancelled" and stored["cancelledAt"] is not None
    again = flowwarden_command("snapshot", "cancel", request, "--uri", mongodb_uri, "--database", db_name)
    assert again.returncode == ExitCode.USAGE
    assert one_error_line(again.stderr) == (
        f"flowwarden: snapshot request {request} was cancelled already; nothing to cancel"
    )


def test_what_cannot_be_requested_or_cancelled_ends_in_one_line(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name]["_fw_checkpoints"].insert_one({"_id": "orders"})
    uri = ["--uri", mongodb_uri, "--database", db_name]
    cases = {
        ("request", "order", *uri): "no stream 'order' keeps its checkpoint in",
        ("request", "orders", "--filter", "{region: eu", *uri): "--filter is not JSON",
        ("request", "orders", "--filter", "[1]", *uri): "--filter must be a JSON object",
        ("request", "orders", "--collection", "_fw_dlq", *uri): "one of flowwarden's own",
        ("cancel", "nope", *uri): "'nope' is not a request id",
        ("cancel", str(ObjectId()), *uri): "no snapshot request",
    }
    for args, fragment in cases.items():
        done = flowwarden_command("snapshot", *args)
        assert done.returncode == ExitCode.USAGE, (args, done.stderr)
        assert fragment in one_error_line(done.stderr), (args, done.stderr)
    usage = flowwarden_command("snapshot", "request", "orders", "--chunk-size", "0", *uri)
    assert usage.returncode == ExitCode.USAGE and "--chunk-size" in one_error_line(usage.stderr)
    assert client[db_name]["_fw_signals"].count_documents({}) == 0
    # --force writes a request for a stream whose checkpoints are kept elsewhere.
    forced = flowwarden_command("snapshot", "request", "elsewhere", "--force", *uri)
    assert forced.returncode == 0, forced.stderr
    assert client[db_name]["_fw_signals"].find_one({"stream": "elsewhere"})["state"] == "requested"


def test_status_shows_the_requested_snapshot(
    capsys: Any, mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    client[db_name].orders.insert_many([{"_id": i} for i in range(15)])
    delivered: list[Any] = []
    with running(mongodb_uri, [orders_handler(db_name, delivered)]) as connector:
        request = connector.request_snapshot("orders")
        wait_until(
            lambda: (p := connector.status()["orders"].incremental_snapshot) is not None and not p.running,
            what="the copy to end",
        )
    assert main(["status", "--uri", mongodb_uri, "--database", db_name, "--json"]) == ExitCode.CLEAN_STOP
    (row,) = json.loads(capsys.readouterr().out)
    assert row["incrementalSnapshot"] == {
        "request": request,
        "state": "done",
        "copied": 15,
        "dropped": 0,
        "total": 15,
        "namespace": f"{db_name}.orders",
    }
    assert main(["status", "--uri", mongodb_uri, "--database", db_name]) == ExitCode.CLEAN_STOP
    assert "done: 15" in capsys.readouterr().out
