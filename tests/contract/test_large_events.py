"""Change events over 16 MB: BSONObjectTooLarge, and ``$changeStreamSplitLargeEvent``'s fragments.

An update of a document of :data:`HALF` bytes, watched with the document's pre-image and its
looked-up post-image, makes an event just over mongod's 16 MiB + 16 KiB limit. Without
``$changeStreamSplitLargeEvent`` the stream fails on it with BSONObjectTooLarge; with the stage
(MongoDB 7.0+) it arrives in two fragments. Every test runs against EmbeddedReplicaSet and against
the server FLOWWARDEN_TEST_MONGODB_URI names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import bson
import pymongo
import pytest
from pymongo import UpdateOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, OperationFailure, WriteError

from flowwarden.events import compare_tokens

MAX_BSON = 16 * 1024 * 1024
# mongod's BSONObjMaxInternalSize: an event is refused only past it, not past MAX_BSON.
MAX_INTERNAL = MAX_BSON + 16 * 1024
# Two images of a document this big (and the rest of the event) pass MAX_INTERNAL by a few KB.
HALF = 8_400_000
SPLIT = [{"$changeStreamSplitLargeEvent": {}}]
IMAGES: dict[str, Any] = {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"}
AWAIT_MS = 100
TOO_LARGE = re.compile(
    r"BSONObj size: (\d+) \(0x([0-9A-F]+)\) is invalid\. Size must be between 0 and 16793600\(16MB\) "
    r'First element: _id: \{ _data: "82[0-9A-F]+(\.\.\.)?" \}'
)


def _imaged(client: pymongo.MongoClient, db_name: str) -> Collection:
    """A collection that records pre-images, holding the document ``{_id: 1, a: <HALF bytes>}``."""
    db = client[db_name]
    db.create_collection("big", changeStreamPreAndPostImages={"enabled": True})
    db.big.insert_one({"_id": 1, "a": "x" * HALF})
    return db.big


def _grow(coll: Collection) -> None:
    """The update whose event, with both images, is too large: it changes one small field."""
    coll.update_one({"_id": 1}, {"$set": {"b": 1}})


def _element_size(name: str, value: Any) -> int:
    return len(bson.encode({name: value})) - 5


def _reassemble(fragments: list[dict[str, Any]]) -> dict[str, Any]:
    """The event the fragments were cut from, without its ``_id``: their fields merged in order."""
    event: dict[str, Any] = {}
    for fragment in fragments:
        event.update((k, v) for k, v in fragment.items() if k not in ("_id", "splitEvent"))
    return event


def test_writes_refused_for_a_document_over_16_mib_leave_no_event(
    client: pymongo.MongoClient, db_name: str
) -> None:
    coll = client[db_name].c
    coll.insert_many([{"_id": 1, "a": "x" * HALF}, {"_id": 2}])
    grow = {"$set": {"b": "y" * HALF}}
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        with pytest.raises(WriteError) as update:
            coll.update_many({"_id": {"$lte": 2}}, grow)  # _id 1 first: nothing is changed
        with pytest.raises(BulkWriteError) as bulk:
            coll.bulk_write([UpdateOne({"_id": 2}, {"$set": {"c": 1}}), UpdateOne({"_id": 1}, grow)])
        coll.insert_one({"_id": 3})
        events = [stream.next(), stream.next()]
    assert update.value.code == 17419
    assert [(e["index"], e["code"]) for e in bulk.value.details["writeErrors"]] == [(1, 17419)]
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == [("update", 2), ("insert", 3)]
    assert coll.find_one({"_id": 1}, {"a": 0}) == {"_id": 1}


def test_an_event_over_the_limit_fails_the_stream_with_bson_object_too_large(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(6, "pre-images of change events")
    coll = _imaged(client, db_name)
    with coll.watch(**IMAGES, max_await_time_ms=AWAIT_MS) as stream:
        _grow(coll)
        with pytest.raises(OperationFailure) as info:
            stream.next()
    assert info.value.code == 10334
    assert info.value.details is not None
    assert info.value.details["codeName"] == "BSONObjectTooLarge"
    found = TOO_LARGE.search(str(info.value.details["errmsg"]))
    assert found is not None, info.value.details["errmsg"]
    size = int(found.group(1))
    assert size == int(found.group(2), 16)
    assert MAX_INTERNAL < size < MAX_INTERNAL + 16 * 1024


@pytest.mark.parametrize("pipeline", [[], SPLIT], ids=["plain", "split stage"])
def test_an_event_over_16_mib_but_within_the_internal_limit_arrives_whole(
    client: pymongo.MongoClient,
    db_name: str,
    requires_mongodb: Callable[[int, str], None],
    pipeline: list[dict[str, Any]],
) -> None:
    requires_mongodb(7 if pipeline else 6, "$changeStreamSplitLargeEvent")
    coll = client[db_name].big
    document = {"_id": 1, "a": ""}
    document["a"] = "x" * (MAX_BSON - len(bson.encode(document)))
    with coll.watch(pipeline, max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one(document)
        event = stream.next()
    assert "splitEvent" not in event
    assert event["fullDocument"] == document
    assert MAX_BSON < len(bson.encode(event)) < MAX_INTERNAL


def test_split_stage_delivers_fragments_that_reassemble_to_the_event(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(7, "$changeStreamSplitLargeEvent")
    coll = _imaged(client, db_name)
    before = coll.find_one({"_id": 1})
    # The same event without its pre-image fits whole: the reference the fragments must add up to.
    slim_pipeline = [{"$project": {"fullDocumentBeforeChange": 0}}]
    with (
        coll.watch(SPLIT, **IMAGES, max_await_time_ms=AWAIT_MS) as split,
        coll.watch(slim_pipeline, **IMAGES, max_await_time_ms=AWAIT_MS) as slim,
    ):
        _grow(coll)
        fragments = [split.next(), split.next()]
        whole = slim.next()
        coll.insert_one({"_id": 2})
        following = split.next()

    assert [f["splitEvent"] for f in fragments] == [{"fragment": 1, "of": 2}, {"fragment": 2, "of": 2}]
    expected = {k: v for k, v in whole.items() if k != "_id"}
    expected["fullDocumentBeforeChange"] = before
    assert _reassemble(fragments) == expected
    assert expected["fullDocument"] == {**before, "b": 1}
    assert following["operationType"] == "insert" and "splitEvent" not in following

    # mongod's greedy split: fields ordered by their BSON size, as many as fit in each fragment.
    sizes = [[_element_size(k, v) for k, v in f.items() if k not in ("_id", "splitEvent")] for f in fragments]
    assert sizes[0] == sorted(sizes[0]) and max(sizes[0]) <= min(sizes[1])
    # The post-image is a few bytes smaller than the pre-image (its field name is shorter), so the
    # pre-image is the field that no longer fits the first fragment.
    assert list(fragments[1]) == ["_id", "splitEvent", "fullDocumentBeforeChange"]
    assert all(len(bson.encode(f)) <= MAX_BSON for f in fragments)

    # Each fragment has its own token, in stream order, between the events around it.
    tokens = [f["_id"] for f in fragments] + [following["_id"]]
    assert compare_tokens(tokens[0], tokens[1]) < 0 < compare_tokens(tokens[2], tokens[1])
    assert all(compare_tokens(token, whole["_id"]) > 0 for token in tokens)


def test_resuming_from_a_fragment_delivers_the_fragments_after_it(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(7, "$changeStreamSplitLargeEvent")
    coll = _imaged(client, db_name)
    with coll.watch(SPLIT, **IMAGES, max_await_time_ms=AWAIT_MS) as stream:
        _grow(coll)
        coll.insert_one({"_id": 2})
        first, last, following = stream.next(), stream.next(), stream.next()

    with coll.watch(SPLIT, **IMAGES, resume_after=first["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert resumed.next() == last
        assert resumed.next() == following
    # After the last fragment comes the next event; startAfter resumes from a fragment alike.
    with coll.watch(SPLIT, **IMAGES, resume_after=last["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert resumed.next() == following
    with coll.watch(SPLIT, **IMAGES, start_after=first["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert resumed.next() == last


def test_resuming_from_a_fragment_needs_the_split_stage(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(7, "$changeStreamSplitLargeEvent")
    coll = _imaged(client, db_name)
    with coll.watch(SPLIT, **IMAGES, max_await_time_ms=AWAIT_MS) as stream:
        _grow(coll)
        first = stream.next()
    with pytest.raises(OperationFailure) as info:
        coll.watch(**IMAGES, resume_after=first["_id"])
    assert info.value.code == 280
    assert "To resume from a split event, the $changeStream pipeline must include a " in str(info.value)


@pytest.mark.parametrize(
    ("pipeline", "code", "message"),
    [
        (
            [*SPLIT, {"$match": {}}],
            7182802,
            "$changeStreamSplitLargeEvent must be the last stage in the pipeline",
        ),
        (
            [{"$changeStreamSplitLargeEvent": {"fragments": 2}}],
            7182800,
            "$changeStreamSplitLargeEvent spec should be an empty object",
        ),
    ],
    ids=["not last", "with options"],
)
def test_the_split_stage_is_refused_unless_last_and_empty(
    client: pymongo.MongoClient,
    db_name: str,
    requires_mongodb: Callable[[int, str], None],
    pipeline: list[dict[str, Any]],
    code: int,
    message: str,
) -> None:
    requires_mongodb(7, "$changeStreamSplitLargeEvent")
    with pytest.raises(OperationFailure) as info:
        client[db_name].c.watch(pipeline)
    assert info.value.code == code
    assert message in str(info.value)
