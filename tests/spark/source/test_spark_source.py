"""The ``flowwarden`` Structured Streaming source: options, offsets, exact replay and restarts."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pymongo
import pytest
from bson import Timestamp, json_util
from pymongo import monitoring
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from flowwarden.config import OnHistoryLost, SchemaMode, StartPosition
from flowwarden.errors import (
    ConfigurationError,
    HistoryLostError,
    ResumePositionError,
    StreamError,
    UnreadableOffsetError,
)
from flowwarden.events import compare_tokens
from flowwarden.mongo.raw_events import RawEvent
from flowwarden.spark import CORRUPT_RECORD_COLUMN, EVENT_COLUMNS, change_event_struct_type
from flowwarden.spark.source import reader as source_module
from flowwarden.spark.source.offsets import (
    Offset,
    PartitionedOffset,
    ReadFromOffset,
    RequestedOffset,
    SkippedOffset,
    SnapshotOffset,
    TimeOffset,
    TokenOffset,
    load_id,
    parse_offset,
)
from flowwarden.spark.source.parsing import parse_source_options
from flowwarden.spark.source.ranges import stream_offset
from flowwarden.spark.source.reader import FlowWardenStreamReader, SourceOptions, TokenRange
from flowwarden.testing import EmbeddedReplicaSet
from flowwarden_embedded.hashing import hashed_index_key

pytestmark = pytest.mark.spark


# ----------------------------------------------------------------------------------------------
# Options


def parse(**options: str) -> SourceOptions:
    return parse_source_options({"uri": "mongodb://127.0.0.1:1/?replicaSet=rs0", **options})


def test_options_parse() -> None:
    options = parse(
        database="shop",
        collection="orders",
        pipeline='[{"$match": {"operationType": "insert"}}]',
        full_document="updateLookup",
        full_document_before_change="whenAvailable",
        start_position="at_time",
        start_at="2024-05-01T12:00:00.750+02:00",
        max_events_per_trigger="500",
        on_history_lost="resume_from_now",
        schema="sku STRING",
        mode="dropmalformed",
        json_mode="relaxed",
    )
    assert options.namespace == "shop.orders"
    assert options.pipeline == ({"$match": {"operationType": "insert"}},)
    assert options.start_at == Timestamp(
        int(dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone.utc).timestamp()), 0
    )
    assert options.max_events_per_trigger == 500
    assert options.on_history_lost is OnHistoryLost.RESUME_FROM_NOW
    assert options.mode is SchemaMode.DROPMALFORMED
    assert parse(max_events_per_trigger="none").max_events_per_trigger is None
    assert parse().namespace == "*" and parse(database="shop").namespace == "shop"


def test_the_source_has_the_decorators_option_names_values_and_defaults() -> None:
    from flowwarden.config import ChangeStreamOptions, CheckpointOptions, DataFrameOptions

    defaults = parse()
    assert defaults.start_position is CheckpointOptions().start_position is StartPosition.RESUME
    assert defaults.max_await_time_ms == ChangeStreamOptions().max_await_time_ms == 1000
    assert defaults.on_history_lost is CheckpointOptions().on_history_lost
    assert defaults.mode is DataFrameOptions().mode
    assert parse(start_position="LATEST").start_position is StartPosition.LATEST
    assert parse(max_await_time_ms="250").max_await_time_ms == 250


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"uri": ""}, "the option uri is required"),
        ({"colection": "x"}, "unknown option(s) colection"),
        ({"collection": "orders"}, "collection"),
        ({"start_position": "now"}, "'now' is not a valid StartPosition"),
        ({"start_position": "AT_TIME"}, "start_position=AT_TIME needs start_at"),
        ({"start_position": "AT_TIME", "start_at": "yesterday"}, "not an ISO-8601 date-time"),
        ({"start_at": "2024-01-01T00:00:00Z"}, "start_at is only read with start_position=AT_TIME"),
        ({"max_await_time_ms": "soon"}, "max_await_time_ms 'soon' is not an int > 0"),
        ({"pipeline": "[{'$match': 1}]"}, "the pipeline is not JSON"),
        ({"pipeline": '[{"$project": {"_id": 0}}]'}, "_id"),
        ({"pipeline": '[{"$out": "x"}]'}, "not allowed in a change stream"),
        ({"full_document": "always"}, "full_document"),
        ({"max_events_per_trigger": "0"}, "max_events_per_trigger=0 is not accepted"),
        ({"on_history_lost": "ignore"}, "'ignore' is not a valid OnHistoryLost"),
        ({"mode": "lenient"}, "'lenient' is not a valid SchemaMode"),
        ({"partitions": "0"}, "partitions=0 is not accepted"),
        ({"partitions": "300"}, "partitions=300 is not accepted"),
        ({"partitions": "two"}, "partitions 'two' is not an int"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse(**options)
    assert message in str(caught.value)


def test_the_schema_of_the_source(spark: SparkSession) -> None:
    def schema(**options: str) -> Any:
        reader = spark.readStream.format("flowwarden").option("uri", "mongodb://127.0.0.1:1/")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load().schema

    assert schema() == change_event_struct_type()
    typed = schema(schema="sku STRING, qty INT, lines ARRAY<STRUCT<n: BIGINT>>")
    assert typed.fieldNames() == [*EVENT_COLUMNS, CORRUPT_RECORD_COLUMN]
    assert (
        typed["full_document"].dataType.simpleString()
        == "struct<sku:string,qty:int,lines:array<struct<n:bigint>>>"
    )
    assert schema(schema="sku STRING", mode="failfast").fieldNames() == list(EVENT_COLUMNS)
    with pytest.raises(Exception, match="unknown option"):
        schema(bogus="1")


# ----------------------------------------------------------------------------------------------
# The reader on its own: offsets and replay


def reader_for(uri: str, database: str, **options: str) -> FlowWardenStreamReader:
    source = parse_source_options({"uri": uri, "database": database, "collection": "orders", **options})
    return FlowWardenStreamReader(source, change_event_struct_type())


def read_rows(
    reader: FlowWardenStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[dict[str, Any]]:
    (partition,) = reader.partitions(start, end)
    batches = list(reader.read(partition))
    if not batches:
        return []
    result: list[dict[str, Any]] = pa.Table.from_batches(batches).to_pylist()
    return result


def numbers(rows: list[dict[str, Any]]) -> list[int]:
    return [json_util.loads(r["full_document"])["n"] for r in rows]


def typed(offset: dict[str, Any]) -> Offset:
    """An offset the reader returned to Spark, as the reader reads it back."""
    return parse_offset(offset)


def token_of(offset: dict[str, Any]) -> dict[str, str]:
    found = typed(offset)
    assert isinstance(found, TokenOffset), found
    return {"_data": found.token}


def token_range(start: dict[str, Any], end: dict[str, Any]) -> TokenRange:
    return TokenRange(stream_offset(typed(start)), stream_offset(typed(end)))


def test_offsets_are_tokens_and_a_range_replays_exactly(
    spark: SparkSession, client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name)
    try:
        collection.insert_one({"n": -1})  # before the query starts: latest skips it
        initial = reader.initialOffset()
        assert isinstance(typed(initial), TokenOffset)
        assert reader.latestOffset(initial, ReadMaxRows(5)) == initial  # nothing new: no micro-batch

        collection.insert_many([{"n": n} for n in range(12)])
        first = reader.latestOffset(initial, ReadMaxRows(5))
        second = reader.latestOffset(first, ReadMaxRows(100))
        tokens = [token_of(offset) for offset in (initial, first, second)]
        assert compare_tokens(tokens[0], tokens[1]) < 0 < compare_tokens(tokens[2], tokens[1])
        assert reader.latestOffset(second, ReadAllAvailable()) == second

        rows = read_rows(reader, initial, first)
        assert numbers(rows) == [0, 1, 2, 3, 4]
        assert rows[-1]["_id"] == token_of(first)["_data"]  # the end token is the last event's own token
        assert numbers(read_rows(reader, first, second)) == list(range(5, 12))

        # Replays of a range are identical, also after newer events and other changes arrived.
        collection.insert_many([{"n": n} for n in range(12, 15)])
        collection.update_many({}, {"$set": {"touched": True}})
        assert read_rows(reader, initial, first) == rows
        assert numbers(read_rows(reader, first, second)) == list(range(5, 12))
        third = reader.latestOffset(second, ReadMaxRows(100))
        assert numbers([r for r in read_rows(reader, second, third) if r["operation_type"] == "insert"]) == [
            12,
            13,
            14,
        ]
    finally:
        reader.stop()


def rows_of(batches: Any) -> list[dict[str, Any]]:
    batches = list(batches)
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def test_a_planned_micro_batch_reaches_its_executor_with_its_events(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    """Each range is read from MongoDB once: planning reads its events, and the partition Spark
    ships to the executor carries them, so the executor converts them without a connection. A
    range replayed from the offset log alone (no planning) is read from MongoDB, identically."""
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name)
    try:
        start = reader.initialOffset()
        collection.insert_many([{"n": n} for n in range(7)])
        end = reader.latestOffset(start, ReadMaxRows(5))
        (partition,) = reader.partitions(start, end)
        shipped = pickle.loads(pickle.dumps(partition))
        assert isinstance(shipped, TokenRange) and shipped.events is not None
        # The executor's copy of the reader, pointed at a port where no server listens.
        executor = pickle.loads(pickle.dumps(reader))
        executor.options = dataclasses.replace(
            executor.options, uri="mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=200"
        )
        planned = rows_of(executor.read(shipped))
        assert numbers(planned) == [0, 1, 2, 3, 4]
        assert rows_of(reader.read(token_range(start, end))) == planned
        # Once committed, the events are dropped; the range still replays from MongoDB.
        reader.commit(end)
        (again,) = reader.partitions(start, end)
        assert isinstance(again, TokenRange) and again.events is None
        assert rows_of(reader.read(again)) == planned
    finally:
        reader.stop()


def test_a_micro_batch_ends_where_its_events_reach_the_prefetch_bound(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name)
    try:
        start = reader.initialOffset()
        collection.insert_many([{"n": n, "pad": "x" * 1000} for n in range(6)])
        monkeypatch.setattr(source_module, "PREFETCH_BYTES", 2500)  # two events, about
        batches = []
        while sum(map(len, batches)) < 6:
            end = reader.latestOffset(start, ReadMaxRows(100))
            batches.append(numbers(read_rows(reader, start, end)))
            start = end
        assert [n for batch in batches for n in batch] == list(range(6))
        assert len(batches) >= 2 and all(1 <= len(batch) <= 3 for batch in batches)
    finally:
        reader.stop()


class _Started(monitoring.CommandListener):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.empty_get_mores = 0
        self.failed_codes: list[int | None] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "getMore" and not event.reply["cursor"]["nextBatch"]:
            self.empty_get_mores += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.failed_codes.append(event.failure.get("code"))


@pytest.mark.parametrize("limit", [100, 5, 2])
def test_an_available_now_run_ends_without_waiting_for_new_events(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str, limit: int
) -> None:
    """Once planning has read every event that existed when the availableNow run began, it
    does not ask the server again: an empty getMore would wait max_await_time_ms for nothing.
    Also when a batch ends right at the run's last event (limit 5), and when the run takes
    several micro-batches (limit 2)."""
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name, max_await_time_ms="30000")
    commands = _Started()
    reader._raw_client = pymongo.MongoClient(mongodb_uri, document_class=RawEvent, event_listeners=[commands])
    try:
        start = reader.initialOffset()
        collection.insert_many([{"n": n} for n in range(5)])
        reader.prepareForTriggerAvailableNow()
        read: list[int] = []
        end = start
        for _ in range(100):  # 5 events: far more plans than the run can take
            following = reader.latestOffset(end, ReadMaxRows(limit))
            if following == end:
                break
            read += numbers(read_rows(reader, end, following))
            end = following
        else:
            pytest.fail("the availableNow run never ended (100 plans)")
        assert read == [0, 1, 2, 3, 4]
        assert commands.empty_get_mores == 0
        planned = len(commands.names)
        assert reader.latestOffset(end, ReadMaxRows(limit)) == end
        assert len(commands.names) == planned  # the run is over without another command
        collection.insert_one({"n": 5})  # after the run began: the next run's
        assert reader.latestOffset(end, ReadMaxRows(limit)) == end
    finally:
        reader.stop()


def test_planning_and_replaying_read_the_position_without_copying_it_per_event(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyMongo's ``resume_token`` hands out a deep copy; the planner and the executor look at the
    position after every event, so they read the stream's own token instead."""
    from pymongo.synchronous.change_stream import ChangeStream

    owner = next(cls for cls in ChangeStream.__mro__ if "resume_token" in vars(cls))
    copied = vars(owner)["resume_token"]
    reads: list[int] = []
    counted = property(lambda stream: reads.append(1) or copied.fget(stream))
    monkeypatch.setattr(owner, "resume_token", counted)
    reader = reader_for(mongodb_uri, db_name)
    try:
        start = reader.initialOffset()
        client[db_name]["orders"].insert_many([{"n": n} for n in range(200)])
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadMaxRows(1000))
        reader.commit(end)  # the planned events are dropped: the executor reads them from MongoDB
        replayed = list(reader._replay(reader._resume_options(stream_offset(typed(start))), token_of(end)))
        assert len(replayed) == 200
    finally:
        reader.stop()
    assert len(reads) < 10, f"{len(reads)} copies of the position for 200 events"


def test_a_replay_ends_at_the_range_end_without_an_empty_get_more(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    """A range ending at a postBatchResumeToken is over once a batch's token reaches that end:
    asking the server once more would only wait max_await_time_ms for an empty batch."""
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name, max_await_time_ms="30000")
    try:
        start = reader.initialOffset()
        collection.insert_many([{"n": n} for n in range(5)])
        client[db_name]["other"].insert_one({})  # the oplog moves on past the last event
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadMaxRows(100))
        commands = _Started()
        reader._raw_client = pymongo.MongoClient(
            mongodb_uri, document_class=RawEvent, event_listeners=[commands]
        )
        rows = rows_of(reader.read(token_range(start, end)))
        assert numbers(rows) == [0, 1, 2, 3, 4]
        assert rows[-1]["_id"] != token_of(end)["_data"]  # the range ends past its last event
        assert commands.empty_get_mores == 0
    finally:
        reader.stop()


def test_the_next_micro_batch_is_planned_while_spark_runs_this_one(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    """Planning a range starts planning the next one in a thread; the next latestOffset takes it
    when it asks for that very range, and plans again itself when it asks for another or when
    the plan made ahead found nothing (events written since must not wait a trigger)."""
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name)
    commands = _Started()
    reader._raw_client = pymongo.MongoClient(mongodb_uri, document_class=RawEvent, event_listeners=[commands])
    try:
        start = reader.initialOffset()
        collection.insert_many([{"n": n} for n in range(9)])
        first = reader.latestOffset(start, ReadMaxRows(4))
        second_ahead = reader._ahead._future
        assert second_ahead is not None
        second_ahead.result()  # planned while the first micro-batch would run
        aggregates = commands.names.count("aggregate")
        second = reader.latestOffset(first, ReadMaxRows(4))
        third_ahead = reader._ahead._future
        assert third_ahead is not None and third_ahead is not second_ahead
        third_ahead.result()
        # The plan made ahead was taken: no stream opened for it, only for the one after it.
        assert commands.names.count("aggregate") == aggregates + 1
        assert numbers(read_rows(reader, start, first)) == [0, 1, 2, 3]
        assert numbers(read_rows(reader, first, second)) == [4, 5, 6, 7]
        # Asked for another limit than the plan made ahead: planned again, for that limit.
        third = reader.latestOffset(second, ReadMaxRows(100))
        assert numbers(read_rows(reader, second, third)) == [8]
        # The plan made ahead from `third` found nothing; what is written since is read now.
        ahead = reader._ahead._future
        assert ahead is not None and ahead.result().end == typed(third)
        collection.insert_one({"n": 9})
        fourth = reader.latestOffset(third, ReadMaxRows(100))
        assert numbers(read_rows(reader, third, fourth)) == [9]
    finally:
        reader.stop()
    assert reader._ahead._future is None and reader._ahead._pool is None


def needs_hashed_index_keys(client: pymongo.MongoClient[dict[str, Any]]) -> None:
    """Partitioned reads filter with $toHashedIndexKey, which MongoDB has from 7.0."""
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"partitions need MongoDB 7.0+ ($toHashedIndexKey); the deployment runs {found}")


def test_partitions_split_the_stream_by_document_and_replay_exactly(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    """partitions=3: an offset is a vector of three tokens; each micro-batch is three input
    partitions, one per hash bucket of documentKey._id; every event is in exactly one of them,
    every document's events in one bucket, in stream order; a range read again is identical."""
    needs_hashed_index_keys(client)
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name, partitions="3")
    try:
        start = reader.initialOffset()
        offset = typed(start)
        assert isinstance(offset, PartitionedOffset) and len(offset.buckets) == 3
        collection.insert_many([{"_id": n} for n in range(40)])
        collection.update_many({"_id": {"$lt": 20}}, {"$inc": {"v": 1}})
        collection.delete_many({"_id": {"$gte": 35}})
        buckets: list[list[tuple[str, int]]] = [[], [], []]
        batches = 0
        for _ in range(100):  # 60 events, 15 per batch: far more plans than the run can take
            end = reader.latestOffset(start, ReadMaxRows(15))
            if end == start:
                break
            batches += 1
            parts = reader.partitions(start, end)
            assert [p.bucket for p in parts] == [(0, 3), (1, 3), (2, 3)]
            for part in parts:
                rows = rows_of(reader.read(pickle.loads(pickle.dumps(part))))
                assert rows_of(reader.read(part)) == rows  # replays are identical
                buckets[part.bucket[0]] += [
                    (r["operation_type"], json_util.loads(r["document_key"])["_id"]) for r in rows
                ]
            start = end
        else:
            pytest.fail("the run never ended (100 plans)")
        assert batches >= 4  # 65 events, at most 5 per bucket per micro-batch
        events = [event for bucket in buckets for event in bucket]
        assert len(events) == 65 and len(set(events)) == 65
        assert all(buckets)  # the hash spreads 40 documents over every bucket
        for bucket in buckets:
            for key in {key for _, key in bucket}:
                kinds = [kind for kind, k in bucket if k == key]
                expected = ["insert", *(["update"] if key < 20 else []), *(["delete"] if key >= 35 else [])]
                assert kinds == expected, (key, kinds)
        # Each document sits in the bucket of its hashed index key, as mongod computes it.
        for index, bucket in enumerate(buckets):
            assert {hashed_index_key(key) % 3 for _, key in bucket} == {index}
    finally:
        reader.stop()


def test_a_query_keeps_the_partitions_it_started_with(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    reader = reader_for(mongodb_uri, db_name, partitions="2")
    single = reader_for(mongodb_uri, db_name)
    try:
        offset = single.initialOffset()
        with pytest.raises(ConfigurationError, match=r"holds offsets for 1 partition\(s\).*partitions=2"):
            reader.latestOffset(offset, ReadMaxRows(10))
        vector = PartitionedOffset((TokenOffset(token_of(offset)["_data"]),) * 3).to_dict()
        with pytest.raises(ConfigurationError, match=r"holds offsets for 3 partition\(s\).*partitions=2"):
            reader.latestOffset(vector, ReadMaxRows(10))
        with pytest.raises(ConfigurationError, match=r"holds offsets for 3 partition\(s\).*partitions=1"):
            single.latestOffset(vector, ReadMaxRows(10))
    finally:
        reader.stop()
        single.stop()


def test_each_call_spark_makes_with_offsets_refuses_one_of_another_format_version() -> None:
    """Spark hands the reader offsets from the query's checkpointLocation in latestOffset,
    partitions and commit: each reads them before anything else, and refuses one it cannot."""
    reader = reader_for("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=200", "shop")
    good = TokenOffset("82AB01").to_dict()
    newer = {**good, "v": 2}
    calls: list[Callable[[], object]] = [
        lambda: reader.latestOffset(newer, ReadMaxRows(10)),
        lambda: reader.partitions(newer, good),
        lambda: reader.partitions(good, newer),
        lambda: reader.commit(newer),
    ]
    try:
        for call in calls:
            with pytest.raises(UnreadableOffsetError) as caught:
                call()
            message = str(caught.value)
            assert message.startswith("flowwarden streaming source shop.orders: the query's checkpoint")
            assert "its format version is 2" in message and "new checkpointLocation" in message
    finally:
        reader.stop()


def test_a_filter_on_the_looked_up_document_plans_the_events_it_reads(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    """An update matches a $match on fullDocument only through its looked-up document: the
    planning stream must look it up too, or the range would end before the event."""
    collection = client[db_name]["orders"]
    reader = reader_for(
        mongodb_uri,
        db_name,
        full_document="updateLookup",
        pipeline=json.dumps([{"$match": {"fullDocument.qty": {"$gte": 5}}}]),
    )
    try:
        initial = reader.initialOffset()
        collection.insert_one({"_id": 1, "n": 1, "qty": 1})
        collection.update_one({"_id": 1}, {"$set": {"qty": 7}})
        end = reader.latestOffset(initial, ReadMaxRows(1))
        rows = read_rows(reader, initial, end)
        assert [(r["operation_type"], json_util.loads(r["full_document"])["qty"]) for r in rows] == [
            ("update", 7)
        ]
    finally:
        reader.stop()


def test_start_positions(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    next_server_second: Callable[[], dt.datetime],
) -> None:
    collection = client[db_name]["orders"]
    collection.insert_many([{"n": n} for n in range(3)])
    after = next_server_second()
    collection.insert_many([{"n": n} for n in range(3, 6)])

    timed = reader_for(mongodb_uri, db_name, start_position="AT_TIME", start_at=after.isoformat())
    try:
        start = timed.initialOffset()
        assert typed(start) == TimeOffset(Timestamp(int(after.timestamp()), 0))
        end = timed.latestOffset(start, ReadAllAvailable())
        assert numbers(read_rows(timed, start, end)) == [3, 4, 5]
    finally:
        timed.stop()


@pytest.mark.embedded_only
def test_earliest_reads_the_whole_oplog() -> None:
    with EmbeddedReplicaSet() as rs, pymongo.MongoClient[dict[str, Any]](rs.uri) as client:
        client.shop.orders.insert_many([{"n": n} for n in range(4)])
        reader = reader_for(rs.uri, "shop", start_position="EARLIEST")
        try:
            start = reader.initialOffset()
            assert isinstance(typed(start), TimeOffset)
            end = reader.latestOffset(start, ReadMaxRows(3))
            assert numbers(read_rows(reader, start, end)) == [0, 1, 2]
        finally:
            reader.stop()


@pytest.mark.embedded_only
def test_history_lost() -> None:
    with EmbeddedReplicaSet(oplog_max_events=20) as rs, pymongo.MongoClient[dict[str, Any]](rs.uri) as client:
        orders = client.shop.orders

        def reader(strategy: str) -> FlowWardenStreamReader:
            return reader_for(rs.uri, "shop", on_history_lost=strategy)

        fail = reader("fail")
        start = fail.initialOffset()
        orders.insert_many([{"n": n} for n in range(60)])  # the oplog keeps the last 20 entries

        with pytest.raises(HistoryLostError, match="no longer in the oplog"):
            fail.latestOffset(start, ReadMaxRows(1000))

        skip = reader("resume_from_now")
        skipped = skip.latestOffset(start, ReadMaxRows(1000))
        assert isinstance(typed(skipped), SkippedOffset)
        assert read_rows(skip, start, skipped) == []
        orders.insert_one({"n": 60})
        after = skip.latestOffset(skipped, ReadMaxRows(1000))
        assert numbers(read_rows(skip, skipped, after)) == [60]

        oldest = reader("resume_from_oplog_start")
        end = oldest.latestOffset(start, ReadMaxRows(5))
        assert isinstance(typed(end), ReadFromOffset)
        replay = numbers(read_rows(oldest, start, end))
        assert len(replay) == 5 and replay == sorted(replay) and replay[0] >= 40
        assert numbers(read_rows(oldest, start, end)) == replay  # the same range replays the same
        for r in (fail, skip, oldest):
            r.stop()


BSON_OBJECT_TOO_LARGE = 10334


def _fail_getmore(client: pymongo.MongoClient[dict[str, Any]], times: int, code: int) -> None:
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": times},
        data={"failCommands": ["getMore"], "errorCode": code, "appName": "flowwarden-spark"},
    )


def test_transient_errors_are_waited_out_and_a_replay_returns_nothing_twice(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    collection = client[db_name]["orders"]
    reader = reader_for(mongodb_uri, db_name)
    try:
        initial = reader.initialOffset()
        collection.insert_many([{"n": n} for n in range(30)])
        # HostUnreachable without the label PyMongo resumes on: the driver gives up, the source not.
        _fail_getmore(client, 3, 6)
        end = reader.latestOffset(initial, ReadMaxRows(30))
        _fail_getmore(client, 3, 6)
        assert numbers(read_rows(reader, initial, end)) == list(range(30))
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        reader.stop()


def test_errors_that_are_not_transient_fail_at_once(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    reader = reader_for(mongodb_uri, db_name)
    # This reader's own commands: other tests' readers share the server and the fail point.
    commands = _Started()
    reader._client = pymongo.MongoClient(mongodb_uri, appname="flowwarden-spark", event_listeners=[commands])
    reader._raw_client = pymongo.MongoClient(
        mongodb_uri, appname="flowwarden-spark", document_class=RawEvent, event_listeners=[commands]
    )
    try:
        initial = reader.initialOffset()
        client[db_name]["orders"].insert_one({"n": 1})
        _fail_getmore(client, 10, 2)  # BadValue: not known to be transient; would fail ten reads
        with pytest.raises(pymongo.errors.OperationFailure, match="Failing command"):
            reader.latestOffset(initial, ReadMaxRows(10))
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        reader.stop()
    assert commands.failed_codes == [2], f"failed reads {commands.failed_codes}: a fatal error was retried"


def test_a_position_the_server_cannot_find_is_refused_with_a_hint(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    with client[db_name]["other"].watch() as other:
        client[db_name]["other"].insert_one({"_id": 1})
        foreign = TokenOffset(other.next()["_id"]["_data"]).to_dict()
    client[db_name]["orders"].insert_one({"n": 1})
    reader = reader_for(mongodb_uri, db_name)
    try:
        with pytest.raises(ResumePositionError, match="new checkpointLocation"):
            reader.latestOffset(foreign, ReadMaxRows(10))
    finally:
        reader.stop()


# ----------------------------------------------------------------------------------------------
# Streaming queries


def source(spark: SparkSession, uri: str, database: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("flowwarden")
        .option("uri", uri)
        .option("database", database)
        .option("collection", "orders")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.parametrize("partitions", ["1", "3"])
def test_restarted_three_times_every_event_once_in_order(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    tmp_path: Path,
    partitions: str,
) -> None:
    """Also read as three hash buckets, each its own change stream and input partition, whose
    offsets are a vector of three tokens: every event once, after three restarts."""
    if partitions != "1":
        needs_hashed_index_keys(client)
    orders = client[db_name]["orders"]
    start_at = dt.datetime.now(dt.timezone.utc).isoformat()
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    written = 0

    def insert(count: int) -> None:
        nonlocal written
        orders.insert_many([{"n": n} for n in range(written, written + count)])
        written += count

    def run(trigger: dict[str, Any]) -> Any:
        stream = source(
            spark,
            mongodb_uri,
            db_name,
            start_position="AT_TIME",
            start_at=start_at,
            max_events_per_trigger="7",
            partitions=partitions,
        )
        return (
            stream.writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )

    insert(30)
    assert run({"availableNow": True}).awaitTermination(120), "the first run did not end"

    insert(25)
    orders.update_many({"n": {"$lt": 5}}, {"$set": {"seen": True}})
    assert run({"availableNow": True}).awaitTermination(120), "restart 1 did not end"

    # Restart 2: a continuous query stopped in the middle of its work while writes go on.
    query = run({"processingTime": "100 milliseconds"})

    def keep_writing() -> None:
        for _ in range(6):
            insert(5)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    deadline = time.monotonic() + 60
    while sum(p["numInputRows"] for p in query.recentProgress) < 20:
        assert time.monotonic() < deadline, "the continuous query read fewer than 20 rows in 60 s"
        time.sleep(0.05)
    query.stop()
    writer.join()

    insert(10)
    assert run({"availableNow": True}).awaitTermination(120), "restart 3 (draining the rest) did not end"

    rows = spark.read.parquet(output).select("_id", "operation_type", "full_document").collect()
    ids = [r["_id"] for r in rows]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    ordered = sorted(rows, key=lambda r: r["_id"])
    inserted = [json_util.loads(r["full_document"])["n"] for r in ordered if r["operation_type"] == "insert"]
    assert inserted == list(range(written)), "events missing or out of order"
    assert sum(1 for r in rows if r["operation_type"] == "update") == 5


def source_offset_file(checkpoint: str) -> Path:
    """The newest file of the query's offsets log, after removing its checksum so it can be
    edited: Spark's local file system verifies ``.<name>.crc`` only when there is one."""
    offsets = Path(checkpoint) / "offsets"
    newest = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    (offsets / f".{newest.name}.crc").unlink(missing_ok=True)
    return newest


def edit_source_offset(path: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    # Spark's log version, the batch's metadata, then one offset per source: this query has one.
    header, metadata, offset = path.read_text(encoding="utf-8").splitlines()
    assert header == "v1", header
    path.write_text("\n".join([header, metadata, json.dumps(edit(json.loads(offset)))]), encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda offset: {**offset, "v": 99}, "its format version is 99, and this release reads version 1"),
        (lambda offset: {"_data": offset["token"]}, "it has no format version, and this release reads"),
        (
            lambda offset: {"v": 1, "kind": "token", "_data": offset["token"]},
            "the field(s) 'token' of a token offset are missing",
        ),
    ],
    ids=["unknown-version", "no-version", "malformed"],
)
def test_a_query_whose_offsets_log_holds_an_offset_it_cannot_read_fails_saying_what_to_do(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    tmp_path: Path,
    edit: Callable[[dict[str, Any]], dict[str, Any]],
    reason: str,
) -> None:
    checkpoint = str(tmp_path / "checkpoint")

    def run() -> Any:
        return (
            source(spark, mongodb_uri, db_name)
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    client[db_name]["orders"].insert_one({"n": 0})
    assert run().awaitTermination(120), "the first run did not end"
    path = source_offset_file(checkpoint)
    edit_source_offset(path, edit)
    edited = path.read_text(encoding="utf-8")
    client[db_name]["orders"].insert_one({"n": 1})
    with pytest.raises(StreamingQueryException) as caught:
        run().awaitTermination(120)
    message = str(caught.value)
    assert "UnreadableOffsetError: flowwarden streaming source" in message
    assert reason in message
    assert "Start the query with a new checkpointLocation" in message
    assert "the flowwarden version that wrote this checkpointLocation" in message
    assert path.read_text(encoding="utf-8") == edited, "the offsets log was changed"


def test_a_failed_micro_batch_replays_the_same_events(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    tmp_path: Path,
) -> None:
    orders = client[db_name]["orders"]
    start_at = dt.datetime.now(dt.timezone.utc).isoformat()
    orders.insert_many([{"n": n} for n in range(20)])
    attempts: dict[int, list[list[str]]] = {}

    def sink(batch: DataFrame, batch_id: int) -> None:
        ids = [r["_id"] for r in batch.select("_id").collect()]
        attempts.setdefault(batch_id, []).append(ids)
        if batch_id == 1 and len(attempts[batch_id]) == 1:
            orders.insert_many([{"n": n} for n in range(20, 30)])  # newer events must not leak in
            raise RuntimeError("the sink failed after reading the batch")

    def run() -> Any:
        return (
            source(
                spark,
                mongodb_uri,
                db_name,
                start_position="AT_TIME",
                start_at=start_at,
                max_events_per_trigger="8",
            )
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    with pytest.raises(StreamingQueryException, match="the sink failed"):
        run().awaitTermination(120)
    assert run().awaitTermination(120), "the restarted query did not end"

    assert len(attempts[1]) == 2 and attempts[1][0] == attempts[1][1] and len(attempts[1][0]) == 8
    delivered = [i for batch_id in sorted(attempts) for i in attempts[batch_id][-1]]
    assert len(delivered) == 30 and delivered == sorted(delivered)


def test_pipeline_update_lookup_and_typed_documents(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    tmp_path: Path,
) -> None:
    orders = client[db_name]["orders"]
    start_at = dt.datetime.now(dt.timezone.utc).isoformat()
    orders.insert_many([{"_id": 1, "sku": "a", "qty": 1}, {"_id": 2, "sku": "b", "qty": "many"}])
    orders.update_one({"_id": 1}, {"$set": {"qty": 5}})
    orders.delete_one({"_id": 2})
    stream = source(
        spark,
        mongodb_uri,
        db_name,
        start_position="AT_TIME",
        start_at=start_at,
        pipeline=json.dumps([{"$match": {"operationType": {"$in": ["insert", "update"]}}}]),
        full_document="updateLookup",
        schema="sku STRING, qty INT",
    )
    name = f"typed_{db_name}"
    query = stream.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    assert query.awaitTermination(120), "the availableNow query did not end"
    rows = spark.sql(
        "SELECT operation_type, full_document.sku, full_document.qty, updated_fields, "
        f"{CORRUPT_RECORD_COLUMN} FROM {name} ORDER BY _id"
    ).collect()
    assert [tuple(r) for r in rows] == [
        ("insert", "a", 1, None, None),
        ("insert", "b", None, None, '{"_id":{"$numberInt":"2"},"sku":"b","qty":"many"}'),
        ("update", "a", 5, '{"qty":{"$numberInt":"5"}}', None),
    ]


def test_an_inferred_schema_types_documents_and_rescues_the_rest(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
) -> None:
    orders = client[db_name]["orders"]
    orders.insert_many(
        [{"_id": i, "sku": f"s{i}", "qty": i, "tag": i if i % 2 else "even"} for i in range(4)]
    )
    start_at = dt.datetime.now(dt.timezone.utc).isoformat()
    stream = source(
        spark,
        mongodb_uri,
        db_name,
        start_position="AT_TIME",
        start_at=start_at,
        schema="infer",
        sample_size="100",
        schema_hints="sku STRING, qty BIGINT",
    )
    # The sample was drawn when the source was created: this document is not in it.
    orders.insert_one({"_id": 10, "sku": "new", "qty": "lots", "tag": 3, "added": True})
    document = stream.schema["full_document"].dataType.simpleString()
    assert document == "struct<_id:int,qty:bigint,sku:string,tag:string>"
    assert stream.columns[-1] == "_rescued_data"
    name = f"inferred_{db_name}"
    query = stream.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    assert query.awaitTermination(120), "the availableNow query did not end"
    # (AT_TIME starts at a whole second: the sampled inserts may be read too)
    query_text = f"SELECT full_document, _rescued_data FROM {name} WHERE full_document._id = 10"
    (row,) = spark.sql(query_text).collect()
    # tag met an int and a string in the sample: Extended JSON; qty "lots" and the new key are rescued
    assert row.full_document.asDict() == {"_id": 10, "qty": None, "sku": "new", "tag": '{"$numberInt":"3"}'}
    assert json_util.loads(row._rescued_data) == {"full_document": {"qty": "lots", "added": True}}


def test_schema_infer_needs_a_collection() -> None:
    with pytest.raises(ConfigurationError, match="schema=infer samples the watched collection"):
        parse_source_options({"uri": "mongodb://127.0.0.1:1/", "database": "shop", "schema": "infer"})
    with pytest.raises(ConfigurationError, match="schema_hints applies to an inferred schema only"):
        parse_source_options({"uri": "mongodb://127.0.0.1:1/", "database": "shop", "collection": "o",
                             "schema_hints": "qty BIGINT"})


def test_not_null_fields_are_refused_with_a_reason() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    # What Spark hands the reader for the option schema="sku STRING NOT NULL".
    document = StructType([StructField("sku", StringType(), nullable=False)])
    typed = change_event_struct_type(document)
    fields = [
        StructField(f.name, document) if f.name.startswith("full_document") else f for f in typed.fields
    ]
    source = parse_source_options({"uri": "mongodb://127.0.0.1:1/", "schema": "sku STRING NOT NULL"})
    with pytest.raises(ConfigurationError, match=r"full_document\.sku NOT NULL"):
        FlowWardenStreamReader(source, StructType(fields))


# ----------------------------------------------------------------------------------------------
# Events over 16 MB

HALF = 8_400_000
IMAGES = {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"}


def imaged_orders(
    client: pymongo.MongoClient[dict[str, Any]], db_name: str
) -> pymongo.collection.Collection[dict[str, Any]]:
    """``orders`` recording pre-images, with ``{_id: 1, a: <HALF bytes>}``: updating it makes an
    event just over 16 MB once both images are in it; splitting it needs MongoDB 7.0+."""
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"needs MongoDB 7.0+ ($changeStreamSplitLargeEvent); the deployment runs {found}")
    db = client[db_name]
    db.create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    db.orders.insert_one({"_id": 1, "a": "x" * HALF})
    return db.orders


def offset_tokens(offset: dict[str, Any]) -> list[str]:
    found = typed(offset)
    parts = found.buckets if isinstance(found, PartitionedOffset) else (found,)
    return [part.token for part in parts if isinstance(part, TokenOffset)]


@pytest.mark.parametrize("partitions", ["1", "2"])
def test_split_large_events_reads_a_large_event_as_one_row_and_never_ends_a_range_inside_it(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str, partitions: str
) -> None:
    """One event per micro-batch (per bucket): the range of the large event ends at its last
    fragment's token, never at the first fragment's, and its one row holds both images."""
    orders = imaged_orders(client, db_name)
    reader = reader_for(mongodb_uri, db_name, split_large_events="true", partitions=partitions, **IMAGES)
    try:
        start = reader.initialOffset()
        with orders.watch([{"$changeStreamSplitLargeEvent": {}}], **IMAGES) as split:
            orders.update_one({"_id": 1}, {"$set": {"b": 1}})
            orders.insert_one({"_id": 2})
            first, last = split.next()["_id"]["_data"], split.next()["_id"]["_data"]
        rows: list[dict[str, Any]] = []
        ends: list[str] = []
        offset = start
        deadline = time.monotonic() + 60
        while len(rows) < 2 and time.monotonic() < deadline:
            end = reader.latestOffset(offset, ReadMaxRows(1))
            for part in reader.partitions(offset, end):
                planned = rows_of(reader.read(part))
                assert rows_of(reader.read(TokenRange(part.start, part.end, bucket=part.bucket))) == planned
                rows += planned
            ends += offset_tokens(end)
            offset = end
    finally:
        reader.stop()

    assert len(rows) >= 2, f"the reader read {len(rows)} of the 2 rows in 60 s"
    assert first not in ends and last in ends
    if partitions == "1":
        assert ends[0] == last
    assert sorted((r["operation_type"], json_util.loads(r["document_key"])["_id"]) for r in rows) == [
        ("insert", 2),
        ("update", 1),
    ]
    (update,) = [r for r in rows if r["operation_type"] == "update"]
    assert update["_id"] == last
    assert json_util.loads(update["full_document"]) == {"_id": 1, "a": "x" * HALF, "b": 1}
    assert json_util.loads(update["full_document_before_change"]) == {"_id": 1, "a": "x" * HALF}


def test_without_split_large_events_a_large_event_fails_at_once_naming_the_option(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    orders = imaged_orders(client, db_name)
    reader = reader_for(mongodb_uri, db_name, **IMAGES)
    commands = _Started()
    reader._raw_client = pymongo.MongoClient(mongodb_uri, document_class=RawEvent, event_listeners=[commands])
    try:
        start = reader.initialOffset()
        orders.update_one({"_id": 1}, {"$set": {"b": 1}})
        with pytest.raises(StreamError) as caught:
            reader.latestOffset(start, ReadMaxRows(10))
    finally:
        reader.stop()
    # Fatal: the read that met the event was not sent again (nor the stream opened again).
    assert commands.failed_codes == [BSON_OBJECT_TOO_LARGE], commands.failed_codes
    assert '.option("split_large_events", "true")' in str(caught.value)
    assert isinstance(caught.value.__cause__, pymongo.errors.OperationFailure)
    assert caught.value.__cause__.code == 10334


def test_a_query_with_split_large_events_writes_one_row_for_a_large_event(
    spark: SparkSession, client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    orders = imaged_orders(client, db_name)
    start_at = dt.datetime.now(dt.timezone.utc).isoformat()
    orders.update_one({"_id": 1}, {"$set": {"b": 1}})
    orders.insert_one({"_id": 2})
    stream = source(
        spark,
        mongodb_uri,
        db_name,
        start_position="AT_TIME",
        start_at=start_at,
        split_large_events="true",
        **IMAGES,
    )
    name = f"large_{db_name}"
    query = stream.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    assert query.awaitTermination(120), "the availableNow query did not end"
    rows = spark.sql(
        "SELECT operation_type, document_key, length(full_document_before_change) AS before "
        f"FROM {name} ORDER BY _id"
    ).collect()
    # start_at counts whole seconds: the insert of document 1 may be in the range too.
    events = [(r["operation_type"], json_util.loads(r["document_key"])["_id"], r["before"]) for r in rows]
    (update, inserted) = [e for e in events if e[:2] != ("insert", 1)]
    assert update[:2] == ("update", 1) and update[2] > HALF
    assert inserted == ("insert", 2, None)


# ----------------------------------------------------------------------------------------------
# The initial snapshot


def snapshot_offset(offset: dict[str, Any]) -> SnapshotOffset:
    found = typed(offset)
    assert isinstance(found, SnapshotOffset), found
    return found


def test_snapshot_offsets_cover_the_copy_then_the_changes_and_replay_the_same_rows(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i, "n": i} for i in range(12)])
    reader = reader_for(mongodb_uri, db_name, snapshot="initial")
    try:
        initial = reader.initialOffset()
        copy = typed(initial)
        assert isinstance(copy, SnapshotOffset) and copy.namespaces == (f"{db_name}.orders",)
        first = reader.latestOffset(initial, ReadMaxRows(5))
        second = reader.latestOffset(first, ReadMaxRows(5))
        third = reader.latestOffset(second, ReadMaxRows(5))
        closed = reader.latestOffset(third, ReadMaxRows(5))
        assert [snapshot_offset(o).copied for o in (first, second, third)] == [5, 10, 12]
        assert snapshot_offset(closed).done and snapshot_offset(closed).copied == 12
        orders.insert_one({"_id": 12, "n": 12})  # after the copy began: a change, not a row
        changes = reader.latestOffset(closed, ReadMaxRows(5))
        assert isinstance(typed(changes), TokenOffset)

        copied = [read_rows(reader, a, b) for a, b in ((initial, first), (first, second), (second, third))]
        assert [numbers(rows) for rows in copied] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
        assert all(r["operation_type"] == "snapshot" and r["_id"] is None for rows in copied for r in rows)
        assert read_rows(reader, third, closed) == []
        assert [(r["operation_type"], numbers([r])) for r in read_rows(reader, closed, changes)] == [
            ("insert", [12])
        ]

        # Read again without planning (a replay after a restart): the same _id ranges.
        again = reader_for(mongodb_uri, db_name, snapshot="initial")
        try:
            assert [numbers(read_rows(again, a, b)) for a, b in ((initial, first), (second, third))] == [
                [0, 1, 2, 3, 4],
                [10, 11],
            ]
        finally:
            again.stop()
    finally:
        reader.stop()


def test_the_copy_stops_at_the_bound_its_offsets_carry_also_for_a_restarted_reader(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i, "n": i} for i in range(8)])
    reader = reader_for(mongodb_uri, db_name, snapshot="initial")
    try:
        initial = reader.initialOffset()
        assert load_id(snapshot_offset(initial).end_id) == 7
        orders.insert_many([{"_id": i, "n": i} for i in range(8, 20)])  # after the copy began
        first = reader.latestOffset(initial, ReadMaxRows(5))
    finally:
        reader.stop()
    # A restarted query plans on from the offsets Spark logged, with more inserted meanwhile.
    orders.insert_many([{"_id": i, "n": i} for i in range(20, 30)])
    again = reader_for(mongodb_uri, db_name, snapshot="initial")
    try:
        second = again.latestOffset(first, ReadMaxRows(5))
        closed = again.latestOffset(second, ReadMaxRows(5))
        assert snapshot_offset(closed).done and snapshot_offset(closed).copied == 8
        changes = again.latestOffset(closed, ReadMaxRows(100))
        copied = [numbers(read_rows(again, a, b)) for a, b in ((initial, first), (first, second))]
        assert copied == [[0, 1, 2, 3, 4], [5, 6, 7]]
        inserted = [(r["operation_type"], *numbers([r])) for r in read_rows(again, closed, changes)]
        assert inserted == [("insert", i) for i in range(8, 30)]
    finally:
        again.stop()


def test_a_query_with_a_snapshot_restarted_mid_copy_delivers_every_document_and_change_once(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    tmp_path: Path,
) -> None:
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i, "n": i} for i in range(40)])
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run(trigger: dict[str, Any]) -> None:
        stream = source(spark, mongodb_uri, db_name, snapshot="initial", max_events_per_trigger="15")
        query = (
            stream.writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )
        assert query.awaitTermination(120), "the query did not end"

    run({"once": True})  # one micro-batch: part of the copy
    orders.update_one({"_id": 3}, {"$set": {"n": 103}})  # copied already: arrives as its change
    orders.insert_one({"_id": 40, "n": 40})  # past the copy's bound: arrives as its change only
    run({"once": True})  # restarted in the middle of the copy
    run({"availableNow": True})  # the rest of the copy, then the changes

    rows = spark.read.parquet(output).select("operation_type", "document_key", "full_document").collect()
    copied = sorted(
        json_util.loads(r["document_key"])["_id"] for r in rows if r["operation_type"] == "snapshot"
    )
    assert copied == list(range(40)), "each document that existed when the copy began, once"
    changes = sorted(
        (r["operation_type"], json_util.loads(r["document_key"])["_id"])
        for r in rows
        if r["operation_type"] != "snapshot"
    )
    assert changes == [("insert", 40), ("update", 3)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"snapshot": "when_needed"}, "when_needed"),
        ({"snapshot": "initial", "start_position": "EARLIEST"}, "start_position=EARLIEST"),
        ({"snapshot": "initial", "partitions": "2"}, "one partition"),
    ],
)
def test_snapshots_a_query_cannot_take_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse(**options)


# ----------------------------------------------------------------------------------------------
# Incremental snapshots (flowwarden snapshot request NAME, .option("name", NAME))


def requested_offset(offset: dict[str, Any]) -> RequestedOffset:
    found = typed(offset)
    assert isinstance(found, RequestedOffset), found
    return found


def request_for(client: pymongo.MongoClient[dict[str, Any]], db: str, **options: Any) -> str:
    from flowwarden.mongo.calls import run
    from flowwarden.mongo.signals import SIGNALS_COLLECTION, insert_request, request_document

    return run(insert_request(client[db][SIGNALS_COLLECTION], request_document("orders-query", **options)))


def kinds(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["operation_type"], json_util.loads(r["document_key"])["_id"]) for r in rows]


def test_requested_snapshot_offsets_carry_the_copy_between_the_changes_and_replay_it(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flowwarden.spark.source import requested

    monkeypatch.setattr(requested, "REQUEST_POLL_SECONDS", 0.0)
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i, "n": i} for i in range(12)])
    find = requested._find
    changed: list[bool] = []

    def find_then_change(*args: Any) -> list[Any]:
        found = find(*args)
        if not changed and args[6] is not None:  # the first chunk's read, before its watermark
            orders.update_one({"_id": 3}, {"$set": {"n": 103}})
            orders.delete_one({"_id": 4})
            orders.insert_one({"_id": 100, "n": 100})
            changed.append(True)
        return found

    monkeypatch.setattr(requested, "_find", find_then_change)
    reader = reader_for(mongodb_uri, db_name, name="orders-query")
    try:
        initial = reader.initialOffset()
        assert reader.latestOffset(initial, ReadMaxRows(100)) == initial  # caught up, nothing yet
        request = request_for(client, db_name, chunk_size=5)
        first = reader.latestOffset(initial, ReadMaxRows(100))
        second = reader.latestOffset(first, ReadMaxRows(100))
        third = reader.latestOffset(second, ReadMaxRows(100))
        assert [requested_offset(o).copied for o in (first, second, third)] == [3, 8, 10]
        assert requested_offset(first).request == request
        assert requested_offset(first).low < requested_offset(first).high
        assert reader.latestOffset(third, ReadMaxRows(100)) == third  # done, no change since
        orders.insert_one({"_id": 13, "n": 13})
        changes = reader.latestOffset(third, ReadMaxRows(100))
        assert isinstance(typed(changes), TokenOffset)
        ranges = [(initial, first), (first, second), (second, third), (third, changes)]
        planned = [kinds(read_rows(reader, a, b)) for a, b in ranges]
    finally:
        reader.stop()
    # The changes made while the first chunk was read come first and win over its rows.
    assert planned == [
        [("update", 3), ("delete", 4), ("insert", 100), *[("snapshot", i) for i in (0, 1, 2)]],
        [("snapshot", i) for i in range(5, 10)],
        [("snapshot", 10), ("snapshot", 11)],
        [("insert", 13)],
    ]
    signal = client[db_name]["_fw_signals"].find_one({"kind": "snapshot"})
    assert signal["finished"] == ["orders-query"]
    # Read again without planning (a replay after a restart): the same rows.
    again = reader_for(mongodb_uri, db_name, name="orders-query")
    try:
        assert [kinds(read_rows(again, a, b)) for a, b in ranges] == planned
    finally:
        again.stop()


def test_a_cancelled_request_ends_the_query_s_copy(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bson import ObjectId

    from flowwarden.spark.source import requested

    monkeypatch.setattr(requested, "REQUEST_POLL_SECONDS", 0.0)
    client[db_name]["orders"].insert_many([{"_id": i, "n": i} for i in range(12)])
    reader = reader_for(mongodb_uri, db_name, name="orders-query")
    try:
        initial = reader.initialOffset()
        reader.latestOffset(initial, ReadMaxRows(100))
        request = request_for(client, db_name, chunk_size=5)
        first = reader.latestOffset(initial, ReadMaxRows(100))
        assert requested_offset(first).copied == 5
        signals = client[db_name]["_fw_signals"]
        signals.update_one({"_id": ObjectId(request)}, {"$set": {"state": "cancelled"}})
        client[db_name]["orders"].insert_one({"_id": 12, "n": 12})
        after = reader.latestOffset(first, ReadMaxRows(100))
        assert isinstance(typed(after), TokenOffset)
        assert kinds(read_rows(reader, first, after)) == [("insert", 12)]
    finally:
        reader.stop()


def test_a_query_that_takes_requests_is_known_to_the_request_command(
    client: pymongo.MongoClient[dict[str, Any]], mongodb_uri: str, db_name: str
) -> None:
    from flowwarden.cli import main

    client[db_name]["orders"].insert_one({"_id": 1})
    reader = reader_for(mongodb_uri, db_name, name="orders-query")
    try:
        reader.latestOffset(reader.initialOffset(), ReadMaxRows(100))
    finally:
        reader.stop()
    # No checkpoint of that name: the query's own entry in _fw_signals names it.
    args = ["snapshot", "request", "orders-query", "--uri", mongodb_uri, "--database", db_name]
    assert main(args) == 0
    assert main([*args[:2], "unknown-query", *args[3:]]) == 2


def test_a_query_copies_a_requested_snapshot_across_restarts_from_its_offsets(
    spark: SparkSession,
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    tmp_path: Path,
) -> None:
    orders = client[db_name]["orders"]
    orders.insert_many([{"_id": i, "n": i} for i in range(40)])
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run(trigger: dict[str, Any]) -> None:
        stream = source(spark, mongodb_uri, db_name, name="orders-query", max_events_per_trigger="100")
        query = (
            stream.writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )
        assert query.awaitTermination(120), "the query did not end"

    run({"once": True})  # the query's first position; no request yet
    request_for(client, db_name, chunk_size=15)
    run({"once": True})  # the first chunk
    orders.update_one({"_id": 3}, {"$set": {"n": 103}})  # copied already: arrives as its change
    orders.delete_one({"_id": 30})  # not copied yet: its delete comes first, no row
    run({"once": True})  # restarted in the middle of the copy: it goes on from the offsets log
    run({"availableNow": True})  # the rest of the copy, then the changes

    rows = spark.read.parquet(output).select("operation_type", "document_key", "cluster_time").collect()
    copied = sorted(
        json_util.loads(r["document_key"])["_id"] for r in rows if r["operation_type"] == "snapshot"
    )
    assert copied == [i for i in range(40) if i != 30], "each document there when its chunk was read, once"
    changes = sorted(
        (r["operation_type"], json_util.loads(r["document_key"])["_id"])
        for r in rows
        if r["operation_type"] != "snapshot"
    )
    assert changes == [("delete", 30), ("update", 3)]
    assert client[db_name]["_fw_signals"].find_one({"kind": "snapshot"})["finished"] == ["orders-query"]
