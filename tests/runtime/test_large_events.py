"""Change events over 16 MB in the connector: ``@change_stream(split_large_events=True)`` joins
their fragments into one event before any method sees it, and the checkpoint never stands between
fragments; without the option such an event fails the stream at once, naming the option.

The large event is an update of a document of :data:`HALF` bytes, watched with its pre-image and
its looked-up post-image: just over 16 MB, split by the server into two fragments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import bson
import pymongo
import pytest
from bson.codec_options import CodecOptions
from pymongo import monitoring
from pymongo.collection import Collection
from pymongo.errors import OperationFailure

from flowwarden import (
    ChangeEvent,
    Connector,
    StreamError,
    StreamState,
    change_stream,
    checkpoint,
    on_batch,
    on_change,
)
from flowwarden.checkpoints import Checkpoint
from flowwarden.checkpoints.memory import InMemoryCheckpointStore
from flowwarden.events import compare_tokens
from flowwarden.mongo.large_events import AsyncJoinedChangeStream, Fragments, with_split_stage
from flowwarden.mongo.raw_events import RawEvent
from flowwarden.runtime.read_ahead import EmptyRead, ReadAhead
from helpers import running, wait_until, wait_until_async

from .conftest import FailCommand

HALF = 8_400_000
IMAGES: dict[str, Any] = {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"}
SPLIT: list[dict[str, Any]] = [{"$changeStreamSplitLargeEvent": {}}]
# The same event without its pre-image fits whole: the reference a joined event must equal.
SLIM: list[dict[str, Any]] = [{"$project": {"fullDocumentBeforeChange": 0}}]
STREAM = "big"


@pytest.fixture
def big(client: pymongo.MongoClient[Any], db_name: str) -> Collection[Any]:
    """A collection that records pre-images, holding ``{_id: 1, a: <HALF bytes>}``; the deployment
    must split large events (MongoDB 7.0+)."""
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"needs MongoDB 7.0+ ($changeStreamSplitLargeEvent); the deployment runs {found}")
    db = client[db_name]
    db.create_collection(STREAM, changeStreamPreAndPostImages={"enabled": True})
    db[STREAM].insert_one({"_id": 1, "a": "x" * HALF})
    return db[STREAM]


def grow(coll: Collection[Any]) -> None:
    """The update whose event, with both images, is over 16 MB: it sets one small field."""
    coll.update_one({"_id": 1}, {"$set": {"b": 1}})


class RecordingStore(InMemoryCheckpointStore):
    """An in-memory store that keeps every token it was asked to store."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[dict[str, Any]] = []

    def save(self, checkpoint: Checkpoint) -> Any:
        for token in (
            checkpoint.last_processed_token,
            checkpoint.last_seen_token,
            checkpoint.batch_end_token,
        ):
            if token is not None:
                self.tokens.append(dict(token))
        return super().save(checkpoint)

    def save_seen(self, stream_id: str, token: Any, epoch: int) -> Any:
        self.tokens.append(dict(token))
        return super().save_seen(stream_id, token, epoch)

    def save_batch_end(self, stream_id: str, token: Any, epoch: int) -> Any:
        self.tokens.append(dict(token))
        return super().save_batch_end(stream_id, token, epoch)


def large_event_handler(
    database: str, seen: list[dict[str, Any]], *, mode: str = "event", **stream: Any
) -> type:
    """A class recording every event it handles as a dict, one at a time or in batches."""

    @change_stream(STREAM, database, name=STREAM, max_await_time_ms=50, **IMAGES, **stream)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class PerEvent:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            seen.append(dict(event.raw))

    @change_stream(STREAM, database, name=STREAM, max_await_time_ms=50, **IMAGES, **stream)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Batches:
        @on_batch(max_events=10, max_wait_seconds=0.2)
        def handle(self, events: list[ChangeEvent]) -> None:
            seen.extend(dict(event.raw) for event in events)

    return PerEvent if mode == "event" else Batches


def without_id(event: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in event.items() if key != "_id"}


def operations(seen: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(event["operationType"], event["documentKey"]["_id"]) for event in seen]


# ------------------------------------------------------------------------------------------------
# Joining


@pytest.mark.parametrize("mode", ["event", "batch"])
def test_a_method_gets_a_large_event_whole_and_the_checkpoint_only_its_last_fragment(
    mongodb_uri: str, client: pymongo.MongoClient[Any], big: Collection[Any], db_name: str, mode: str
) -> None:
    store = RecordingStore()
    seen: list[dict[str, Any]] = []
    handler = large_event_handler(db_name, seen, mode=mode, split_large_events=True)
    before = big.find_one({"_id": 1})
    aware: Collection[Any] = big.with_options(
        codec_options=CodecOptions(tz_aware=True)
    )  # as the connector's client
    with (
        aware.watch(SPLIT, **IMAGES, max_await_time_ms=50) as split,
        aware.watch(SLIM, **IMAGES, max_await_time_ms=50) as slim,
        running(mongodb_uri, [handler], checkpoint_store=store),
    ):
        wait_until(lambda: store.load(STREAM), what="the opening position")
        grow(big)
        big.insert_one({"_id": 2})
        wait_until(
            lambda: (store.load(STREAM) or Checkpoint(stream_id=STREAM)).events_processed == 2,
            what="2 events",
        )
        fragments = [split.next(), split.next()]
        reference = slim.next()
        following = slim.next()

    assert [f["splitEvent"] for f in fragments] == [{"fragment": 1, "of": 2}, {"fragment": 2, "of": 2}]
    assert operations(seen) == [("update", 1), ("insert", 2)]
    whole = seen[0]
    assert whole["_id"] == fragments[-1]["_id"]  # resuming after it continues with the next event
    assert without_id(whole) == {**without_id(reference), "fullDocumentBeforeChange": before}
    assert len(bson.encode(whole)) > 16 * 1024 * 1024
    assert fragments[0]["_id"] not in store.tokens
    assert store.load(STREAM).last_processed_token == following["_id"]  # type: ignore[union-attr]


class FragmentListener(monitoring.CommandListener):
    """Records the token of each fragment the connector's change stream receives, by fragment
    number; ``on_first_fragment`` runs once, when a reply first brings a first fragment, before
    the driver hands it on."""

    def __init__(self, on_first_fragment: Callable[[], None]) -> None:
        self.tokens: dict[int, dict[str, Any]] = {}
        self._hook: Callable[[], None] | None = on_first_fragment
        self.fired = asyncio.Event()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        cursor = event.reply.get("cursor") if event.command_name in ("aggregate", "getMore") else None
        if not cursor:
            return
        for document in cursor.get("firstBatch", cursor.get("nextBatch", [])):
            split = document.get("splitEvent")
            if split is None:
                continue
            self.tokens[split["fragment"]] = dict(document["_id"])
            if split["fragment"] < split["of"] and self._hook is not None:
                hook, self._hook = self._hook, None
                hook()
                self.fired.set()

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.parametrize("interruption", ["restart", "stop"])
async def test_a_stream_interrupted_between_fragments_delivers_the_event_once(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    big: Collection[Any],
    db_name: str,
    fail_command: FailCommand,
    interruption: str,
) -> None:
    """The getMore that would bring the second fragment fails (restart: the stream re-opens from
    its checkpoint), or hangs while the connector stops and a new one starts. Either way the first
    fragment was held, never handled, and never a stored position."""
    if interruption == "restart":
        data: dict[str, Any] = {"errorCode": 2}  # BadValue: not transient, the stream re-opens
    else:
        data = {"errorCode": 2, "blockConnection": True, "blockTimeMS": 5000}
    listener = FragmentListener(lambda: fail_command(["getMore"], mode={"times": 1}, **data))
    store = RecordingStore()
    seen: list[dict[str, Any]] = []
    handler = large_event_handler(db_name, seen, split_large_events=True, restart_initial_delay_seconds=0.05)
    async_client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(
        mongodb_uri, appname="flowwarden", event_listeners=[listener]
    )
    connector = Connector(async_client, [handler], checkpoint_store=store)
    run = asyncio.create_task(connector.run_async())
    try:
        await wait_until_async(lambda: store.load(STREAM), what="the opening position")
        grow(big)
        await asyncio.wait_for(listener.fired.wait(), 20)
        if interruption == "stop":
            connector.stop()
            await run
            stopped_at = store.load(STREAM)
            assert seen == []
            assert stopped_at is not None and stopped_at.resume_token is not None
            assert compare_tokens(stopped_at.resume_token, listener.tokens[1]) < 0
            connector = Connector(async_client, [handler], checkpoint_store=store)
            run = asyncio.create_task(connector.run_async())
        await wait_until_async(lambda: seen, what="the large event")
        big.insert_one({"_id": 2})
        await wait_until_async(lambda: len(seen) >= 2, what="the event after it")
        restarts = connector.status()[STREAM].restarts
    finally:
        connector.stop()
        await run
        await async_client.close()

    assert fail_command.off() == 1
    assert restarts == (1 if interruption == "restart" else 0)
    assert operations(seen) == [("update", 1), ("insert", 2)]
    assert sorted(listener.tokens) == [1, 2]
    first, last = listener.tokens[1], listener.tokens[2]
    assert seen[0]["_id"] == last and "splitEvent" not in seen[0]
    assert first not in store.tokens and last in store.tokens


# ------------------------------------------------------------------------------------------------
# Without the option


def test_without_the_option_a_large_event_fails_the_stream_at_once_naming_it(
    mongodb_uri: str, client: pymongo.MongoClient[Any], big: Collection[Any], db_name: str
) -> None:
    store = RecordingStore()
    seen: list[dict[str, Any]] = []
    handler = large_event_handler(db_name, seen)
    with (
        big.watch(SLIM, **IMAGES, max_await_time_ms=50) as slim,
        running(mongodb_uri, [handler], checkpoint_store=store) as connector,
    ):
        wait_until(lambda: store.load(STREAM), what="the opening position")
        grow(big)
        wait_until(lambda: connector.status()[STREAM].state == StreamState.FAILED, what="FAILED")
        status = connector.status()[STREAM]
        error = connector.stream_errors()[STREAM]
        event = slim.next()

    assert isinstance(error, StreamError) and error.stream == STREAM
    assert isinstance(error.__cause__, OperationFailure) and error.__cause__.code == 10334
    message = str(error)
    assert message.startswith(f"stream {STREAM!r}: a change event is over MongoDB's 16 MB limit")
    assert " Read such events with @change_stream(split_large_events=True) (MongoDB 7.0+): " in message
    assert message.endswith(f"The server said: {error.__cause__}")
    assert status.restarts == 0  # fatal: not re-opened
    assert seen == []
    stored = store.load(STREAM)
    assert stored is not None and stored.resume_token is not None
    assert compare_tokens(stored.resume_token, event["_id"]) < 0


# ------------------------------------------------------------------------------------------------
# The rules on their own


def fragment(token: str, number: int, total: int, **fields: Any) -> dict[str, Any]:
    return {"_id": {"_data": token}, "splitEvent": {"fragment": number, "of": total}, **fields}


class ScriptedStream:
    """try_next() plays a script of events and empty reads (None); an empty read leaves the
    resume token at the last event read, as a batch ending with that event would."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.alive = True
        self.resume_token: dict[str, Any] | None = {"_data": "00"}

    async def try_next(self) -> Any:
        await asyncio.sleep(0)
        if not self.script:
            self.alive = False
            return None
        item = self.script.pop(0)
        if item is not None:
            self.resume_token = item["_id"]
        return item

    def close(self) -> None:
        pass


def test_an_empty_read_between_fragments_carries_no_position() -> None:
    script = [
        {"_id": {"_data": "10"}, "operationType": "insert"},
        fragment("20", 1, 2, operationType="update", small=1),
        None,  # the batch ended after the first fragment: its token is no resume point
        fragment("21", 2, 2, large="x"),
        None,
    ]

    async def main() -> list[Any]:
        reader = ReadAhead(AsyncJoinedChangeStream(ScriptedStream(script), "stream 's'", "s"), limit=10)
        try:
            return [reader.items.popleft() if reader.items else await reader.wait() for _ in range(5)]
        finally:
            await reader.close(timeout=2.0)

    first, empty, whole, after, end = asyncio.run(main())
    assert first["operationType"] == "insert"
    assert isinstance(empty, EmptyRead) and empty.token is None and empty.alive
    assert whole == {"_id": {"_data": "21"}, "operationType": "update", "small": 1, "large": "x"}
    assert isinstance(after, EmptyRead) and after.token == {"_data": "21"}
    assert isinstance(end, EmptyRead) and not end.alive


def test_raw_fragments_join_into_raw_bson_equal_to_the_decoded_join() -> None:
    decoded = [fragment("20", 1, 2, operationType="update", n=1), fragment("21", 2, 2, doc={"a": [1, 2]})]
    raw = [RawEvent(bson.encode(f)) for f in decoded]
    joined_raw = Fragments("stream 's'", "s")
    joined = Fragments("stream 's'", "s")
    assert joined_raw.add(raw[0]) is None and joined.add(decoded[0]) is None
    assert joined_raw.holding
    whole_raw, whole = joined_raw.add(raw[1]), joined.add(decoded[1])
    assert isinstance(whole_raw, RawEvent) and not joined_raw.holding
    assert whole_raw["_id"] == {"_data": "21"} and whole_raw["operationType"] == "update"
    assert (
        bson.decode(whole_raw.raw)
        == whole
        == {
            "_id": {"_data": "21"},
            "operationType": "update",
            "n": 1,
            "doc": {"a": [1, 2]},
        }
    )
    plain = RawEvent(bson.encode({"_id": {"_data": "30"}, "operationType": "insert"}))
    assert joined_raw.add(plain) is plain


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([fragment("21", 2, 2)], "fragment 2 of 2 of a split event came after 0 fragment(s)"),
        (
            [fragment("20", 1, 2), {"_id": {"_data": "30"}}],
            "a whole event came while fragment 2 of 2 of a split event was due",
        ),
    ],
    ids=["opened between fragments", "a fragment missing"],
)
def test_fragments_that_do_not_follow_each_other_fail_the_stream(script: list[Any], message: str) -> None:
    fragments = Fragments("stream 's'", "s")
    with pytest.raises(StreamError) as caught:
        for event in script:
            fragments.add(event)
    assert message in str(caught.value) and caught.value.stream == "s"
    assert "Resume from a position before the event" in str(caught.value)


def test_the_split_stage_is_added_last_and_once() -> None:
    match = {"$match": {"operationType": "update"}}
    assert with_split_stage([match]) == [match, *SPLIT]
    assert with_split_stage([match, *SPLIT]) == [match, *SPLIT]
