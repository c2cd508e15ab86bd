"""The streaming source's collections, exclude_collections, exclude_fields and hash_fields: a
database source reads (and copies) only the collections it selects, no excluded field reaches a
row, and hashed fields are the salted SHA-256 in planned, replayed and copied rows alike."""

from __future__ import annotations

import hashlib
import itertools
import pickle
from typing import Any

import pyarrow as pa
import pymongo
import pytest
from bson import json_util
from pyspark.sql.streaming.datasource import ReadMaxRows

from flowwarden.errors import ConfigurationError
from flowwarden.spark import change_event_struct_type
from flowwarden.spark.source.offsets import SnapshotOffset, parse_offset
from flowwarden.spark.source.parsing import parse_source_options
from flowwarden.spark.source.reader import FlowWardenStreamReader, SourceOptions

pytestmark = pytest.mark.spark

SALT = "source-pepper"
SSN = "SSN-987-65-4321"
ZIP = "ZIP-SECRET-1"


def salted(value: str) -> str:
    return hashlib.sha256(SALT.encode() + value.encode()).hexdigest()


def parse(**options: str) -> SourceOptions:
    return parse_source_options({"uri": "mongodb://127.0.0.1:1/?replicaSet=rs0", **options})


def test_list_options_are_json_arrays_or_names_separated_by_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_SOURCE_SALT", SALT)
    options = parse(
        database="shop",
        collections='["orders", "re:inv_.{1,3}"]',
        exclude_collections="audit, re:.*_old",
        exclude_fields="ssn,address.zip",
        hash_fields="email",
        hash_salt_env="FW_SOURCE_SALT",
    )
    assert options.collections == ("orders", "re:inv_.{1,3}")
    assert options.exclude_collections == ("audit", "re:.*_old")
    assert options.exclude_fields == ("ssn", "address.zip")
    assert options.hasher is not None and options.hasher.hash_value("x") == salted("x")
    assert SALT not in repr(options)
    assert parse(database="shop", collections="").collections is None


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"database": "shop", "collections": "re:orders("}, "collections"),
        ({"database": "shop", "collections": "[1]"}, "collections"),
        ({"database": "shop", "collections": "[oops"}, "collections"),
        ({"database": "shop", "collection": "orders", "exclude_collections": "x"}, "exclude_collections"),
        ({"collections": "orders"}, "collections"),
        ({"database": "shop", "exclude_fields": "_id"}, "exclude_fields"),
        ({"database": "shop", "hash_fields": "email"}, "hash_salt_env"),
        ({"database": "shop", "hash_fields": "email", "hash_salt_env": "FW_NO_SUCH_SALT"}, "hash_salt_env"),
    ],
)
def test_bad_selections_and_fields_are_refused_naming_the_option(
    options: dict[str, str], option: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse(**options)
    assert caught.value.option == option


def reader_for(uri: str, database: str, **options: str) -> FlowWardenStreamReader:
    source = parse_source_options({"uri": uri, "database": database, **options})
    # The reader travels to the executors pickled: read with what arrives there.
    return pickle.loads(pickle.dumps(FlowWardenStreamReader(source, change_event_struct_type())))


def read_rows(
    reader: FlowWardenStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[dict[str, Any]]:
    (partition,) = reader.partitions(start, end)
    batches = list(reader.read(partition))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def test_a_database_source_reads_only_its_collections_without_excluded_fields_and_hashed(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FW_SOURCE_SALT", SALT)
    db = client[db_name]
    person = {"ssn": SSN, "email": "ada@example.com", "address": {"zip": ZIP, "city": "Oslo"}}
    for name in ("orders", "order_lines", "border", "orders_archive"):
        db[name].insert_one({"_id": f"{name}-existing", **person})
    options = {
        "collections": "re:order.*",
        "exclude_collections": "re:.*_archive",
        "exclude_fields": "ssn, address.zip",
        "hash_fields": "email",
        "hash_salt_env": "FW_SOURCE_SALT",
        "snapshot": "initial",
    }
    reader = reader_for(mongodb_uri, db_name, **options)
    try:
        offsets = [reader.initialOffset()]
        first = parse_offset(offsets[0])
        assert isinstance(first, SnapshotOffset)
        assert first.namespaces == (f"{db_name}.order_lines", f"{db_name}.orders")
        while not (isinstance(copy := parse_offset(offsets[-1]), SnapshotOffset) and copy.done):
            offsets.append(reader.latestOffset(offsets[-1], ReadMaxRows(10)))
        for name in ("orders", "order_lines", "border", "orders_archive"):
            db[name].insert_one({"_id": f"{name}-new", **person})
        db.orders.update_one({"_id": "orders-new"}, {"$set": {"ssn": SSN, "email": "ada@example.org"}})
        offsets.append(reader.latestOffset(offsets[-1], ReadMaxRows(100)))
        planned = [row for a, b in itertools.pairwise(offsets) for row in read_rows(reader, a, b)]
        # Read again without planning, as an executor replaying the micro-batches does.
        again = reader_for(mongodb_uri, db_name, **options)
        try:
            replayed = [row for a, b in itertools.pairwise(offsets) for row in read_rows(again, a, b)]
        finally:
            again.stop()
    finally:
        reader.stop()
    assert replayed == planned
    assert [(row["operation_type"], row["collection"]) for row in planned] == [
        ("snapshot", "order_lines"),
        ("snapshot", "orders"),
        ("insert", "orders"),
        ("insert", "order_lines"),
        ("update", "orders"),
    ]
    text = json_util.dumps(planned)
    assert SSN not in text and ZIP not in text and "ada@example" not in text
    for row in planned[:4]:
        document = json_util.loads(row["full_document"])
        assert document["email"] == salted("ada@example.com")
        assert document["address"] == {"city": "Oslo"}
    assert json_util.loads(planned[4]["updated_fields"]) == {"email": salted("ada@example.org")}


def test_a_requested_copy_of_a_database_source_keeps_its_collections_and_fields(
    client: pymongo.MongoClient[dict[str, Any]],
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot requested of a query (``name``) copies what its initial snapshot would: the
    collections it selects, without excluded fields and with hashed ones, planned and replayed;
    a request for a collection it leaves out is refused."""
    from bson import ObjectId

    from flowwarden.mongo.calls import run
    from flowwarden.mongo.signals import SIGNALS_COLLECTION, insert_request, request_document
    from flowwarden.spark.source import requested
    from flowwarden.spark.source.offsets import RequestedOffset

    monkeypatch.setattr(requested, "REQUEST_POLL_SECONDS", 0.0)
    monkeypatch.setenv("FW_SOURCE_SALT", SALT)
    db = client[db_name]
    person = {"ssn": SSN, "email": "ada@example.com", "address": {"zip": ZIP, "city": "Oslo"}}
    for name in ("orders", "order_lines", "border", "orders_archive"):
        db[name].insert_many([{"_id": f"{name}-{i}", **person} for i in range(3)])
    options = {
        "name": "shop-query",
        "collections": "re:order.*",
        "exclude_collections": "re:.*_archive",
        "exclude_fields": "ssn, address.zip",
        "hash_fields": "email",
        "hash_salt_env": "FW_SOURCE_SALT",
    }
    signals = db[SIGNALS_COLLECTION]
    reader = reader_for(mongodb_uri, db_name, **options)
    try:
        offsets = [reader.initialOffset()]
        assert reader.latestOffset(offsets[0], ReadMaxRows(100)) == offsets[0]  # caught up
        run(insert_request(signals, request_document("shop-query", chunk_size=2)))
        while True:
            following = reader.latestOffset(offsets[-1], ReadMaxRows(100))
            if following == offsets[-1]:
                break  # copied to the end, and no change since
            offsets.append(following)
            assert len(offsets) < 20, "the copy did not end"
        assert isinstance(parse_offset(offsets[-1]), RequestedOffset)
        db.orders.insert_one({"_id": "orders-new", **person})  # the changes go on after the copy
        offsets.append(reader.latestOffset(offsets[-1], ReadMaxRows(100)))
        # A request is taken at a plain offset the query caught up to: this one is refused there.
        refused = run(insert_request(signals, request_document("shop-query", ["orders_archive"])))
        assert reader.latestOffset(offsets[-1], ReadMaxRows(100)) == offsets[-1]
        planned = [row for a, b in itertools.pairwise(offsets) for row in read_rows(reader, a, b)]
        again = reader_for(mongodb_uri, db_name, **options)
        try:
            replayed = [row for a, b in itertools.pairwise(offsets) for row in read_rows(again, a, b)]
        finally:
            again.stop()
    finally:
        reader.stop()
    assert replayed == planned
    assert [(row["operation_type"], json_util.loads(row["document_key"])["_id"]) for row in planned] == [
        *[("snapshot", f"{name}-{i}") for name in ("order_lines", "orders") for i in range(3)],
        ("insert", "orders-new"),
    ]
    text = json_util.dumps(planned)
    assert SSN not in text and ZIP not in text and "ada@example" not in text
    for row in planned:
        document = json_util.loads(row["full_document"])
        assert document["email"] == salted("ada@example.com")
        assert document["address"] == {"city": "Oslo"}
    refusal = signals.find_one({"_id": ObjectId(refused)})
    assert refusal["state"] == "refused" and "leave out" in refusal["reason"]
