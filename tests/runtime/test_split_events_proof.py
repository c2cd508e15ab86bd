"""Events split into three fragments and more come out whole, on both paths that join them.

The raw path (events read as ``RawBSONDocument`` or ``RawEvent``: DataFrame streams, clients that
read raw BSON) joins the fragments' bytes; the decoded path (every other event) their fields. A
join that loses a fragment in the middle still gets the first and the last one, so every test here
cuts an event into three fragments or more and compares the joined event field by field with what
was written: the event itself (fragments cut by the embedded server's ``split_event``, or by hand),
or, end to end through a connector, the documents written and the update that changed them.

The end-to-end event is an update, watched with its pre-image and looked-up post-image, that
removes a field of :data:`SIZE` bytes and sets another of that size: ``fullDocumentBeforeChange``,
``fullDocument`` and ``updateDescription`` each hold one, so each goes in a fragment of its own. A
``$set`` stage copying the new field adds a fourth, and makes the whole event over 32 MB.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import bson
import pymongo
import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo.collection import Collection

from flowwarden import ChangeEvent, Connector, change_stream, checkpoint, on_batch, on_change, pipeline
from flowwarden.mongo.large_events import Fragments
from flowwarden.mongo.raw_events import RawEvent
from flowwarden_embedded.largeevents import split_event
from flowwarden_embedded.tokens import event_token_data, fragment_token_data
from helpers import wait_until_async

from .test_large_events import RecordingStore

MiB = 1024 * 1024
# Over half a fragment's limit (16 MiB + 8 KiB), so no two fields of this size share a fragment;
# four of them make an event over 32 MiB.
SIZE = 8_500_000
IMAGES: dict[str, Any] = {"full_document": "updateLookup", "full_document_before_change": "required"}
STREAM = "huge"
TOKEN = event_token_data(1 << 32 | 7, 0, b"\x01" * 16, "update", {"_id": 1}, None)
AWARE: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True)  # as the connector's clients read


def text(seed: int, size: int) -> str:
    """``size`` characters no other seed gives: a join that swaps, cuts or repeats a field shows."""
    return random.Random(seed).randbytes(size // 2).hex()


def read_as(path: str, fragment: RawBSONDocument | dict[str, Any]) -> Any:
    """A fragment as a change stream of that path returns it."""
    data = fragment.raw if isinstance(fragment, RawBSONDocument) else bson.encode(fragment)
    return RawEvent(bytes(data)) if path == "raw" else bson.decode(data)


def join(path: str, fragments: list[Any]) -> dict[str, Any]:
    """The event ``Fragments`` returns once the last fragment came, decoded; it must hold every
    fragment before the last and return nothing for them."""
    joining = Fragments("stream 's'", "s")
    for number, fragment in enumerate(fragments[:-1], start=1):
        assert joining.add(read_as(path, fragment)) is None, f"fragment {number} returned an event"
        assert joining.holding
    whole = joining.add(read_as(path, fragments[-1]))
    assert not joining.holding
    if path == "raw":
        assert type(whole) is RawEvent, type(whole)
        return bson.decode(whole.raw)  # checks the joined BSON's lengths and terminators too
    assert type(whole) is dict, type(whole)
    return whole


def assert_same_fields(whole: dict[str, Any], expected: dict[str, Any]) -> None:
    """``whole`` has exactly ``expected``'s fields, each equal; named one by one on failure."""
    assert sorted(whole) == sorted(expected), f"fields {sorted(set(expected) ^ set(whole))} differ"
    for name, value in expected.items():
        assert whole[name] == value, f"field {name!r} differs"


# ------------------------------------------------------------------------------------------------
# Fragments.add on its own


@pytest.mark.parametrize("path", ["raw", "decoded"])
@pytest.mark.parametrize(
    ("sizes", "fragments"),
    [([SIZE] * 3, 3), ([SIZE] * 5, 5), ([6 * MiB] * 6, 3)],
    ids=["3 fragments of one field", "5 fragments of one field", "3 fragments of two fields"],
)
def test_fragments_the_embedded_server_cuts_join_into_the_event_they_were_cut_from(
    path: str, sizes: list[int], fragments: int
) -> None:
    event: dict[str, Any] = {
        "_id": {"_data": TOKEN},
        "operationType": "update",
        "clusterTime": bson.Timestamp(1, 7),
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": 1},
    }
    event.update({f"large{n}": text(n, size) for n, size in enumerate(sizes)})
    cut = [fragment for fragment, _ in split_event(bson.encode(event), TOKEN)]
    assert [bson.decode(f.raw)["splitEvent"] for f in cut] == [
        {"fragment": n, "of": fragments} for n in range(1, fragments + 1)
    ]

    whole = join(path, cut)

    assert whole["_id"] == {"_data": fragment_token_data(TOKEN, fragments - 1)}  # the last fragment's
    assert_same_fields(whole, {**event, "_id": whole["_id"]})


@pytest.mark.parametrize("path", ["raw", "decoded"])
@pytest.mark.parametrize("total", [3, 4, 6])
def test_the_joined_event_holds_every_fragments_fields_in_fragment_order(path: str, total: int) -> None:
    fragments = [
        {
            "_id": {"_data": f"82{n:02d}"},
            "splitEvent": {"fragment": n, "of": total},
            f"first{n}": n,
            f"second{n}": {"in": [n, str(n)]},
        }
        for n in range(1, total + 1)
    ]
    fragments[0]["operationType"] = "update"

    whole = join(path, fragments)

    names = [name for fragment in fragments for name in fragment if name not in ("_id", "splitEvent")]
    assert list(whole) == ["_id", *names]
    assert whole["_id"] == {"_data": f"82{total:02d}"}
    for fragment in fragments:
        for name in fragment.keys() - {"_id", "splitEvent"}:
            assert whole[name] == fragment[name], name


# ------------------------------------------------------------------------------------------------
# End to end: a connector's handler methods


@pytest.fixture
def huge(client: pymongo.MongoClient[Any], db_name: str) -> Collection[Any]:
    """A collection that records pre-images, holding ``{_id: 1, a: <SIZE characters>}``."""
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"needs MongoDB 7.0+ ($changeStreamSplitLargeEvent); the deployment runs {found}")
    db = client[db_name]
    db.create_collection(STREAM, changeStreamPreAndPostImages={"enabled": True})
    db[STREAM].insert_one({"_id": 1, "a": text(1, SIZE)})
    return db[STREAM]


COPY = [{"$set": {"copy": "$fullDocument.b"}}]
"""A stage that gives the event a fourth large field (a copy of the new one)."""


def handler(database: str, seen: list[Any], mode: str, stages: list[dict[str, Any]]) -> type:
    """A class recording the ``raw`` of every event it handles, one at a time or in batches."""

    @change_stream(
        STREAM, database, name=STREAM, max_await_time_ms=50, split_large_events=True, **IMAGES
    )
    @pipeline(stages)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class PerEvent:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append(event.raw)

    @change_stream(
        STREAM, database, name=STREAM, max_await_time_ms=50, split_large_events=True, **IMAGES
    )
    @pipeline(stages)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=10, max_wait_seconds=0.2)
        def handle(self, events: list[ChangeEvent]) -> None:
            seen.extend(event.raw for event in events)

    return PerEvent if mode == "event" else Batches


@pytest.mark.parametrize("stages", [[], COPY], ids=["3 fragments", "4 fragments"])
@pytest.mark.parametrize(
    ("path", "mode"),
    [("decoded", "event"), ("decoded", "batch"), ("raw", "event")],
    ids=["decoded per event", "decoded in batches", "raw per event"],
)
async def test_a_handler_gets_an_event_of_several_fragments_whole_over_32_mb_too(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    huge: Collection[Any],
    db_name: str,
    path: str,
    mode: str,
    stages: list[dict[str, Any]],
) -> None:
    before = huge.find_one({"_id": 1})
    assert before is not None
    new_value = text(2, SIZE)
    store = RecordingStore()
    seen: list[Any] = []
    # The raw path is taken for events a client reads as RawBSONDocument; the decoded one otherwise.
    document_class = RawBSONDocument if path == "raw" else dict
    reading: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(
        mongodb_uri, appname="flowwarden", document_class=document_class, tz_aware=True
    )
    connector = Connector(reading, [handler(db_name, seen, mode, stages)], checkpoint_store=store)
    run = asyncio.create_task(connector.run_async())
    try:
        watched = huge.with_options(codec_options=AWARE)
        with watched.watch([*stages, {"$changeStreamSplitLargeEvent": {}}], **IMAGES) as split:
            await wait_until_async(lambda: store.load(STREAM), what="the opening position")
            huge.update_one({"_id": 1}, {"$unset": {"a": ""}, "$set": {"b": new_value}})
            after = huge.find_one({"_id": 1})
            huge.insert_one({"_id": 2})
            fragments = [split.next()]
            while fragments[-1]["splitEvent"]["fragment"] < fragments[-1]["splitEvent"]["of"]:
                fragments.append(split.next())
            following = split.next()
        await wait_until_async(lambda: len(seen) >= 2, timeout=60, what="the large event and the next")
        await wait_until_async(
            lambda: (saved := store.load(STREAM)) and saved.last_processed_token == following["_id"],
            what="the checkpoint after the next event",
        )
    finally:
        connector.stop()
        await run
        await reading.close()

    assert connector.stream_errors() == {}
    total = 3 + len(stages)
    assert [f["splitEvent"] for f in fragments] == [{"fragment": n, "of": total} for n in range(1, total + 1)]
    if path == "raw":
        assert all(isinstance(event, RawBSONDocument) for event in seen)
        seen = [bson.decode(event.raw, AWARE) for event in seen]
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in seen] == [("update", 1), ("insert", 2)]
    whole = seen[0]

    # Against what was written: the document before, the document after, the update.
    assert after == {"_id": 1, "b": new_value}
    assert whole["fullDocumentBeforeChange"] == before == {"_id": 1, "a": text(1, SIZE)}
    assert whole["fullDocument"] == after
    assert whole["updateDescription"]["updatedFields"] == {"b": new_value}
    assert whole["updateDescription"]["removedFields"] == ["a"]
    assert whole["ns"] == {"db": db_name, "coll": STREAM} and whole["documentKey"] == {"_id": 1}
    if stages:
        assert whole["copy"] == new_value
    # Against what the server sent: every field of every fragment, under the last one's token.
    sent = {name: value for f in fragments for name, value in f.items() if name not in ("_id", "splitEvent")}
    assert_same_fields(whole, {"_id": fragments[-1]["_id"], **sent})
    # A middle fragment carries a large field of its own: losing one loses that field.
    for middle in fragments[1:-1]:
        assert any(len(bson.encode({name: value})) > SIZE for name, value in middle.items()), list(middle)
    assert len(bson.encode(whole)) > (32 * MiB if stages else 3 * SIZE)
    # Only the last fragment's token is ever a position.
    assert not any(dict(f["_id"]) in store.tokens for f in fragments[:-1])
