"""The checkpoint value and its ``_fw_checkpoints`` document form.

A :class:`Checkpoint` is an immutable snapshot of one stream's position. It holds two resume
tokens: ``last_processed_token`` (the ``_id`` of the newest event whose handling completed with no
gap before it) and ``last_seen_token`` (a post-batch token observed while nothing was in flight,
or the position a stream opened at). Both are positions AFTER work that is done, so resuming from
the newer of the two never skips an event. A third token, ``batch_end_token``, is not a position:
it records where the batch handed to a batch handler ends, so that the same batch is formed again
after a crash. This module only converts values; it never talks to a store.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bson import MinKey, Timestamp

from flowwarden.errors import InvalidTokenError, UnreadableCheckpointError
from flowwarden.events import (
    ResumeToken,
    check_resume_token,
    newer_token,
    timestamp_datetime,
    token_data,
    token_datetime,
)

# Field names of the _fw_checkpoints document. The first six are shared with FlowWarden for Java,
# so either implementation can read the other's checkpoints.
F_ID = "_id"
F_INSTANCE = "instanceId"
F_SEEN_TOKEN = "lastSeenToken"
F_SEEN_AT = "lastSeenTimestamp"
F_PROCESSED_TOKEN = "lastProcessedToken"
F_PROCESSED_AT = "lastProcessedTimestamp"
F_INSTANCE_TOKEN = "instanceToken"
F_EVENTS = "eventsProcessed"
F_EPOCH = "epoch"
F_UPDATED_AT = "updatedAt"
F_METADATA = "metadata"
F_BATCH_END = "batchEndToken"
F_SNAPSHOT = "snapshot"
F_INCREMENTAL = "incrementalSnapshot"

DEFAULT_COLLECTION = "_fw_checkpoints"


class SaveResult(enum.Enum):
    """What a checkpoint write did."""

    STORED = "stored"
    """The position moved forward and was written."""

    IGNORED = "ignored"
    """The stored position is the same or newer: nothing was written."""


def utc_now() -> datetime:
    """Now, as an aware UTC datetime truncated to milliseconds (BSON datetime precision).

    Truncating here keeps a checkpoint equal to itself after a round trip through any store.
    """
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def copy_token(token: ResumeToken | None) -> dict[str, Any] | None:
    """A plain-dict copy of a resume token, checked to carry a string ``_data``.

    The token is kept exactly as the server sent it (the server parses it back on resume); only
    comparisons normalise ``_data`` with :func:`flowwarden.events.token_data`.
    """
    if token is None:
        return None
    token_data(token)
    return dict(token)


def token_time(token: ResumeToken | None) -> datetime | None:
    """The UTC datetime stored next to a token: its cluster time, None when it has none."""
    try:
        return token_datetime(token)
    except InvalidTokenError:
        # A token whose _data does not start with a cluster time (not one the server made) still
        # orders by _data; it just has no timestamp to show.
        return None


@dataclass(frozen=True, kw_only=True)
class SnapshotProgress:
    """How far the initial snapshot of a stream's existing documents has come.

    ``token`` is the stream position taken before the copy began: the change stream opens right
    after it once the copy is done, so nothing written after it is missed. The copy goes through
    ``namespaces`` in order, each in ``_id`` order, in chunks:

    - ``end_id`` is the bound of ``namespace``: its highest ``_id`` (under the copy filter) read
      when its copy began, after ``token`` was taken. The copy reads no ``_id`` past it, so it
      ends however fast documents are inserted; those inserted later arrive as changes.
      :class:`~bson.MinKey`: the namespace had nothing to copy.
    - ``last_id`` is the last ``_id`` of the last chunk whose handling finished (MinKey: none
      of ``namespace`` yet, since any value, null included, may be an ``_id``).
    - ``chunk`` counts the chunks planned so far; ``chunk_end`` is the last ``_id`` of chunk
      number ``chunk`` while it is planned and not finished (MinKey: none is). A chunk is planned
      (stored) before its rows are handed over, so a restart hands over the same ``_id`` range
      ``(last_id, chunk_end]`` under the same number again.

    ``copied`` counts the documents handled so far. Within one snapshot (one ``token``) progress
    never goes back: :attr:`order` only grows.
    """

    token: ResumeToken
    namespaces: tuple[str, ...]
    namespace: str
    end_id: Any = field(default_factory=MinKey)
    last_id: Any = field(default_factory=MinKey)
    chunk: int = 0
    chunk_end: Any = field(default_factory=MinKey)
    copied: int = 0
    total: int | None = None
    """An estimate of the documents to copy, taken when the copy began (for progress only)."""
    done: bool = False
    started_at: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "token", copy_token(self.token))
        object.__setattr__(self, "namespaces", tuple(self.namespaces))

    @property
    def pending(self) -> bool:
        """Whether chunk number :attr:`chunk` is planned and its handling not finished."""
        return not isinstance(self.chunk_end, MinKey)

    @property
    def order(self) -> int:
        """Orders the saves of one snapshot: each chunk is planned, then finished; done is last."""
        return self.chunk * 2 + (0 if self.pending else 1) + 2 * int(self.done)

    def to_document(self) -> dict[str, Any]:
        document = {
            "token": copy_token(self.token),
            "namespaces": list(self.namespaces),
            "namespace": self.namespace,
            "endId": self.end_id,
            "lastId": self.last_id,
            "chunk": self.chunk,
            "copied": self.copied,
            "total": self.total,
            "done": self.done,
            "order": self.order,
            "startedAt": self.started_at,
        }
        if self.pending:
            document["chunkEnd"] = self.chunk_end
        return document

    @classmethod
    def from_document(cls, document: Any) -> SnapshotProgress:
        if not isinstance(document, Mapping):
            raise ValueError(f"{F_SNAPSHOT} must be a document, got {type(document).__name__}")
        namespaces = document.get("namespaces")
        if not isinstance(namespaces, (list, tuple)) or not all(isinstance(n, str) for n in namespaces):
            raise ValueError(f"{F_SNAPSHOT}.namespaces must be a list of namespace names")
        namespace = document.get("namespace")
        if not isinstance(namespace, str):
            raise ValueError(f"{F_SNAPSHOT}.namespace must be a namespace name, got {namespace!r}")
        done = document.get("done", False)
        if not isinstance(done, bool):
            raise ValueError(f"{F_SNAPSHOT}.done must be true or false, got {done!r}")
        total = document.get("total")
        token = _read_token(document.get("token"), f"{F_SNAPSHOT}.token")
        if token is None:
            raise ValueError(f"{F_SNAPSHOT}.token is missing")
        return cls(
            token=token,
            namespaces=tuple(namespaces),
            namespace=namespace,
            end_id=document.get("endId", MinKey()),
            last_id=document.get("lastId", MinKey()),
            chunk=_read_int(document.get("chunk"), f"{F_SNAPSHOT}.chunk"),
            chunk_end=document.get("chunkEnd", MinKey()),
            copied=_read_int(document.get("copied"), f"{F_SNAPSHOT}.copied"),
            total=None if total is None else _read_int(total, f"{F_SNAPSHOT}.total"),
            done=done,
            started_at=_read_time(document.get("startedAt"), f"{F_SNAPSHOT}.startedAt"),
        )


class IncrementalState(str, enum.Enum):
    """Where an incremental snapshot is."""

    RUNNING = "running"
    """Copying: chunks are read and handed over between the stream's changes."""
    DONE = "done"
    """Every chunk was handed over."""
    CANCELLED = "cancelled"
    """Stopped before the end: its request was cancelled, or no longer exists."""


@dataclass(frozen=True, kw_only=True)
class IncrementalProgress:
    """How far an incremental snapshot (a copy requested while the stream runs) has come.

    ``request`` is the id of its request in ``_fw_signals``. The copy goes through
    ``namespaces`` in order, each in ``_id`` order, in chunks, as the initial snapshot does
    (:class:`SnapshotProgress`): ``end_id`` is the bound of ``namespace`` read when its copy
    began (MinKey: nothing to copy), ``last_id`` the last ``_id`` of the last finished chunk
    (MinKey: none yet), ``chunk`` counts the chunks planned, and ``chunk_end`` is the last
    ``_id`` of chunk number ``chunk`` while it is planned and not finished (MinKey: none is). A
    planned chunk is read again as the same ``_id`` range ``(last_id, chunk_end]`` after a
    restart.

    ``copied`` counts the rows handed over by finished chunks; ``dropped`` the rows left out
    because their document changed between the chunk's watermarks (its change was delivered
    instead). Within one request progress never goes back: :attr:`order` only grows.
    """

    request: str
    namespaces: tuple[str, ...]
    namespace: str
    end_id: Any = field(default_factory=MinKey)
    last_id: Any = field(default_factory=MinKey)
    chunk: int = 0
    chunk_end: Any = field(default_factory=MinKey)
    copied: int = 0
    dropped: int = 0
    total: int | None = None
    """An estimate of the documents to copy, taken when the copy began (for progress only)."""
    state: IncrementalState = IncrementalState.RUNNING
    started_at: datetime | None = None
    ended_at: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", tuple(self.namespaces))
        object.__setattr__(self, "state", IncrementalState(self.state))

    @property
    def pending(self) -> bool:
        """Whether chunk number :attr:`chunk` is planned and its handling not finished."""
        return not isinstance(self.chunk_end, MinKey)

    @property
    def running(self) -> bool:
        return self.state is IncrementalState.RUNNING

    @property
    def order(self) -> int:
        """Orders the saves of one request: each chunk is planned, then finished; the end
        (done or cancelled) is last."""
        return self.chunk * 2 + (0 if self.pending else 1) + (0 if self.running else 2)

    def to_document(self) -> dict[str, Any]:
        document = {
            "request": self.request,
            "namespaces": list(self.namespaces),
            "namespace": self.namespace,
            "endId": self.end_id,
            "lastId": self.last_id,
            "chunk": self.chunk,
            "copied": self.copied,
            "dropped": self.dropped,
            "total": self.total,
            "state": self.state.value,
            "order": self.order,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
        }
        if self.pending:
            document["chunkEnd"] = self.chunk_end
        return document

    @classmethod
    def from_document(cls, document: Any) -> IncrementalProgress:
        name = F_INCREMENTAL
        if not isinstance(document, Mapping):
            raise ValueError(f"{name} must be a document, got {type(document).__name__}")
        request = document.get("request")
        if not isinstance(request, str) or not request:
            raise ValueError(f"{name}.request must be the id of a request, got {request!r}")
        namespaces = document.get("namespaces")
        if not isinstance(namespaces, (list, tuple)) or not all(isinstance(n, str) for n in namespaces):
            raise ValueError(f"{name}.namespaces must be a list of namespace names")
        namespace = document.get("namespace")
        if not isinstance(namespace, str):
            raise ValueError(f"{name}.namespace must be a namespace name, got {namespace!r}")
        state = document.get("state")
        if state not in {member.value for member in IncrementalState}:
            allowed = ", ".join(member.value for member in IncrementalState)
            raise ValueError(f"{name}.state must be one of {allowed}, got {state!r}")
        total = document.get("total")
        return cls(
            request=request,
            namespaces=tuple(namespaces),
            namespace=namespace,
            end_id=document.get("endId", MinKey()),
            last_id=document.get("lastId", MinKey()),
            chunk=_read_int(document.get("chunk"), f"{name}.chunk"),
            chunk_end=document.get("chunkEnd", MinKey()),
            copied=_read_int(document.get("copied"), f"{name}.copied"),
            dropped=_read_int(document.get("dropped"), f"{name}.dropped"),
            total=None if total is None else _read_int(total, f"{name}.total"),
            state=IncrementalState(state),
            started_at=_read_time(document.get("startedAt"), f"{name}.startedAt"),
            ended_at=_read_time(document.get("endedAt"), f"{name}.endedAt"),
        )


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """One stream's stored position, built with keywords; every field but ``stream_id`` defaults.

    ``last_processed_token`` is the position AFTER the last handled event: resuming after it
    delivers the next event, never that one again. ``last_seen_token`` is a post-batch token taken
    while nothing was in flight; it lets idle and heavily filtered streams resume near the oplog's
    end. ``last_processed_at`` / ``last_seen_at`` default to the UTC time of the token's cluster
    time. Tokens and metadata are copied on construction, so a checkpoint never shares mutable
    state with its caller.
    """

    stream_id: str
    instance_id: str | None = None
    instance_token: str | None = None
    """The connector that wrote the processed position (``Connector.instance_token``): two
    processes given the same ``instance_id`` still write different tokens."""
    last_processed_token: ResumeToken | None = None
    last_processed_at: datetime | None = None
    last_seen_token: ResumeToken | None = None
    last_seen_at: datetime | None = None
    events_processed: int = 0
    epoch: int = 0
    updated_at: datetime | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    batch_end_token: ResumeToken | None = None
    """The token of the last event of the newest batch handed to an ``@on_batch`` or
    ``@on_dataframe`` method, written before the method runs. The batch starts right after the
    processed position stored with it; after a crash the runtime forms the same batch again, so
    ``ctx.batch_id`` names the same events. Not a resume position: ignored once the resume
    position reaches it."""
    snapshot: SnapshotProgress | None = None
    """The initial snapshot's progress, for streams with ``snapshot`` other than NEVER; None when
    none was ever started (or the position was rewound since)."""
    incremental_snapshot: IncrementalProgress | None = None
    """The progress of the newest incremental snapshot (``flowwarden snapshot request``); None
    when none was ever requested. Not tied to a position: a rewind keeps it."""

    def __post_init__(self) -> None:
        if not isinstance(self.stream_id, str) or not self.stream_id:
            raise ValueError(f"Checkpoint.stream_id must be a non-empty string, got {self.stream_id!r}")
        processed = copy_token(self.last_processed_token)
        seen = copy_token(self.last_seen_token)
        # Frozen dataclass: the normalised copies are installed the one way frozen allows.
        object.__setattr__(self, "last_processed_token", processed)
        object.__setattr__(self, "last_seen_token", seen)
        object.__setattr__(self, "batch_end_token", copy_token(self.batch_end_token))
        if self.last_processed_at is None:
            object.__setattr__(self, "last_processed_at", token_time(processed))
        if self.last_seen_at is None:
            object.__setattr__(self, "last_seen_at", token_time(seen))
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def resume_token(self) -> dict[str, Any] | None:
        """The token to resume after: the newer of the processed and the seen token."""
        token = newer_token(self.last_processed_token, self.last_seen_token)
        return None if token is None else dict(token)

    @property
    def pending_batch_end(self) -> dict[str, Any] | None:
        """:attr:`batch_end_token` while it is past the resume position (the batch it ends may
        not have finished); None once the resume position reached it."""
        end = self.batch_end_token
        if end is None:
            return None
        resume = self.resume_token
        if resume is not None and token_data(resume) >= token_data(end):
            return None
        return dict(end)

    def to_document(self) -> dict[str, Any]:
        """The ``_fw_checkpoints`` document for this checkpoint (``batchEndToken`` only when set)."""
        document = {
            F_ID: self.stream_id,
            F_INSTANCE: self.instance_id,
            F_INSTANCE_TOKEN: self.instance_token,
            F_SEEN_TOKEN: copy_token(self.last_seen_token),
            F_SEEN_AT: self.last_seen_at,
            F_PROCESSED_TOKEN: copy_token(self.last_processed_token),
            F_PROCESSED_AT: self.last_processed_at,
            F_EVENTS: self.events_processed,
            F_EPOCH: self.epoch,
            F_UPDATED_AT: self.updated_at,
            F_METADATA: dict(self.metadata),
        }
        if self.batch_end_token is not None:
            document[F_BATCH_END] = copy_token(self.batch_end_token)
        if self.snapshot is not None:
            document[F_SNAPSHOT] = self.snapshot.to_document()
        if self.incremental_snapshot is not None:
            document[F_INCREMENTAL] = self.incremental_snapshot.to_document()
        return document

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Checkpoint:
        """Read a ``_fw_checkpoints`` document; FlowWarden-for-Java documents load too.

        Missing fields take their defaults (a Java document has no epoch, count or metadata).
        A document that cannot be a checkpoint (a field of the wrong type, a token the server could
        not resume from) raises :class:`UnreadableCheckpointError` rather than yielding a made-up
        position.
        """
        if not isinstance(document, Mapping):
            raise UnreadableCheckpointError(
                f"a checkpoint record is not a document but {type(document).__name__}: {document!r:.80}. "
                "Fix or delete it (`flowwarden checkpoints delete`); flowwarden will not guess a position."
            )
        stream_id = document.get(F_ID)
        try:
            if not isinstance(stream_id, str):
                raise ValueError(f"_id must be the stream name (a string), got {stream_id!r}")
            metadata = document.get(F_METADATA) or {}
            if not isinstance(metadata, Mapping):
                raise ValueError(f"metadata must be a document, got {type(metadata).__name__}")
            instance = document.get(F_INSTANCE)
            instance_token = document.get(F_INSTANCE_TOKEN)
            return cls(
                stream_id=stream_id,
                instance_id=None if instance is None else str(instance),
                instance_token=None if instance_token is None else str(instance_token),
                last_processed_token=_read_token(document.get(F_PROCESSED_TOKEN), F_PROCESSED_TOKEN),
                last_processed_at=_read_time(document.get(F_PROCESSED_AT), F_PROCESSED_AT),
                last_seen_token=_read_token(document.get(F_SEEN_TOKEN), F_SEEN_TOKEN),
                last_seen_at=_read_time(document.get(F_SEEN_AT), F_SEEN_AT),
                events_processed=_read_int(document.get(F_EVENTS), F_EVENTS),
                epoch=_read_int(document.get(F_EPOCH), F_EPOCH),
                updated_at=_read_time(document.get(F_UPDATED_AT), F_UPDATED_AT),
                metadata=dict(metadata),
                batch_end_token=_read_token(document.get(F_BATCH_END), F_BATCH_END),
                snapshot=_read_snapshot(document.get(F_SNAPSHOT)),
                incremental_snapshot=_read_incremental(document.get(F_INCREMENTAL)),
            )
        except (ValueError, TypeError, OverflowError) as exc:
            sid = stream_id if isinstance(stream_id, str) else None
            raise UnreadableCheckpointError(
                f"checkpoint document {stream_id!r} is not readable: {exc}. Fix or delete it "
                "(`flowwarden checkpoints delete`); flowwarden will not guess a position.",
                stream=sid,
            ) from exc


def _read_snapshot(value: Any) -> SnapshotProgress | None:
    return None if value is None else SnapshotProgress.from_document(value)


def _read_incremental(value: Any) -> IncrementalProgress | None:
    return None if value is None else IncrementalProgress.from_document(value)


def _read_token(value: Any, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a resume token document, got {type(value).__name__}")
    try:
        check_resume_token(value)
    except InvalidTokenError as exc:
        raise ValueError(f"{name} is not a resume token the server could resume from: {exc}") from None
    return copy_token(value)


def _read_int(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        # Int64 subclasses int; a float or string here means someone else wrote the field.
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _read_time(value: Any, name: str) -> datetime | None:
    """A stored timestamp as an aware UTC datetime.

    BSON dates come back naive unless the client was built with ``tz_aware=True``; they are UTC
    either way. Java documents may hold a BSON Timestamp or epoch milliseconds.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)
    if isinstance(value, Timestamp):
        return timestamp_datetime(value)
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            return datetime.fromtimestamp(value / 1000, tz=timezone.utc)
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return _read_time(parsed, name)
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"{name} is not a date: {value!r:.40} ({exc})") from None
    raise ValueError(f"{name} must be a date, got {type(value).__name__}")


__all__ = [
    "DEFAULT_COLLECTION",
    "F_BATCH_END",
    "F_INCREMENTAL",
    "F_SNAPSHOT",
    "Checkpoint",
    "IncrementalProgress",
    "IncrementalState",
    "SaveResult",
    "SnapshotProgress",
    "copy_token",
    "token_time",
    "utc_now",
]
