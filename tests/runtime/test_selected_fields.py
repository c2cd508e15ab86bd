"""What a stream lets through: the collections ``collections`` and ``exclude_collections`` select
(changes and snapshot copies alike), documents without their ``exclude_fields`` (in no event,
snapshot row, dead letter or log line), and ``hash_fields`` as their salted SHA-256, the same
across restarts."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pymongo
import pytest
from bson import json_util

from flowwarden import (
    ChangeEvent,
    Connector,
    OnError,
    Snapshot,
    change_stream,
    checkpoint,
    on_change,
    retry_policy,
)
from flowwarden.errors import ConfigurationError
from helpers import checkpoint_doc, running, wait_until

COLLECTIONS = ["orders", "order_lines", "border", "orders_archive", "inventory", "audit"]
SELECTED = {"orders", "order_lines", "inventory"}


def test_a_database_stream_sees_only_the_collections_it_selects(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    """Patterns match whole names: ``re:order.*`` selects neither ``border`` nor, once excluded
    by ``re:.*_archive``, ``orders_archive``; the copy and the changes agree."""
    db = client[db_name]
    for name in COLLECTIONS:
        db[name].insert_one({"_id": f"{name}-existing"})
    seen: list[tuple[str, str | None, Any]] = []

    @change_stream(
        database=db_name,
        name="shop",
        collections=["re:order.*", "inventory"],
        exclude_collections=["re:.*_archive"],
        snapshot=Snapshot.INITIAL,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Shop:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            key = event.document_key or {}
            seen.append((event.operation_type, event.collection, key.get("_id")))

    with running(mongodb_uri, [Shop]):
        wait_until(lambda: len(seen) >= len(SELECTED), what="the copy")
        for name in COLLECTIONS:
            db[name].insert_one({"_id": f"{name}-new"})
        db.marker.insert_one({"_id": "last"})
        db.orders.insert_one({"_id": "really-last"})
        wait_until(lambda: seen[-1][2] == "really-last", what="the last insert")
    copied = [collection for operation, collection, _ in seen if operation == "snapshot"]
    changed = [collection for operation, collection, _ in seen if operation == "insert"]
    assert sorted(copied) == sorted(SELECTED)
    assert sorted(changed) == sorted([*SELECTED, "orders"])


SSN = "SSN-123-45-6789"
ZIP = "ZIP-90210"


def test_an_excluded_field_is_in_no_event_snapshot_row_dead_letter_or_log_line(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = client[db_name]
    db.create_collection("people", changeStreamPreAndPostImages={"enabled": True})
    db.people.insert_one({"_id": 0, "name": "existing", "ssn": SSN, "address": {"zip": ZIP, "city": "Oslo"}})
    seen: list[Any] = []

    @change_stream(
        "people",
        db_name,
        name="people",
        exclude_fields=["ssn", "address.zip"],
        full_document="updateLookup",
        full_document_before_change="whenAvailable",
        snapshot=Snapshot.INITIAL,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted=OnError.DEAD_LETTER)
    class People:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append(event.raw)
            document = event.full_document or {}
            if document.get("poison"):
                # What a handler might say: the whole document, in its error and in a log line.
                logging.getLogger("flowwarden.test").warning("cannot handle %r", dict(document))
                raise ValueError(f"cannot handle {dict(document)!r}")

    caplog.set_level(logging.DEBUG)
    with running(mongodb_uri, [People]):
        wait_until(lambda: len(seen) == 1, what="the copy")
        people = db.people
        people.insert_one({"_id": 1, "name": "Ada", "ssn": SSN, "address": {"zip": ZIP, "city": "Paris"}})
        people.update_one({"_id": 1}, {"$set": {"ssn": SSN, "address.zip": ZIP, "name": "Ada L."}})
        people.update_one({"_id": 0}, {"$unset": {"address": ""}})
        people.update_one({"_id": 0}, {"$set": {"address": {"zip": ZIP, "city": "Bergen"}}})
        people.replace_one({"_id": 1}, {"_id": 1, "ssn": SSN, "poison": True, "address": {"zip": ZIP}})
        people.delete_one({"_id": 1})
        wait_until(lambda: seen and seen[-1].get("operationType") == "delete", what="the delete")
        wait_until(lambda: db["_fw_dlq"].count_documents({}) == 1, what="the dead letter")
    dead_letters = list(db["_fw_dlq"].find())
    snapshot_row, _, update, _, set_document = seen[:5]
    assert snapshot_row["fullDocument"] == {"_id": 0, "name": "existing", "address": {"city": "Oslo"}}
    assert update["updateDescription"]["updatedFields"] == {"name": "Ada L."}
    assert set_document["updateDescription"]["updatedFields"] == {"address": {"city": "Bergen"}}
    assert dead_letters[0]["event"]["fullDocument"] == {"_id": 1, "poison": True, "address": {}}
    # flowwarden's log lines (the driver's debug log shows this test's own writes too)
    ours = [record for record in caplog.records if record.name.startswith("flowwarden")]
    logged = "\n".join(record.getMessage() for record in ours)
    assert "cannot handle" in logged
    everything = json_util.dumps([*seen, *dead_letters]) + logged
    assert SSN not in everything and ZIP not in everything
    assert "ssn" not in everything


SALT = "pepper-for-tests"


def salted(value: str) -> str:
    return hashlib.sha256(SALT.encode() + value.encode()).hexdigest()


def hashing_class(db: str, seen: list[Any]) -> type:
    @change_stream(
        "people",
        db,
        name="people",
        hash_fields=["email", "contact.phone"],
        hash_salt_env="FW_TEST_HASH_SALT",
        snapshot=Snapshot.INITIAL,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Hashed:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append(event.raw)

    return Hashed


def test_hashed_fields_are_the_salted_sha256_and_stay_the_same_across_restarts(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FW_TEST_HASH_SALT", SALT)
    people = client[db_name].people
    people.insert_one({"_id": 0, "email": "ada@example.com", "contact": {"phone": "+47 1"}})
    first: list[Any] = []
    with running(mongodb_uri, [hashing_class(db_name, first)]):
        wait_until(lambda: len(first) == 1, what="the copy")
        people.update_one({"_id": 0}, {"$set": {"email": "ada@example.org", "contact.phone": "+47 2"}})
        wait_until(lambda: len(first) == 2, what="the update")
    second: list[Any] = []
    with running(mongodb_uri, [hashing_class(db_name, second)]):
        people.insert_one(
            {"_id": 1, "email": "ada@example.com", "contact": {"phone": "+47 2"}, "name": "Ada"}
        )
        wait_until(lambda: len(second) == 1, what="the insert after the restart")
    row, update, insert = first[0], first[1], second[0]
    assert row["fullDocument"] == {
        "_id": 0,
        "email": salted("ada@example.com"),
        "contact": {"phone": salted("+47 1")},
    }
    assert update["updateDescription"]["updatedFields"] == {
        "email": salted("ada@example.org"),
        "contact.phone": salted("+47 2"),
    }
    assert insert["fullDocument"] == {
        "_id": 1,
        "email": salted("ada@example.com"),
        "contact": {"phone": salted("+47 2")},
        "name": "Ada",
    }
    stored = json_util.dumps(checkpoint_doc(client, db_name, "people"))
    assert "ada@example" not in json_util.dumps([*first, *second]) and SALT not in stored


def test_a_missing_salt_stops_the_start_naming_the_variable(
    mongodb_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FW_TEST_HASH_SALT", raising=False)
    with pytest.raises(ConfigurationError) as caught:
        Connector(mongodb_uri, [hashing_class(db_name, [])])
    assert caught.value.option == "hash_salt_env"
    assert "FW_TEST_HASH_SALT" in str(caught.value)
    monkeypatch.setenv("FW_TEST_HASH_SALT", "")
    with pytest.raises(ConfigurationError, match="FW_TEST_HASH_SALT"):
        Connector(mongodb_uri, [hashing_class(db_name, [])])
