"""Change events over 16 MB: the stage that has the server split them, and joining them again.

MongoDB cannot return a change event whose BSON is over 16 MB: the stream fails with
BSONObjectTooLarge (10334), unless its pipeline ends with ``$changeStreamSplitLargeEvent``
(MongoDB 7.0+). Then such an event arrives as fragments, one after the other, each
``{_id: <a token of its own>, splitEvent: {fragment: n, of: total}, <some of the event's fields>}``.

A change stream read through :class:`JoinedChangeStream` (PyMongo's) or
:class:`AsyncJoinedChangeStream` (an async client's) never returns a fragment. The rules it keeps:

- an event is returned only whole: the fields of fragments 1 to ``total``, in order, under the
  ``_id`` of the last fragment, without ``splitEvent``. Resuming after that token continues with
  the next event, so it is the whole event's position, and the only fragment token that ever
  leaves this module;
- while fragments are held, :attr:`~JoinedChangeStream.resume_token` is None: the post-batch token
  the driver holds then lies between fragments, and a stream resumed there would return the rest
  of the event alone;
- a fragment without the ones before it (a stream opened at a position inside a split event), or
  an event where the next fragment was due, fails the stream with
  :class:`~flowwarden.errors.StreamError`: the whole event can no longer be formed.

Raw events (``RawBSONDocument``, :class:`~flowwarden.mongo.raw_events.RawEvent`) are joined as raw BSON
of the fragments' class, without decoding a field; other events into the fragments' own mapping
class. Nothing here decides where a stream starts, or what is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from struct import Struct
from typing import Any, TypeGuard

import bson
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

from flowwarden.errors import StreamError
from flowwarden.mongo import codes

__all__ = [
    "SPLIT_STAGE_NAME",
    "AsyncJoinedChangeStream",
    "Fragments",
    "JoinedChangeStream",
    "is_too_large",
    "splits_large_events",
    "too_large_error",
    "with_split_stage",
]

SPLIT_STAGE_NAME = "$changeStreamSplitLargeEvent"

_INT32 = Struct("<i")
# A fragment's first two elements, as the split stage (always a pipeline's last) writes them.
_ID_ELEMENT = b"\x03_id\x00"
_SPLIT_ELEMENT = b"\x03splitEvent\x00"
_ID_VALUE = len(_ID_ELEMENT) + 4
_CODEC_OPTIONS = vars(RawBSONDocument).get("_RawBSONDocument__codec_options")


# -- the stage -----------------------------------------------------------------------------------


def splits_large_events(pipeline: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a stream's pipeline ends with ``$changeStreamSplitLargeEvent`` (it is refused
    anywhere else), so its events over 16 MB come as fragments."""
    return bool(pipeline) and SPLIT_STAGE_NAME in pipeline[-1]


def with_split_stage(pipeline: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``pipeline`` ending with ``$changeStreamSplitLargeEvent`` (added once: a pipeline
    that ends with it already keeps its own)."""
    stages = [dict(stage) for stage in pipeline]
    if not splits_large_events(stages):
        stages.append({SPLIT_STAGE_NAME: {}})
    return stages


# -- without the stage ---------------------------------------------------------------------------


def is_too_large(error: BaseException) -> TypeGuard[OperationFailure]:
    """Whether a change stream failed on an event over 16 MB that it may not split."""
    return isinstance(error, OperationFailure) and error.code == codes.BSON_OBJECT_TOO_LARGE


def too_large_error(error: OperationFailure, *, owner: str, stream: str, remedy: str) -> StreamError:
    """The error a stream without the split stage fails with on an event over 16 MB: it says how
    to read such events (``remedy``, the option as the reader's user writes it)."""
    return StreamError(
        f"{owner}: a change event is over MongoDB's 16 MB limit, so the server cannot return it "
        f"(BSONObjectTooLarge, {codes.BSON_OBJECT_TOO_LARGE}). Read such events with {remedy} "
        "(MongoDB 7.0+): the server then splits them and flowwarden joins the fragments into one "
        "event again; or leave the large fields out of the events with a $project stage. The "
        f"stream's position stays before the event. The server said: {error}",
        stream=stream,
    )


# -- joining fragments ---------------------------------------------------------------------------


def _raw_split(data: bytes | memoryview) -> int | None:
    """Where the ``splitEvent`` element of a raw fragment starts, or None for a whole event.

    The split stage is a pipeline's last, so nothing moves the fields it writes: ``_id`` first,
    ``splitEvent`` second. Only those two element headers are read.
    """
    if data[4:_ID_VALUE] != _ID_ELEMENT:
        return None
    at = _ID_VALUE + int(_INT32.unpack_from(data, _ID_VALUE)[0])
    return at if data[at : at + len(_SPLIT_ELEMENT)] == _SPLIT_ELEMENT else None


def _split_of(event: Mapping[str, Any]) -> tuple[int, int] | None:
    """(fragment, of) of a fragment; None for a whole event."""
    split: Mapping[str, Any] | None
    if isinstance(event, RawBSONDocument):
        data = event.raw
        at = _raw_split(data)
        if at is None:
            return None
        start = at + len(_SPLIT_ELEMENT)
        length = int(_INT32.unpack_from(data, start)[0])
        split = bson.decode(bytes(data[start : start + length]))
    else:
        split = event.get("splitEvent")
        if split is None:
            return None
    return int(split["fragment"]), int(split["of"])


def _join_raw(fragments: list[RawBSONDocument]) -> RawBSONDocument:
    last = fragments[-1]
    head = last.raw
    parts = [bytes(head[4 : _ID_VALUE + int(_INT32.unpack_from(head, _ID_VALUE)[0])])]
    for fragment in fragments:
        data = fragment.raw
        at = _raw_split(data)
        assert at is not None  # only fragments are held
        fields = at + len(_SPLIT_ELEMENT) + int(_INT32.unpack_from(data, at + len(_SPLIT_ELEMENT))[0])
        parts.append(bytes(data[fields:-1]))
    body = b"".join(parts)
    document = _INT32.pack(len(body) + 5) + body + b"\x00"
    codec = _CODEC_OPTIONS.__get__(last) if _CODEC_OPTIONS is not None else None
    return type(last)(document, codec)


def _join(fragments: list[Any]) -> Any:
    """The event the fragments were cut from: their fields in order, under the last one's ``_id``."""
    last = fragments[-1]
    if isinstance(last, RawBSONDocument):
        return _join_raw(fragments)
    # PyMongo builds every document as document_class(), so the class takes no arguments.
    event: MutableMapping[str, Any] = type(last)()
    event["_id"] = last["_id"]
    for fragment in fragments:
        for key, value in fragment.items():
            if key != "_id" and key != "splitEvent":
                event[key] = value
    return event


class Fragments:
    """The fragments of one split event, held until its last one arrives."""

    __slots__ = ("_held", "_owner", "_stream", "_total")

    def __init__(self, owner: str, stream: str) -> None:
        self._owner = owner
        self._stream = stream
        self._held: list[Any] = []
        self._total = 0

    @property
    def holding(self) -> bool:
        """Whether the first fragments of an event arrived and its last has not."""
        return bool(self._held)

    def add(self, event: Any) -> Any:
        """``event`` when it is whole; the joined event when it is a split event's last fragment;
        None for any other fragment (held). Raises StreamError when the fragments do not follow
        each other."""
        split = _split_of(event)
        held = self._held
        if split is None:
            if held:
                raise self._broken(
                    f"a whole event came while fragment {len(held) + 1} of {self._total} of a split "
                    "event was due"
                )
            return event
        number, total = split
        if number != len(held) + 1:
            raise self._broken(
                f"fragment {number} of {total} of a split event came after {len(held)} fragment(s) of it"
            )
        held.append(event)
        self._total = total
        if number < total:
            return None
        self._held = []
        return _join(held)

    def drop(self) -> None:
        """Forget held fragments (the stream is read again from a position before their event)."""
        self._held = []

    def _broken(self, what: str) -> StreamError:
        return StreamError(
            f"{self._owner}: {what}, so the whole event cannot be formed; the stream was opened at "
            "a position inside a split event, which flowwarden never stores (only the last "
            "fragment's token is an event's position). Resume from a position before the event.",
            stream=self._stream,
        )


class _Joined:
    def __init__(self, stream: Any, owner: str, name: str) -> None:
        self._stream = stream
        self._fragments = Fragments(owner, name)

    @property
    def resume_token(self) -> Any:
        """The driver's resume token, or None while fragments are held (it lies between them)."""
        return None if self._fragments.holding else self._stream.resume_token

    @property
    def alive(self) -> bool:
        return bool(self._stream.alive)

    def close(self) -> Any:
        """Close the driver's stream (an awaitable for async clients)."""
        self._fragments.drop()
        return self._stream.close()


class JoinedChangeStream(_Joined):
    """A PyMongo change stream that returns events over 16 MB whole (see the module docstring);
    ``owner`` and ``name`` say whose stream it is in error messages."""

    def try_next(self) -> Any:
        """The next whole event, or None when the stream has none now (or only some fragments)."""
        fragments = self._fragments
        while True:
            event = self._stream.try_next()
            if event is None:
                return None
            whole = fragments.add(event)
            if whole is not None:
                return whole

    def __enter__(self) -> JoinedChangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncJoinedChangeStream(_Joined):
    """An async client's change stream that returns events over 16 MB whole (see the module
    docstring); ``owner`` and ``name`` say whose stream it is in error messages."""

    async def try_next(self) -> Any:
        """The next whole event, or None when the stream has none now (or only some fragments)."""
        fragments = self._fragments
        stream = self._stream
        while True:
            event = await stream.try_next()
            if event is None:
                return None
            whole = fragments.add(event)
            if whole is not None:
                return whole
