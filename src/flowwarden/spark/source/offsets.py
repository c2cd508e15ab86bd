"""The streaming source's offsets: typed values, and the one versioned JSON form Spark keeps.

Spark writes every offset the source returns into the query's checkpointLocation (one JSON line
of ``offsets/<batch>``) and hands it back after a restart, which may run another flowwarden
release. An offset is a frozen value of one of seven kinds; its JSON names the format version and
the kind, e.g. ``{"v": 1, "kind": "token", "token": "8266..."}``:

- ``token``: after the event (or the stream position) whose resume token ``_data`` is ``token``;
- ``time``: at the cluster time ``at``, inclusive; only a query's initial offset for
  ``start_position`` EARLIEST or AT_TIME;
- ``read_from``: the end, at ``token``, of a micro-batch read from the oplog's start ``read_from``
  after the history it should have started from was lost (``on_history_lost``);
- ``skipped``: the end, at ``token``, of a micro-batch that skipped lost history: no event;
- ``partitions``: one offset of the four kinds above per hash bucket (``partitions`` option);
- ``snapshot``: a position in the initial copy (:mod:`~flowwarden.spark.source.snapshot`);
- ``requested``: after the event ``token``, in an incremental snapshot: the micro-batch that
  ends there handed over a chunk of the copy (:mod:`~flowwarden.spark.source.requested`).

Hard rule: :func:`parse_offset` is the only reader of that JSON, and the source converts at
Spark's boundary only (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``). It reads
an offset of :data:`FORMAT_VERSION` exactly, field by field, and refuses anything else with
:class:`~flowwarden.errors.UnreadableOffsetError`: no version or an unknown one, a kind or field,
a missing field, a value of the wrong type. It never guesses, so an offset is never misread.
Offsets are always written in :data:`FORMAT_VERSION`; a change that an older release would
misread gets a new version.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from bson import Timestamp, json_util

from flowwarden.errors import UnreadableOffsetError
from flowwarden.spark.source.options import OWNER

__all__ = [
    "FORMAT_VERSION",
    "BucketOffset",
    "Offset",
    "PartitionedOffset",
    "ReadFromOffset",
    "RequestedOffset",
    "SkippedOffset",
    "SnapshotOffset",
    "StreamOffset",
    "TimeOffset",
    "TokenOffset",
    "bucket_offset",
    "dump_filter",
    "load_filter",
    "parse_offset",
    "resume_token",
]

FORMAT_VERSION = 1
"""The format version of the offsets this release writes."""

_HEX = re.compile(r"[0-9A-Fa-f]+")
# Canonical Extended JSON keeps an _id's exact BSON type through the offset log.
_ID_JSON = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True)


class _Unreadable(Exception):
    """Why an offset cannot be read; :func:`parse_offset` turns it into UnreadableOffsetError."""

    def __init__(self, reason: str, version: Any = FORMAT_VERSION) -> None:
        super().__init__(reason)
        self.reason = reason
        self.version = version


@dataclasses.dataclass(frozen=True)
class Offset:
    """An offset of the source; each kind is a subclass."""

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The offset as the JSON object Spark writes to the offsets log."""
        return {"v": FORMAT_VERSION, **self._body()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def _body(self) -> dict[str, Any]:
        raise NotImplementedError


def _check_token(token: str) -> None:
    if not isinstance(token, str) or not _HEX.fullmatch(token):
        raise ValueError(f"a resume token's _data is a hex string, not {token!r}")


def _time_body(at: Timestamp) -> dict[str, int]:
    return {"t": at.time, "i": at.inc}


@dataclasses.dataclass(frozen=True)
class TokenOffset(Offset):
    """After the event, or the stream position, whose resume token ``_data`` is ``token``."""

    kind: ClassVar[str] = "token"
    token: str

    def __post_init__(self) -> None:
        _check_token(self.token)

    def _body(self) -> dict[str, Any]:
        return {"kind": self.kind, "token": self.token}


@dataclasses.dataclass(frozen=True)
class TimeOffset(Offset):
    """At the cluster time ``at``, inclusive: a query's first micro-batch starts there."""

    kind: ClassVar[str] = "time"
    at: Timestamp

    def __post_init__(self) -> None:
        if not isinstance(self.at, Timestamp):
            raise ValueError(f"a time offset holds a bson Timestamp, not {self.at!r}")

    def _body(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": _time_body(self.at)}


@dataclasses.dataclass(frozen=True)
class ReadFromOffset(Offset):
    """The end, at ``token``, of a micro-batch read from the oplog's start ``read_from`` because
    the history after its start was lost; the next micro-batch starts after ``token``."""

    kind: ClassVar[str] = "read_from"
    token: str
    read_from: Timestamp

    def __post_init__(self) -> None:
        _check_token(self.token)
        if not isinstance(self.read_from, Timestamp):
            raise ValueError(f"read_from is a bson Timestamp, not {self.read_from!r}")

    def _body(self) -> dict[str, Any]:
        return {"kind": self.kind, "token": self.token, "read_from": _time_body(self.read_from)}


@dataclasses.dataclass(frozen=True)
class SkippedOffset(Offset):
    """The end, at ``token``, of a micro-batch that skipped lost history: it holds no event."""

    kind: ClassVar[str] = "skipped"
    token: str

    def __post_init__(self) -> None:
        _check_token(self.token)

    def _body(self) -> dict[str, Any]:
        return {"kind": self.kind, "token": self.token}


BucketOffset = TokenOffset | TimeOffset | ReadFromOffset | SkippedOffset
"""The offsets one hash bucket of a partitioned source can be at."""
_BUCKET_KINDS = (TokenOffset, TimeOffset, ReadFromOffset, SkippedOffset)


@dataclasses.dataclass(frozen=True)
class PartitionedOffset(Offset):
    """One offset per hash bucket of ``documentKey._id`` (the ``partitions`` option), in bucket
    order; a query keeps the number of buckets it started with."""

    kind: ClassVar[str] = "partitions"
    buckets: tuple[BucketOffset, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.buckets, tuple) or not self.buckets:
            raise ValueError(f"a partitioned offset holds a non-empty tuple of offsets, not {self.buckets!r}")
        for bucket in self.buckets:
            bucket_offset(bucket)

    def _body(self) -> dict[str, Any]:
        return {"kind": self.kind, "buckets": [bucket._body() for bucket in self.buckets]}


@dataclasses.dataclass(frozen=True)
class SnapshotOffset(Offset):
    """A position in the initial copy (see :mod:`~flowwarden.spark.source.snapshot`).

    ``token``: the position the changes follow from; ``namespaces``: the collections copied, in
    order; ``at``: the index of the one being copied; ``end_id``: its bound, and ``last_id``: the
    last ``_id`` read from it, both as canonical Extended JSON ``{"v": <_id>}`` (MinKey: none);
    ``copied``: documents read so far; ``done``: the copy is over and the changes follow.
    """

    kind: ClassVar[str] = "snapshot"
    token: str
    namespaces: tuple[str, ...]
    at: int
    end_id: str
    last_id: str
    copied: int
    done: bool = False

    def __post_init__(self) -> None:
        _check_token(self.token)
        if not isinstance(self.namespaces, tuple) or not all(
            isinstance(name, str) and "." in name for name in self.namespaces
        ):
            raise ValueError(f"namespaces are 'database.collection' names, not {self.namespaces!r}")
        if not 0 <= self.at <= len(self.namespaces):
            raise ValueError(f"at {self.at} is not an index of the {len(self.namespaces)} namespaces")
        if self.copied < 0:
            raise ValueError(f"copied {self.copied} is negative")
        load_id(self.end_id)
        load_id(self.last_id)

    def _body(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "token": self.token,
            "namespaces": list(self.namespaces),
            "at": self.at,
            "end_id": self.end_id,
            "last_id": self.last_id,
            "copied": self.copied,
            "done": self.done,
        }


@dataclasses.dataclass(frozen=True)
class RequestedOffset(Offset):
    """After the event (or the stream position) ``token``, while an incremental snapshot copies
    (see :mod:`~flowwarden.spark.source.requested`).

    ``request``: the request's id; ``filter``: its find filter as canonical Extended JSON
    (``""``: none); ``namespaces``, ``at``, ``end_id``, ``copied`` as in :class:`SnapshotOffset`,
    with ``last_id`` the last ``_id`` of the chunk the micro-batch ending here handed over;
    ``low`` and ``high``: that chunk's watermarks. The micro-batch holds the events after its
    start up to ``token``, then the chunk's rows whose document had no event between ``low``
    and ``high`` among them.
    """

    kind: ClassVar[str] = "requested"
    token: str
    request: str
    filter: str
    namespaces: tuple[str, ...]
    at: int
    end_id: str
    last_id: str
    copied: int
    low: Timestamp
    high: Timestamp

    def __post_init__(self) -> None:
        _check_token(self.token)
        if not isinstance(self.request, str) or not _HEX.fullmatch(self.request):
            raise ValueError(f"a request id is hex, not {self.request!r}")
        if not isinstance(self.namespaces, tuple) or not self.namespaces or not all(
            isinstance(name, str) and "." in name for name in self.namespaces
        ):
            raise ValueError(f"namespaces are 'database.collection' names, not {self.namespaces!r}")
        if not 0 <= self.at < len(self.namespaces):
            raise ValueError(f"at {self.at} is not an index of the {len(self.namespaces)} namespaces")
        if self.copied < 0:
            raise ValueError(f"copied {self.copied} is negative")
        if not isinstance(self.low, Timestamp) or not isinstance(self.high, Timestamp):
            raise ValueError("the watermarks are bson Timestamps")
        load_id(self.end_id)
        load_id(self.last_id)
        if self.filter:
            load_filter(self.filter)

    def _body(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "token": self.token,
            "request": self.request,
            "filter": self.filter,
            "namespaces": list(self.namespaces),
            "at": self.at,
            "end_id": self.end_id,
            "last_id": self.last_id,
            "copied": self.copied,
            "low": _time_body(self.low),
            "high": _time_body(self.high),
        }


StreamOffset = BucketOffset | SnapshotOffset | RequestedOffset
"""The offsets of one change stream (a source that is not partitioned, or one bucket)."""


def dump_id(value: Any) -> str:
    """An ``_id`` as a snapshot offset keeps it."""
    # Wrapped: a bare null would read back as "no value"; any value, null included, may be an _id.
    return json_util.dumps({"v": value}, json_options=_ID_JSON)


def load_id(text: str) -> Any:
    """An ``_id`` a snapshot offset keeps (see :func:`dump_id`)."""
    try:
        document = json_util.loads(text, json_options=_ID_JSON)
    except Exception as error:  # json_util fails with many types (InvalidId, decimal errors...)
        raise ValueError(f"{text!r} is not an _id as Extended JSON: {error}") from None
    if not isinstance(document, Mapping) or set(document) != {"v"}:
        raise ValueError(f"{text!r} is not an _id as Extended JSON {{'v': <_id>}}")
    return document["v"]


def dump_filter(query: Mapping[str, Any] | None) -> str:
    """A find filter as a requested offset keeps it (``""``: none)."""
    return "" if not query else json_util.dumps(dict(query), json_options=_ID_JSON)


def load_filter(text: str) -> dict[str, Any]:
    """A find filter a requested offset keeps (see :func:`dump_filter`)."""
    if not text:
        return {}
    try:
        document = json_util.loads(text, json_options=_ID_JSON)
    except Exception as error:  # json_util fails with many types
        raise ValueError(f"{text[:80]!r} is not a filter as Extended JSON: {error}") from None
    if not isinstance(document, Mapping):
        raise ValueError(f"{text[:80]!r} is not a filter (a JSON object)")
    return dict(document)


def resume_token(offset: StreamOffset) -> dict[str, str] | None:
    """The resume token a change stream read from ``offset`` starts after: None for a time (the
    stream starts at it); for an offset of the initial snapshot, the position its changes
    follow from."""
    if isinstance(offset, TimeOffset):
        return None
    return {"_data": offset.token}


def bucket_offset(offset: Offset) -> BucketOffset:
    """``offset`` as a hash bucket's offset, which is neither partitioned nor of a snapshot."""
    if not isinstance(offset, _BUCKET_KINDS):
        raise ValueError(f"a hash bucket's offset is a token, time, read_from or skipped one, not {offset!r}")
    return offset


# ----------------------------------------------------------------------------------------------
# Reading


def parse_offset(value: str | bytes | Mapping[str, Any], *, stream: str | None = None) -> Offset:
    """The offset in ``value`` (its JSON, or the dict Spark hands the reader).

    Raises :class:`~flowwarden.errors.UnreadableOffsetError` naming what is wrong and what to do
    for anything but an offset of :data:`FORMAT_VERSION`.
    ``stream`` names the source's namespace in the message.
    """
    try:
        return _parse(value)
    except _Unreadable as problem:
        raise UnreadableOffsetError(
            _message(value, problem, stream), stream=stream, offset=value, version=problem.version
        ) from None


def _message(value: Any, problem: _Unreadable, stream: str | None) -> str:
    import importlib.metadata

    try:  # the installed release (the package root is not imported from here: no import cycle)
        __version__ = importlib.metadata.version("flowwarden")
    except importlib.metadata.PackageNotFoundError:
        __version__ = "(not installed)"

    try:  # as the offsets log holds it
        shown = value if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        shown = repr(value)
    if len(shown) > 300:
        shown = shown[:300] + "..."
    owner = f"{OWNER} {stream}" if stream else OWNER
    return (
        f"{owner}: the query's checkpointLocation (its offsets log, <checkpointLocation>/offsets) holds "
        f"an offset flowwarden {__version__} cannot read: {problem.reason}; the offset: {shown}. "
        "Start the query with a new checkpointLocation (it then begins at its start_position), or run "
        "it with the flowwarden version that wrote this checkpointLocation."
    )


def _parse(value: str | bytes | Mapping[str, Any]) -> Offset:
    document: Any = value
    if isinstance(value, (str, bytes)):
        try:
            document = json.loads(value)
        except ValueError as error:
            raise _Unreadable(f"it is not JSON ({error})", version=None) from None
    if not isinstance(document, Mapping):
        raise _Unreadable("it is not a JSON object", version=None)
    if "v" not in document:
        raise _Unreadable(
            f"it has no format version, and this release reads version {FORMAT_VERSION}", version=None
        )
    version = document["v"]
    if type(version) is not int or version != FORMAT_VERSION:
        raise _Unreadable(
            f"its format version is {version!r}, and this release reads version {FORMAT_VERSION}",
            version=version,
        )
    return _read({key: item for key, item in document.items() if key != "v"}, nested=False)


class _Fields:
    """The fields of one offset's JSON object, each read as the type it must have."""

    def __init__(self, body: Mapping[str, Any], kind: str, names: tuple[str, ...]) -> None:
        missing = [name for name in names if name not in body]
        if missing:
            raise _Unreadable(f"the field(s) {', '.join(map(repr, missing))} of a {kind} offset are missing")
        unknown = sorted(str(name) for name in body if name not in names and name != "kind")
        if unknown:
            raise _Unreadable(f"a {kind} offset has no field(s) {', '.join(map(repr, unknown))}")
        self.body = body
        self.kind = kind

    def _wrong(self, name: str, expected: str) -> _Unreadable:
        value = self.body[name]
        return _Unreadable(f"the field {name!r} of a {self.kind} offset is {value!r}, not {expected}")

    def integer(self, name: str) -> int:
        value = self.body[name]
        if type(value) is not int:
            raise self._wrong(name, "an integer")
        return value

    def text(self, name: str) -> str:
        value = self.body[name]
        if not isinstance(value, str):
            raise self._wrong(name, "a string")
        return value

    def flag(self, name: str) -> bool:
        value = self.body[name]
        if not isinstance(value, bool):
            raise self._wrong(name, "true or false")
        return value

    def items(self, name: str) -> list[Any]:
        value = self.body[name]
        if not isinstance(value, list):
            raise self._wrong(name, "a list")
        return value

    def time(self, name: str) -> Timestamp:
        value = self.body[name]
        if (
            not isinstance(value, Mapping)
            or set(value) != {"t", "i"}
            or not all(type(value[part]) is int and 0 <= value[part] < 2**32 for part in ("t", "i"))
        ):
            raise self._wrong(name, 'a cluster time {"t": <seconds>, "i": <increment>}')
        return Timestamp(value["t"], value["i"])


def _token(fields: _Fields) -> TokenOffset:
    return TokenOffset(fields.text("token"))


def _time(fields: _Fields) -> TimeOffset:
    return TimeOffset(fields.time("at"))


def _read_from(fields: _Fields) -> ReadFromOffset:
    return ReadFromOffset(fields.text("token"), fields.time("read_from"))


def _skipped(fields: _Fields) -> SkippedOffset:
    return SkippedOffset(fields.text("token"))


def _partitions(fields: _Fields) -> PartitionedOffset:
    buckets = []
    for item in fields.items("buckets"):
        if not isinstance(item, Mapping):
            raise _Unreadable(f"a bucket of a partitions offset is {item!r}, not an offset")
        buckets.append(bucket_offset(_read(item, nested=True)))
    return PartitionedOffset(tuple(buckets))


def _snapshot(fields: _Fields) -> SnapshotOffset:
    namespaces = fields.items("namespaces")
    if not all(isinstance(name, str) for name in namespaces):
        raise fields._wrong("namespaces", "a list of names")
    return SnapshotOffset(
        token=fields.text("token"),
        namespaces=tuple(namespaces),
        at=fields.integer("at"),
        end_id=fields.text("end_id"),
        last_id=fields.text("last_id"),
        copied=fields.integer("copied"),
        done=fields.flag("done"),
    )


def _requested(fields: _Fields) -> RequestedOffset:
    namespaces = fields.items("namespaces")
    if not all(isinstance(name, str) for name in namespaces):
        raise fields._wrong("namespaces", "a list of names")
    return RequestedOffset(
        token=fields.text("token"),
        request=fields.text("request"),
        filter=fields.text("filter"),
        namespaces=tuple(namespaces),
        at=fields.integer("at"),
        end_id=fields.text("end_id"),
        last_id=fields.text("last_id"),
        copied=fields.integer("copied"),
        low=fields.time("low"),
        high=fields.time("high"),
    )


_KINDS: dict[str, tuple[tuple[str, ...], Callable[[_Fields], Offset]]] = {
    TokenOffset.kind: (("token",), _token),
    TimeOffset.kind: (("at",), _time),
    ReadFromOffset.kind: (("token", "read_from"), _read_from),
    SkippedOffset.kind: (("token",), _skipped),
    PartitionedOffset.kind: (("buckets",), _partitions),
    SnapshotOffset.kind: (("token", "namespaces", "at", "end_id", "last_id", "copied", "done"), _snapshot),
    RequestedOffset.kind: (
        ("token", "request", "filter", "namespaces", "at", "end_id", "last_id", "copied", "low", "high"),
        _requested,
    ),
}


def _read(body: Mapping[str, Any], *, nested: bool) -> Offset:
    """The offset of kind ``body["kind"]`` (a bucket's, when ``nested``: no partitions in it)."""
    kind = body.get("kind")
    kinds = [name for name in _KINDS if not (nested and name in ("partitions", "snapshot", "requested"))]
    if not isinstance(kind, str) or kind not in kinds:
        where = "a bucket's offset" if nested else "an offset"
        raise _Unreadable(f"{where} of kind {kind!r} is not known (known: {', '.join(kinds)})")
    names, build = _KINDS[kind]
    fields = _Fields(body, kind, names)
    try:
        return build(fields)
    except ValueError as error:
        raise _Unreadable(f"a {kind} offset with {error}") from None


