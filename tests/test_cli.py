"""The flowwarden command: checkpoints list/rewind/delete, and the demo's Spark-less path."""

from __future__ import annotations

import json

from flowwarden.checkpoint import Checkpoint, MongoCheckpointStore
from flowwarden.checkpoint.contract import sample_token
from flowwarden.cli import main
from flowwarden.demo import run_demo


def test_checkpoints_list_rewind_delete(capsys, mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=sample_token(1_800_000_000, 5)))
    common = ["--uri", mongodb_uri, "--database", db_name]

    assert main(["checkpoints", "list", *common]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    listed = json.loads(line)
    assert listed["stream"] == "orders" and listed["lastProcessedTimestamp"].startswith("2027-01-15")

    earlier = sample_token(1_700_000_000, 1)
    assert main(["checkpoints", "rewind", "orders", *common, "--to-token", json.dumps(earlier)]) == 0
    assert store.load("orders").last_processed_token == earlier

    assert main(["checkpoints", "delete", "orders", *common]) == 0
    assert store.load("orders") is None


def test_rewind_refuses_a_value_that_is_not_a_token(capsys, mongodb_uri, db_name):
    args = ["checkpoints", "rewind", "orders", "--uri", mongodb_uri, "--database", db_name]
    try:
        main([*args, "--to-token", '{"ts": 1}'])
    except SystemExit as exit_:
        assert "resume token" in str(exit_)
    else:
        raise AssertionError("a non-token was accepted")


def test_demo_without_spark_delivers_every_change_once(tmp_path):
    assert run_demo(events=300, output=str(tmp_path / "demo"), use_spark=False) == 0
