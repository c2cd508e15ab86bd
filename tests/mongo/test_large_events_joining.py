"""flowwarden.mongo.large_events on its own: joining split events one after another, the PyMongo
stream wrapper, raw events decoded as their stream decodes them, and what the errors say."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import bson
import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

from flowwarden.errors import StreamError
from flowwarden.mongo.large_events import Fragments, JoinedChangeStream, too_large_error


def fragment(token: str, number: int, total: int, **fields: Any) -> dict[str, Any]:
    return {"_id": {"_data": token}, "splitEvent": {"fragment": number, "of": total}, **fields}


class ScriptedStream:
    """A PyMongo change stream's try_next() over a script of events and empty reads (None)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.alive = True
        self.closed = False
        self.resume_token: dict[str, Any] | None = {"_data": "00"}

    def try_next(self) -> Any:
        if not self.script:
            return None
        item = self.script.pop(0)
        if item is not None:
            self.resume_token = item["_id"]
        return item

    def close(self) -> None:
        self.closed = True


def test_split_events_one_after_another_are_each_joined() -> None:
    fragments = Fragments("stream 's'", "s")
    assert fragments.add(fragment("20", 1, 2, a=1)) is None
    assert fragments.add(fragment("21", 2, 2, b=2)) == {"_id": {"_data": "21"}, "a": 1, "b": 2}
    assert fragments.add(fragment("30", 1, 3, c=3)) is None
    assert fragments.add(fragment("31", 2, 3, d=4)) is None
    assert fragments.add(fragment("32", 3, 3, e=5)) == {"_id": {"_data": "32"}, "c": 3, "d": 4, "e": 5}
    assert not fragments.holding


def test_after_drop_the_next_split_event_is_joined_from_its_first_fragment() -> None:
    fragments = Fragments("stream 's'", "s")
    assert fragments.add(fragment("20", 1, 2, a=1)) is None
    fragments.drop()
    assert not fragments.holding
    assert fragments.add(fragment("20", 1, 2, a=1)) is None
    assert fragments.add(fragment("21", 2, 2, b=2)) == {"_id": {"_data": "21"}, "a": 1, "b": 2}


def test_a_pymongo_stream_returns_only_whole_events_and_no_position_between_fragments() -> None:
    stream = ScriptedStream(
        [
            {"_id": {"_data": "10"}, "operationType": "insert"},
            fragment("20", 1, 2, operationType="update"),
            None,
            fragment("21", 2, 2, large="x"),
        ]
    )
    joined = JoinedChangeStream(stream, "stream 's'", "s")
    with joined:
        assert joined.try_next() == {"_id": {"_data": "10"}, "operationType": "insert"}
        assert joined.resume_token == {"_data": "10"}
        assert joined.try_next() is None  # only a fragment so far
        assert joined.resume_token is None, "the driver's token lies between fragments"
        assert joined.alive
        assert joined.try_next() == {"_id": {"_data": "21"}, "operationType": "update", "large": "x"}
        assert joined.resume_token == {"_data": "21"}
        assert joined.try_next() is None
    assert stream.closed


def test_closing_a_pymongo_stream_forgets_held_fragments() -> None:
    joined = JoinedChangeStream(ScriptedStream([fragment("20", 1, 2)]), "stream 's'", "s")
    assert joined.try_next() is None and joined.resume_token is None
    joined.close()
    assert joined.resume_token == {"_data": "20"}


def test_a_broken_split_event_names_its_stream_and_what_to_do() -> None:
    joined = JoinedChangeStream(ScriptedStream([fragment("21", 2, 2)]), "stream 'orders'", "orders")
    with pytest.raises(StreamError) as raised:
        joined.try_next()
    assert raised.value.stream == "orders"
    assert str(raised.value) == (
        "stream 'orders': fragment 2 of 2 of a split event came after 0 fragment(s) of it, so the whole "
        "event cannot be formed; the stream was opened at a position inside a split event, which "
        "flowwarden never stores (only the last fragment's token is an event's position). Resume from "
        "a position before the event."
    )


def test_a_raw_split_event_is_joined_with_its_streams_codec_options() -> None:
    options: CodecOptions[Any] = CodecOptions(document_class=RawBSONDocument, tz_aware=True)
    when = datetime(2024, 1, 1, tzinfo=timezone.utc)
    fragments = Fragments("stream 's'", "s")
    raw = [
        RawBSONDocument(bson.encode(fragment("20", 1, 2, when=when)), options),
        RawBSONDocument(bson.encode(fragment("21", 2, 2, n=1)), options),
    ]
    assert fragments.add(raw[0]) is None
    whole = fragments.add(raw[1])
    assert isinstance(whole, RawBSONDocument)
    assert whole["when"] == when and whole["when"].tzinfo is not None


def test_an_event_too_large_to_return_says_how_to_read_it() -> None:
    error = too_large_error(
        OperationFailure("BSONObj size is invalid", 10334),
        owner="stream 'big'",
        stream="big",
        remedy="@change_stream(split_large_events=True)",
    )
    assert error.stream == "big"
    assert str(error) == (
        "stream 'big': a change event is over MongoDB's 16 MB limit, so the server cannot return it "
        "(BSONObjectTooLarge, 10334). Read such events with @change_stream(split_large_events=True) "
        "(MongoDB 7.0+): the server then splits them and flowwarden joins the fragments into one event "
        "again; or leave the large fields out of the events with a $project stage. The stream's "
        "position stays before the event. The server said: BSONObj size is invalid"
    )
