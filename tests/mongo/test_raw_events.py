"""RawEvent reads ``_id`` and ``operationType`` without decoding the rest, and agrees with a full
decode for every top-level BSON type it has to walk past."""

from __future__ import annotations

import copy
import datetime as dt
import gc
import pickle
from typing import Any

import bson
import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.raw_bson import RawBSONDocument

from flowwarden.mongo.raw_events import RAW_EVENT_OPTIONS, RawEvent, lean

TOKEN = {"_data": "8265A0B1C2000000012B042C0100296E5A1004"}

# One value of each BSON type, placed before the fields RawEvent looks up, so the walk has to
# size every one of them to get there.
EVERY_TYPE: dict[str, Any] = {
    "double": 1.5,
    "string": "héllo",
    "document": {"a": {"b": [1, 2]}},
    "array": [1, "x", {"y": None}],
    "binary": Binary(b"\x00\x01\x02", 4),
    "objectid": ObjectId(),
    "bool": True,
    "datetime": dt.datetime(2024, 1, 2, 3, 4, 5, 6000),
    "null": None,
    "code": Code("function () {}"),
    "code_with_scope": Code("function () { return x; }", {"x": 1}),
    "int32": 7,
    "timestamp": Timestamp(1_700_000_000, 3),
    "int64": Int64(2**40),
    "decimal": Decimal128("1.25"),
    "minkey": MinKey(),
    "maxkey": MaxKey(),
    "dbref": DBRef("orders", 1),
    "regex": Regex("^a", "i"),
}


def raw_event(document: dict[str, Any]) -> RawEvent:
    return RawEvent(bson.encode(document), RAW_EVENT_OPTIONS)


def test_id_and_operation_type_are_read_after_fields_of_every_type() -> None:
    event = raw_event({**EVERY_TYPE, "operationType": "insert", "_id": TOKEN})
    assert event["_id"] == TOKEN and type(event["_id"]) is dict
    assert event["operationType"] == "insert"
    assert event.get("operationType") == "insert"


def test_the_document_key_and_the_namespace_are_read_alone_as_dicts() -> None:
    key = {"_id": {"region": "eu", "n": Int64(3)}}
    ns = {"db": "shop", "coll": "orders"}
    event = raw_event({**EVERY_TYPE, "_id": TOKEN, "ns": ns, "documentKey": key, "fullDocument": {"a": 1}})
    assert event["documentKey"] == key and type(event["documentKey"]) is dict
    assert event.get("documentKey") == key and event.get("ns") == ns and type(event["ns"]) is dict
    assert vars(RawBSONDocument)["_RawBSONDocument__inflated_doc"].__get__(event) is None
    assert raw_event({"_id": TOKEN}).get("documentKey") is None


def test_a_lookup_decodes_nothing_else() -> None:
    event = raw_event({"_id": TOKEN, "operationType": "update", "fullDocument": {"a": 1}})
    event["_id"], event["operationType"]
    assert vars(RawBSONDocument)["_RawBSONDocument__inflated_doc"].__get__(event) is None


def test_other_fields_read_as_from_a_raw_bson_document() -> None:
    document = {
        "_id": TOKEN,
        "operationType": "insert",
        "fullDocument": {"a": 1},
        "clusterTime": Timestamp(5, 1),
    }
    event = raw_event(document)
    plain = RawBSONDocument(bson.encode(document))
    assert event["clusterTime"] == plain["clusterTime"]
    assert event["fullDocument"].raw == plain["fullDocument"].raw
    assert dict(event.items()).keys() == document.keys()


def test_missing_fields_are_missing() -> None:
    event = raw_event({"operationType": "drop"})
    with pytest.raises(KeyError):
        event["_id"]
    assert event.get("_id") is None
    assert event.get("_id", "absent") == "absent"
    assert "_id" not in event


def test_fields_of_another_type_fall_back_to_the_full_decode() -> None:
    event = raw_event({"_id": "a string id", "operationType": 3})
    assert event["_id"] == "a string id"
    assert event["operationType"] == 3


def test_a_regular_expression_before_the_field_is_walked_past() -> None:
    event = raw_event({"pattern": Regex("^a", "i"), "_id": TOKEN})
    assert event["_id"] == TOKEN
    assert event["pattern"] == Regex("^a", "i")


def test_events_from_a_memoryview_read_alike() -> None:
    data = bson.encode({"big": "x" * 5000, "operationType": "insert", "_id": TOKEN})
    event = RawEvent(memoryview(data), RAW_EVENT_OPTIONS)
    assert event["_id"] == TOKEN and event["operationType"] == "insert"


def test_lean_drops_what_was_decoded_and_keeps_the_bytes() -> None:
    data = bson.encode({"_id": TOKEN, "operationType": "insert", "fullDocument": {"a": 1}})
    plain = RawBSONDocument(data)
    assert plain["fullDocument"]["a"] == 1  # decodes the top level
    slot = vars(RawBSONDocument)["_RawBSONDocument__inflated_doc"]
    assert slot.__get__(plain) is not None
    assert lean(plain) is plain and slot.__get__(plain) is None
    assert plain.raw == data and plain["fullDocument"]["a"] == 1  # decoded again on demand
    decoded = {"_id": TOKEN}
    assert lean(decoded) is decoded


def test_a_waiting_raw_event_is_one_object_for_the_garbage_collector() -> None:
    data = bson.encode(
        {"_id": TOKEN, "operationType": "insert", "fullDocument": {"a": {"b": 1}}, "ns": {"db": "d"}}
    )
    events = [RawEvent(data, RAW_EVENT_OPTIONS) for _ in range(1000)]
    gc.collect()
    before = len(gc.get_objects())
    for event in events:
        event["_id"], event.get("operationType")
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_each_field_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver, the read loop and the batch each read both fields of every event.
    from flowwarden.mongo import raw_events

    walked: list[str] = []
    lookup = raw_events._lookup

    def counting(raw: bytes, key: str) -> Any:
        walked.append(key)
        return lookup(raw, key)

    monkeypatch.setattr(raw_events, "_lookup", counting)
    event = raw_event({"_id": TOKEN, "operationType": "insert", "fullDocument": {"a": 1}})
    for _ in range(3):
        assert event["_id"] == TOKEN
        assert event.get("operationType") == "insert"
    assert walked == ["_id", "operationType"]


def test_a_token_read_is_the_readers_own() -> None:
    event = raw_event({"_id": TOKEN, "operationType": "insert"})
    event["_id"]["_data"] = "changed by one reader"
    assert event["_id"] == TOKEN
    assert event["_id"] is not event["_id"]


def test_a_copied_or_pickled_event_reads_alike() -> None:
    event = raw_event({"_id": TOKEN, "operationType": "insert"})
    event["_id"]  # one field looked up before the copy, the other after
    for copied in (pickle.loads(pickle.dumps(event)), copy.deepcopy(event), copy.copy(event)):
        assert copied["_id"] == TOKEN and copied["operationType"] == "insert"
