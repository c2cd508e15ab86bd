"""exclude_fields and hash_fields on events of every shape: the server's stages remove an excluded
field from documents, pre-images and update descriptions (dotted keys, keys above it, array
indexes); the client's hashing gives the salted SHA-256 the same way on decoded and raw events."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import bson
import pymongo
from bson import Int64, ObjectId, json_util

from flowwarden.mongo.raw_events import RawEvent
from flowwarden.mongo.sensitive_fields import (
    FieldHasher,
    SensitivePath,
    exclusion_stages,
    snapshot_projection,
)

SECRET = "SSN-123-45-6789"
ZIP = "ZIP-90210-SECRET"
ITEM = "ITEM-SECRET"
EXCLUDED = ["ssn", "address.zip", "items.secret"]


def secrets_in(value: Any) -> list[str]:
    text = json_util.dumps(value)
    return [secret for secret in (SECRET, ZIP, ITEM) if secret in text]


def test_excluded_fields_never_reach_the_client(client: pymongo.MongoClient, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("people", changeStreamPreAndPostImages={"enabled": True})
    people = db.people
    options = {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"}
    with people.watch(exclusion_stages(EXCLUDED), max_await_time_ms=100, **options) as stream:
        people.insert_one(
            {"_id": 1, "name": "Ada", "ssn": SECRET, "items": [{"secret": ITEM, "sku": "a"}, "plain"]}
        )
        people.update_one({"_id": 1}, {"$set": {"ssn": SECRET + "!", "name": "Ada L."}})
        # A field that was not there is reported whole: the key is above the excluded path.
        people.update_one({"_id": 1}, {"$set": {"address": {"zip": ZIP, "city": "Lyon"}}})
        people.update_one(
            {"_id": 1},
            {"$set": {"address.zip": ZIP + "!", "items.0.secret": ITEM + "!", "items.1": {"secret": ITEM}}},
        )
        people.update_one({"_id": 1}, {"$unset": {"ssn": "", "address.zip": ""}})
        people.replace_one({"_id": 1}, {"_id": 1, "ssn": SECRET, "name": "Ada"})
        people.delete_one({"_id": 1})
        events = []
        while len(events) < 7:
            event = stream.try_next()
            if event is not None:
                events.append(event)
    assert [secrets_in(event) for event in events] == [[]] * 7
    insert, set_fields, set_document, set_deeper, unset, replace, delete = events
    assert insert["fullDocument"] == {"_id": 1, "name": "Ada", "items": [{"sku": "a"}, "plain"]}
    assert set_fields["updateDescription"]["updatedFields"] == {"name": "Ada L."}
    assert set_document["updateDescription"]["updatedFields"] == {"address": {"city": "Lyon"}}
    assert set_deeper["updateDescription"]["updatedFields"] == {"items.1": {}}
    assert set_deeper["fullDocumentBeforeChange"]["address"] == {"city": "Lyon"}
    assert unset["updateDescription"]["removedFields"] == []
    assert replace["fullDocument"] == {"_id": 1, "name": "Ada"}
    assert "ssn" not in delete["fullDocumentBeforeChange"]


def test_updated_fields_keys_are_matched_by_path_not_by_prefix() -> None:
    path = SensitivePath.of("items.secret")
    import re

    covering = re.compile(path.covering())
    assert covering.match("items.secret") and covering.match("items.3.secret.x")
    assert not covering.match("items.secretive") and not covering.match("itemsx.secret")
    above = [(re.compile(regex), rest) for regex, rest in path.above()]
    assert [rest for regex, rest in above if regex.match("items.2")] == [("secret",)]
    assert [rest for regex, rest in above if regex.match("items")] == [("secret",)]
    assert [rest for regex, rest in above if regex.match("itemsx")] == []


def test_the_snapshot_projection_leaves_the_fields_out(client: pymongo.MongoClient, db_name: str) -> None:
    people = client[db_name].people
    people.insert_one(
        {"_id": 1, "ssn": SECRET, "address": {"zip": ZIP, "city": "Paris"}, "items": [{"secret": 1}]}
    )
    (document,) = people.find({}, projection=snapshot_projection(EXCLUDED))
    assert document == {"_id": 1, "address": {"city": "Paris"}, "items": [{}]}
    assert snapshot_projection([]) is None


# ----------------------------------------------------------------------------------------------
# Hashing

SALT = b"pepper"


def salted(value: str) -> str:
    return hashlib.sha256(SALT + value.encode()).hexdigest()


def event(document: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "_id": {"_data": "8265A0B1C2000000012B"},
        "operationType": "insert",
        "ns": {"db": "shop", "coll": "people"},
        "documentKey": {"_id": document.get("_id")},
        "fullDocument": document,
        **more,
    }


def test_a_hashed_value_is_the_salted_sha256_of_its_text() -> None:
    hasher = FieldHasher(["email", "contact.phone", "contacts.email", "age", "seen"], SALT)
    when = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    change = event(
        {
            "_id": 1,
            "email": "ada@example.com",
            "contact": {"phone": "+33 1"},
            "contacts": [{"email": "b@example.com"}, {"other": 1}],
            "age": 36,
            "seen": when,
            "kept": "as is",
        }
    )
    hasher.apply(change)
    document = change["fullDocument"]
    assert document["email"] == salted("ada@example.com")
    assert document["contact"] == {"phone": salted("+33 1")}
    assert document["contacts"] == [{"email": salted("b@example.com")}, {"other": 1}]
    assert document["age"] == salted("36")  # other values: their relaxed Extended JSON
    assert document["seen"] == salted('{"$date": "2024-05-01T00:00:00Z"}')
    assert document["kept"] == "as is"


def test_null_stays_null_and_a_missing_field_stays_missing() -> None:
    change = event({"_id": 1, "email": None})
    FieldHasher(["email", "phone"], SALT).apply(change)
    assert change["fullDocument"] == {"_id": 1, "email": None}


def test_updated_fields_are_hashed_under_and_above_the_path() -> None:
    hasher = FieldHasher(["contact.email"], SALT)
    change = event(
        {"_id": 1},
        operationType="update",
        updateDescription={
            "updatedFields": {
                "contact.email": "a@x",
                "contact": {"email": "b@x", "name": "B"},
                "contact.emails": "not the field",
                "other": "c@x",
            },
            "removedFields": [],
        },
        fullDocumentBeforeChange={"_id": 1, "contact": {"email": "old@x"}},
    )
    hasher.apply(change)
    updated = change["updateDescription"]["updatedFields"]
    assert updated == {
        "contact.email": salted("a@x"),
        "contact": {"email": salted("b@x"), "name": "B"},
        "contact.emails": "not the field",
        "other": "c@x",
    }
    assert change["fullDocumentBeforeChange"]["contact"] == {"email": salted("old@x")}


def test_raw_events_hash_as_decoded_ones_do_and_keep_every_other_value() -> None:
    hasher = FieldHasher(["email", "n"], SALT)
    document = {
        "_id": ObjectId("6692b4a31ede014d28852865"),
        "email": "ada@example.com",
        "n": Int64(5),
        "big": Int64(2**40),
        "when": dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.timezone.utc),
    }
    decoded = event(dict(document))
    hasher.apply(decoded)
    raw = hasher(RawEvent(bson.encode(event(dict(document)))))
    assert isinstance(raw, RawEvent)
    codec = bson.CodecOptions(tz_aware=True)
    assert bson.decode(raw.raw, codec_options=codec) == bson.decode(bson.encode(decoded), codec_options=codec)
    assert type(bson.decode(raw.raw)["fullDocument"]["big"]) is Int64


def test_a_raw_event_without_a_hashed_field_is_left_as_it_came() -> None:
    hasher = FieldHasher(["email"], SALT)
    original = RawEvent(bson.encode(event({"_id": 1, "name": "x"})))
    assert hasher(original) is original


def test_the_salt_never_shows_in_the_hashers_repr() -> None:
    assert "pepper" not in repr(FieldHasher(["email"], SALT))
