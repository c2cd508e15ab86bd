"""What a person inspecting a server asks it, through PyMongo: collection and database statistics
(``$collStats``, ``collStats``, ``dbStats``), query plans (``explain``), the replica set's
configuration (``replSetGetConfig``) and the operations in progress (``currentOp``,
``$currentOp``, ``killOp``): mongod's reply shapes, with the values the data gives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import bson
import pymongo
import pytest
from bson import Int64
from pymongo.errors import OperationFailure

from flowwarden_embedded import EmbeddedReplicaSet

DOCS = [{"_id": i, "a": i % 3, "b": "x" * i, "tags": [i, i + 1]} for i in range(10)]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """``check()``'s first truthy result; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def cluster_of_two() -> Iterator[EmbeddedReplicaSet]:
    with EmbeddedReplicaSet(topology="sharded", shards=2) as deployment:
        yield deployment


@pytest.fixture
def coll(client: pymongo.MongoClient, db_name: str) -> pymongo.collection.Collection:
    coll = client[db_name].c
    coll.insert_many(DOCS)
    return coll


def _storage(coll: pymongo.collection.Collection, **spec: Any) -> dict[str, Any]:
    (doc,) = coll.aggregate([{"$collStats": {"storageStats": spec}}])
    stats: dict[str, Any] = doc["storageStats"]
    return stats


# ---------------------------------------------------------------------------------------------
# $collStats, collStats, dbStats


def test_coll_stats_storage_stats_count_the_documents_and_their_bson(
    coll: Any, rs: EmbeddedReplicaSet
) -> None:
    coll.create_index("a")
    (doc,) = coll.aggregate([{"$collStats": {"storageStats": {}, "count": {}}}])
    assert list(doc)[:4] == ["ns", "host", "localTime", "storageStats"]
    assert doc["ns"] == coll.full_name
    assert doc["host"].endswith(f":{rs.port}")
    assert doc["count"] == 10
    stats = doc["storageStats"]
    size = sum(len(bson.encode(d)) for d in DOCS)
    assert stats["count"] == 10
    assert stats["size"] == size
    assert stats["avgObjSize"] == size // 10
    assert stats["nindexes"] == 2
    assert set(stats["indexSizes"]) == {"_id_", "a_1"}
    assert stats["totalIndexSize"] == sum(stats["indexSizes"].values())
    assert stats["storageSize"] >= size and stats["storageSize"] % 4096 == 0
    assert stats["totalSize"] == stats["storageSize"] + stats["totalIndexSize"]
    assert stats["capped"] is False and stats["scaleFactor"] == 1
    coll.insert_one({"_id": 99, "a": 1})
    assert _storage(coll)["count"] == 11


def test_coll_stats_scale_divides_the_sizes(coll: Any) -> None:
    whole, kilo = _storage(coll), _storage(coll, scale=1024)
    assert kilo["scaleFactor"] == 1024
    assert kilo["size"] == whole["size"] // 1024
    assert kilo["storageSize"] == whole["storageSize"] // 1024
    assert kilo["count"] == whole["count"]
    with pytest.raises(OperationFailure) as bad:
        _storage(coll, scale=0)
    assert bad.value.code == 51024


def test_coll_stats_latency_stats_count_the_collection_reads_and_writes(coll: Any) -> None:
    def latency() -> dict[str, Any]:
        (doc,) = coll.aggregate([{"$collStats": {"latencyStats": {"histograms": True}}}])
        stats: dict[str, Any] = doc["latencyStats"]
        return stats

    before = latency()
    assert set(before) == {"reads", "writes", "commands", "transactions"}
    list(coll.find({"a": 1}))
    coll.update_one({"_id": 1}, {"$set": {"z": 1}})
    after = latency()
    # The aggregate that read the first numbers is a read of the collection too.
    assert after["reads"]["ops"] == before["reads"]["ops"] + 2
    assert after["writes"]["ops"] == before["writes"]["ops"] + 1
    assert isinstance(after["reads"]["latency"], Int64)
    assert sum(b["count"] for b in after["writes"]["histogram"]) == after["writes"]["ops"]


def test_coll_stats_query_exec_stats_count_collection_scans_only(coll: Any) -> None:
    coll.create_index("a")

    def scans() -> int:
        (doc,) = coll.aggregate([{"$collStats": {"queryExecStats": {}}}])
        return int(doc["queryExecStats"]["collectionScans"]["total"])

    start = scans()
    list(coll.find({"a": 1}))  # the index on a answers it
    list(coll.find({"_id": 3}))  # the _id lookup
    assert scans() == start
    list(coll.find({"b": "x"}))  # no index: a collection scan
    assert scans() == start + 1


def test_coll_stats_runs_the_rest_of_the_pipeline_over_its_report(coll: Any) -> None:
    (doc,) = coll.aggregate([{"$collStats": {"count": {}}}, {"$project": {"_id": 0, "n": "$count"}}])
    assert doc == {"n": 10}


def test_coll_stats_refusals(client: pymongo.MongoClient, db_name: str, coll: Any) -> None:
    with pytest.raises(OperationFailure) as missing:
        list(client[db_name].nothing.aggregate([{"$collStats": {"storageStats": {}}}]))
    assert missing.value.code == 26
    assert "Collection [" in str(missing.value)
    with pytest.raises(OperationFailure) as second:
        list(coll.aggregate([{"$match": {}}, {"$collStats": {}}]))
    assert second.value.code == 40602
    with pytest.raises(OperationFailure) as unknown:
        list(coll.aggregate([{"$collStats": {"sizes": {}}}]))
    assert unknown.value.code == 40415


def test_coll_stats_command_agrees_with_the_stage(
    client: pymongo.MongoClient, db_name: str, coll: Any
) -> None:
    reply = client[db_name].command("collStats", "c")
    stage = _storage(coll)
    assert reply["ns"] == coll.full_name
    for key in ("count", "size", "avgObjSize", "storageSize", "nindexes", "totalIndexSize", "totalSize"):
        assert reply[key] == stage[key], key
    missing = client[db_name].command("collStats", "nothing")
    assert missing["ok"] == 1.0 and missing["count"] == 0 and missing["nindexes"] == 0


def test_db_stats_add_up_the_collections(client: pymongo.MongoClient, db_name: str, coll: Any) -> None:
    client[db_name].other.insert_one({"_id": 1})
    stats = client[db_name].command("dbStats")
    colls = [client[db_name].command("collStats", name) for name in ("c", "other")]
    assert stats["collections"] == 2
    assert stats["objects"] == 11
    assert stats["dataSize"] == sum(c["size"] for c in colls)
    assert stats["storageSize"] == sum(c["storageSize"] for c in colls)
    assert stats["indexes"] == 2
    assert stats["indexSize"] == sum(c["totalIndexSize"] for c in colls)
    assert stats["totalSize"] == stats["storageSize"] + stats["indexSize"]
    assert stats["avgObjSize"] == pytest.approx(stats["dataSize"] / 11)


# ---------------------------------------------------------------------------------------------
# explain


def _explain(db: Any, cmd: dict[str, Any], verbosity: str = "executionStats") -> dict[str, Any]:
    reply: dict[str, Any] = db.command("explain", cmd, verbosity=verbosity)
    return reply


def test_explain_find_without_an_index_is_a_collection_scan(coll: Any) -> None:
    reply = coll.find({"a": 1}).explain()  # PyMongo's default: allPlansExecution
    planner = reply["queryPlanner"]
    assert planner["namespace"] == coll.full_name
    assert planner["parsedQuery"] == {"a": {"$eq": 1}}
    assert planner["winningPlan"]["stage"] == "COLLSCAN"
    assert planner["rejectedPlans"] == []
    stats = reply["executionStats"]
    assert stats["nReturned"] == len([d for d in DOCS if d["a"] == 1])
    assert stats["totalDocsExamined"] == len(DOCS)
    assert stats["totalKeysExamined"] == 0
    assert stats["executionStages"]["stage"] == "COLLSCAN"
    assert stats["allPlansExecution"] == []
    assert reply["serverInfo"]["version"] and reply["ok"] == 1.0
    assert reply["command"]["find"] == "c"


def test_explain_find_uses_an_index_on_the_filtered_field(coll: Any) -> None:
    coll.create_index("a")
    reply = _explain(coll.database, {"find": "c", "filter": {"a": 1}})
    fetch = reply["queryPlanner"]["winningPlan"]
    assert fetch["stage"] == "FETCH"
    scan = fetch["inputStage"]
    assert (scan["stage"], scan["indexName"], scan["keyPattern"]) == ("IXSCAN", "a_1", {"a": 1})
    assert scan["indexBounds"] == {"a": ["[1, 1]"]}
    stats = reply["executionStats"]
    matching = len([d for d in DOCS if d["a"] == 1])
    assert stats["nReturned"] == matching
    assert stats["totalKeysExamined"] == matching
    assert stats["totalDocsExamined"] == matching


def test_explain_rejects_the_index_that_examines_more_keys(coll: Any) -> None:
    coll.create_index("a")
    coll.create_index("tags")
    reply = _explain(coll.database, {"find": "c", "filter": {"a": 1, "tags": 4}}, "allPlansExecution")
    winning = reply["queryPlanner"]["winningPlan"]
    assert winning["inputStage"]["indexName"] == "tags_1"
    assert winning["inputStage"]["isMultiKey"] is True
    assert winning["filter"] == {"a": {"$eq": 1}}
    (rejected,) = reply["queryPlanner"]["rejectedPlans"]
    assert rejected["inputStage"]["indexName"] == "a_1"
    assert len(reply["executionStats"]["allPlansExecution"]) == 2
    assert reply["executionStats"]["nReturned"] == len([d for d in DOCS if d["a"] == 1 and 4 in d["tags"]])


def test_explain_query_planner_verbosity_runs_nothing(coll: Any) -> None:
    reply = _explain(coll.database, {"find": "c", "filter": {"_id": 3}}, "queryPlanner")
    assert reply["queryPlanner"]["winningPlan"] == {"stage": "IDHACK"}
    assert "executionStats" not in reply


def test_explain_find_with_sort_skip_limit_and_projection(coll: Any) -> None:
    cmd = {"find": "c", "filter": {}, "sort": {"b": -1}, "skip": 2, "limit": 3, "projection": {"b": 0}}
    reply = _explain(coll.database, cmd)
    plan = reply["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "PROJECTION_SIMPLE"
    assert plan["inputStage"]["stage"] == "SKIP"
    assert plan["inputStage"]["inputStage"]["stage"] == "SORT"
    assert plan["inputStage"]["inputStage"]["limitAmount"] == 5
    assert reply["executionStats"]["nReturned"] == 3


def test_explain_aggregate_count_and_distinct(coll: Any) -> None:
    db = coll.database
    pipeline = [{"$match": {"a": {"$gte": 1}}}, {"$group": {"_id": "$a", "n": {"$sum": 1}}}]
    reply = _explain(db, {"aggregate": "c", "pipeline": pipeline, "cursor": {}})
    cursor, group = reply["stages"]
    assert cursor["$cursor"]["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"
    assert cursor["nReturned"] == len([d for d in DOCS if d["a"] >= 1])
    assert group["$group"] == pipeline[1]["$group"] and group["nReturned"] == 2
    absorbed = _explain(db, {"aggregate": "c", "pipeline": [{"$match": {"a": 2}}], "cursor": {}})
    assert absorbed["executionStats"]["nReturned"] == len([d for d in DOCS if d["a"] == 2])
    flag = db.command("aggregate", "c", pipeline=[{"$match": {"a": 2}}], explain=True)
    assert "queryPlanner" in flag and "executionStats" not in flag

    counted = _explain(db, {"count": "c", "query": {"a": 0}})
    assert counted["queryPlanner"]["winningPlan"]["stage"] == "COUNT"
    assert counted["executionStats"]["executionStages"]["nCounted"] == len([d for d in DOCS if d["a"] == 0])
    whole = _explain(db, {"count": "c"})
    assert whole["queryPlanner"]["winningPlan"]["stage"] == "RECORD_STORE_FAST_COUNT"

    coll.create_index("a")
    distinct = _explain(db, {"distinct": "c", "key": "a"})
    assert distinct["queryPlanner"]["winningPlan"]["inputStage"]["stage"] == "DISTINCT_SCAN"
    assert distinct["executionStats"]["nReturned"] == 3


def test_explain_update_and_delete_write_nothing(coll: Any) -> None:
    db = coll.database
    update = _explain(
        db, {"update": "c", "updates": [{"q": {"a": 1}, "u": {"$set": {"a": 1}}, "multi": True}]}
    )
    stage = update["executionStats"]["executionStages"]
    assert stage["stage"] == "UPDATE"
    assert stage["nMatched"] == len([d for d in DOCS if d["a"] == 1])
    assert stage["nWouldModify"] == 0  # setting a to what it is changes nothing
    changing = _explain(db, {"update": "c", "updates": [{"q": {"a": 1}, "u": {"$set": {"z": 1}}}]})
    assert changing["executionStats"]["executionStages"]["nWouldModify"] == 1
    deleting = _explain(db, {"delete": "c", "deletes": [{"q": {"a": 2}, "limit": 0}]})
    assert deleting["executionStats"]["executionStages"]["nWouldDelete"] == len(
        [d for d in DOCS if d["a"] == 2]
    )
    assert coll.count_documents({}) == len(DOCS)
    assert coll.count_documents({"z": 1}) == 0
    with pytest.raises(OperationFailure) as batch:
        _explain(db, {"delete": "c", "deletes": [{"q": {}, "limit": 0}, {"q": {}, "limit": 0}]})
    assert batch.value.code == 16


def test_explain_refusals(coll: Any) -> None:
    db = coll.database
    with pytest.raises(OperationFailure) as verbosity:
        _explain(db, {"find": "c"}, "everything")
    assert verbosity.value.code == 2
    with pytest.raises(OperationFailure) as unknown:
        _explain(db, {"frobnicate": "c"})
    assert unknown.value.code == 59
    with pytest.raises(OperationFailure) as insert:
        _explain(db, {"insert": "c", "documents": [{}]})
    assert insert.value.code == 20


# ---------------------------------------------------------------------------------------------
# replSetGetConfig


def test_repl_set_get_config_describes_the_one_member(
    client: pymongo.MongoClient, rs: EmbeddedReplicaSet
) -> None:
    reply = client.admin.command("replSetGetConfig")
    config = reply["config"]
    hello = client.admin.command("hello")
    assert config["_id"] == "rs0" == hello["setName"]
    assert config["version"] == hello["setVersion"]
    assert config["term"] == 1 and config["protocolVersion"] == 1
    (member,) = config["members"]
    assert member["_id"] == 0
    assert member["host"] == f"127.0.0.1:{rs.port}" == hello["me"]
    assert (member["arbiterOnly"], member["priority"], member["votes"]) == (False, 1, 1)
    assert (
        config["settings"]["replicaSetId"]
        == client.admin.command("replSetGetConfig")["config"]["settings"]["replicaSetId"]
    )
    assert client.admin.command("replSetGetConfig", commitmentStatus=True)["commitmentStatus"] is True
    with pytest.raises(OperationFailure) as not_admin:
        client.test.command("replSetGetConfig")
    assert not_admin.value.code == 13


def test_repl_set_get_config_on_a_shard_and_through_the_mongos(
    cluster: EmbeddedReplicaSet, mongos: pymongo.MongoClient
) -> None:
    with pytest.raises(OperationFailure) as refused:
        mongos.admin.command("replSetGetConfig")
    assert refused.value.code == 59
    assert cluster.shard_uri is not None
    with pymongo.MongoClient(cluster.shard_uri, serverSelectionTimeoutMS=10_000) as shard:
        config = shard.admin.command("replSetGetConfig")["config"]
    assert config["_id"] == "shard0"
    assert config["members"][0]["host"] == f"127.0.0.1:{cluster.shard_port}"


# ---------------------------------------------------------------------------------------------
# currentOp, $currentOp, killOp


def _ops(client: pymongo.MongoClient, **filters: Any) -> list[dict[str, Any]]:
    inprog: list[dict[str, Any]] = client.admin.command("currentOp", **filters)["inprog"]
    return inprog


def test_current_op_lists_itself(client: pymongo.MongoClient) -> None:
    (me,) = [op for op in _ops(client) if "currentOp" in op["command"]]
    assert me["active"] is True and me["op"] == "command" and me["ns"] == "admin.$cmd"
    assert isinstance(me["opid"], int) and isinstance(me["secs_running"], Int64)
    assert me["client"].startswith("127.0.0.1:") and me["desc"] == f"conn{me['connectionId']}"
    staged = list(
        client.admin.aggregate([{"$currentOp": {}}, {"$match": {"command.pipeline": {"$exists": True}}}])
    )
    assert len(staged) == 1 and staged[0]["ns"] == "admin.$cmd.aggregate"


@pytest.fixture
def blocking(rs: EmbeddedReplicaSet, client: pymongo.MongoClient) -> Iterator[str]:
    """A ``failCommand`` fail point that blocks every ``find`` of the app it names for a minute."""
    app = "blocked-app"
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode="alwaysOn",
        data={"failCommands": ["find"], "blockConnection": True, "blockTimeMS": 60_000, "appName": app},
    )
    try:
        yield app
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_current_op_shows_a_blocked_command_and_kill_op_interrupts_it(
    rs: EmbeddedReplicaSet, client: pymongo.MongoClient, db_name: str, blocking: str
) -> None:
    with pymongo.MongoClient(
        rs.uri, appName=blocking, retryReads=False, serverSelectionTimeoutMS=10_000
    ) as blocked:
        thread, errors = _in_thread(lambda: blocked[db_name].c.find_one({"a": 1}))

        def the_find() -> list[dict[str, Any]]:
            return [op for op in _ops(client, appName=blocking) if "find" in op["command"]]

        (op,) = wait_for(the_find, "the blocked find in currentOp")
        assert op["op"] == "query" and op["ns"] == f"{db_name}.c"
        assert op["command"]["filter"] == {"a": 1}
        assert op["clientMetadata"]["application"]["name"] == blocking
        assert client.admin.command("killOp", op=op["opid"])["info"] == "attempting to kill op"
        thread.join(timeout=20)
        assert not thread.is_alive(), "the killed find never answered"
    (error,) = errors
    assert isinstance(error, OperationFailure) and error.code == 11601
    assert not the_find()


def test_current_op_shows_a_change_stream_waiting_for_events(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].c
    with coll.watch(max_await_time_ms=30_000) as stream:
        thread, errors = _in_thread(stream.next)

        def the_get_more() -> list[dict[str, Any]]:
            return list(
                client.admin.aggregate(
                    [
                        {"$currentOp": {"idleCursors": True}},
                        {"$match": {"op": "getmore", "ns": coll.full_name}},
                    ]
                )
            )

        (op,) = wait_for(the_get_more, "the change stream's getMore in $currentOp")
        assert op["cursor"]["tailable"] is True and op["cursor"]["awaitData"] is True
        assert op["cursor"]["operationUsingCursorId"] == op["opid"]
        assert "$changeStream" in op["originatingCommand"]["pipeline"][0]
        coll.insert_one({"_id": "wake"})
        thread.join(timeout=20)
        assert not thread.is_alive() and not errors


def test_current_op_stage_refusals(client: pymongo.MongoClient, db_name: str) -> None:
    with pytest.raises(OperationFailure) as not_admin:
        list(client[db_name].aggregate([{"$currentOp": {}}]))
    assert not_admin.value.code == 73
    with pytest.raises(OperationFailure) as unknown:
        list(client.admin.aggregate([{"$currentOp": {"everything": True}}]))
    assert unknown.value.code == 9
    with pytest.raises(OperationFailure) as command:
        client[db_name].command("currentOp")
    assert command.value.code == 13


# ---------------------------------------------------------------------------------------------
# through a mongos


def test_through_a_mongos_stats_and_plans_are_the_shards(cluster_of_two: EmbeddedReplicaSet) -> None:
    with pymongo.MongoClient(cluster_of_two.uri, serverSelectionTimeoutMS=10_000) as mongos:
        mongos.admin.command("enableSharding", "d")
        mongos.admin.command("shardCollection", "d.spread", key={"_id": "hashed"})
        mongos.d.spread.insert_many([{"_id": i, "a": i} for i in range(40)])
        mongos.d.single.insert_many([{"_id": i} for i in range(5)])
        per_shard = list(mongos.d.spread.aggregate([{"$collStats": {"count": {}}}]))
        assert sorted(doc["shard"] for doc in per_shard) == ["shard0", "shard1"]
        assert sum(doc["count"] for doc in per_shard) == 40
        assert all(doc["count"] for doc in per_shard), "the hashed _id spreads 40 documents over both"
        (single,) = mongos.d.single.aggregate([{"$collStats": {"count": {}}}])
        assert single["count"] == 5
        whole = mongos.d.command("collStats", "spread")
        assert (
            whole["sharded"] is True and whole["count"] == 40 and set(whole["shards"]) == {"shard0", "shard1"}
        )

        merged = mongos.d.spread.find({"a": {"$gte": 10}}).explain()
        assert merged["queryPlanner"]["winningPlan"]["stage"] == "SHARD_MERGE"
        assert len(merged["queryPlanner"]["winningPlan"]["shards"]) == 2
        assert merged["executionStats"]["nReturned"] == 30
        assert merged["executionStats"]["totalDocsExamined"] == 40
        one = mongos.d.single.find().explain()
        assert one["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"
        assert one["executionStats"]["nReturned"] == 5


def test_current_op_lists_idle_cursors_and_connections_when_asked(
    client: pymongo.MongoClient, coll: Any
) -> None:
    cursor = coll.find(batch_size=2)
    next(cursor)
    plain = list(client.admin.aggregate([{"$currentOp": {}}]))
    assert all(op["type"] == "op" and op["active"] for op in plain)
    listed = list(client.admin.aggregate([{"$currentOp": {"idleCursors": True, "idleConnections": True}}]))
    (idle,) = [op for op in listed if op["type"] == "idleCursor" and op["ns"] == coll.full_name]
    assert idle["cursor"]["cursorId"] == cursor.cursor_id
    assert idle["cursor"]["nDocsReturned"] == 2 and idle["cursor"]["nBatchesReturned"] == 1
    assert idle["cursor"]["originatingCommand"]["find"] == "c"
    assert any(op["type"] == "op" and op["active"] is False for op in listed), "no idle connection listed"
    cursor.close()
