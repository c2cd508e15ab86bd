"""The MongoDB shell against the embedded server: what ``mongosh`` prints for a collection's
statistics, a query plan, the replica set's configuration and the operations in progress.

mongosh is a Node.js program (``npm install mongosh``), not a Python dependency: these tests run
where it is on ``PATH`` or ``MONGOSH`` names it, and are skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pymongo
import pytest

from flowwarden_embedded import EmbeddedReplicaSet

MONGOSH = os.environ.get("MONGOSH") or shutil.which("mongosh")

pytestmark = pytest.mark.skipif(
    MONGOSH is None,
    reason="mongosh is not installed: `npm install mongosh`, then put its node_modules/.bin on PATH "
    "or set MONGOSH to the program",
)


def mongosh(uri: str, script: str) -> Any:
    """What ``script`` prints, as JSON, run by ``mongosh <uri> --quiet --eval``."""
    assert MONGOSH is not None
    done = subprocess.run(
        [MONGOSH, uri, "--quiet", "--norc", "--eval", f"JSON.stringify({script})"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"mongosh failed: {done.stderr or done.stdout}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def db_uri(rs: EmbeddedReplicaSet, client: pymongo.MongoClient, db_name: str) -> str:
    client[db_name].c.insert_many([{"_id": i, "a": i % 2} for i in range(7)])
    client[db_name].c.create_index("a")
    return f"mongodb://127.0.0.1:{rs.port}/{db_name}?replicaSet=rs0"


def test_mongosh_collection_stats(db_uri: str) -> None:
    stats = mongosh(db_uri, "db.c.stats()")
    assert stats["count"] == 7 and stats["nindexes"] == 2 and stats["ok"] == 1
    assert stats["totalSize"] == stats["storageSize"] + stats["totalIndexSize"]
    assert mongosh(db_uri, "db.c.dataSize()") == stats["size"]


def test_mongosh_explain(db_uri: str) -> None:
    plan = mongosh(db_uri, 'db.c.find({a: 1}).explain("executionStats")')
    assert plan["queryPlanner"]["winningPlan"]["inputStage"]["indexName"] == "a_1"
    assert plan["executionStats"]["nReturned"] == 3


def test_mongosh_rs_conf(db_uri: str, rs: EmbeddedReplicaSet) -> None:
    config = mongosh(db_uri, "rs.conf()")
    assert config["_id"] == "rs0"
    assert [m["host"] for m in config["members"]] == [f"127.0.0.1:{rs.port}"]


def test_mongosh_current_op(db_uri: str) -> None:
    ops = mongosh(db_uri, "db.currentOp()")
    assert ops["ok"] == 1
    assert [op["ns"] for op in ops["inprog"] if op.get("appName", "").startswith("mongosh")] == [
        "admin.$cmd.aggregate"
    ]
