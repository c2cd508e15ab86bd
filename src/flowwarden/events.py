"""Change events and resume tokens.

A :class:`ChangeEvent` is a thin view over the raw change document the server sent: nothing is
copied or validated until a property is read, so building one costs a single object allocation on
the hot path.

Resume tokens are ``{"_data": "<hex>"}`` documents whose bytes are MongoDB KeyString encodings.
Their byte order is the order of positions in the oplog, so comparing the hex strings compares
positions. The first value encoded is the cluster time: type byte ``0x82`` (timestamp), then the
4-byte big-endian seconds, then the 4-byte big-endian increment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

from bson import Timestamp

from flowwarden.errors import InvalidTokenError

ResumeToken = Mapping[str, Any]
"""A resume token as the server sends it: ``{"_data": "<hex>"}``."""

_KEYSTRING_TIMESTAMP = 0x82
_HEX = re.compile(r"[0-9A-F]*")

M = TypeVar("M")


def token_data(token: ResumeToken) -> str:
    """Return the ``_data`` hex string of a resume token, upper-cased for byte-wise comparison."""
    try:
        data = token["_data"]
    except (KeyError, TypeError):
        raise InvalidTokenError(
            f"not a resume token: {token!r}; expected a document like {{'_data': '8263...'}} "
            "(the _id of a change event or a postBatchResumeToken)"
        ) from None
    if not isinstance(data, str):
        raise InvalidTokenError(
            f"resume token _data must be a hex string, got {type(data).__name__}: {data!r}"
        )
    return data.upper()


def token_cluster_time(token: ResumeToken) -> Timestamp:
    """Decode the cluster time at the start of a resume token's ``_data``.

    Works for tokens from MongoDB 4.2+ (KeyString v1 tokens, hex ``_data``) and for the tokens of
    :class:`flowwarden.testing.EmbeddedReplicaSet`.
    """
    data = token_data(token)
    try:
        raw = bytes.fromhex(data[:18])
    except ValueError:
        raise InvalidTokenError(f"resume token _data is not hex: {data[:40]!r}") from None
    if len(raw) < 9 or raw[0] != _KEYSTRING_TIMESTAMP:
        raise InvalidTokenError(
            f"resume token _data does not start with a KeyString timestamp (0x82): {data[:40]!r}"
        )
    seconds = int.from_bytes(raw[1:5], "big")
    increment = int.from_bytes(raw[5:9], "big")
    return Timestamp(seconds, increment)


def check_resume_token(token: Any) -> Timestamp:
    """Check that ``token`` can be a resume token a server made, and return its cluster time.

    Stricter than :func:`token_data`: ``_data`` must be a whole number of hex bytes and start
    with a KeyString cluster time, which is what the server parses back on resume. A value that
    fails here would be refused by the server (codes 9 and 40649) or resume somewhere no one
    meant; raises :class:`InvalidTokenError` saying which part is wrong.
    """
    if not isinstance(token, Mapping):
        raise InvalidTokenError(
            f"not a resume token: {token!r}; expected a document like {{'_data': '8263...'}}"
        )
    data = token_data(token)
    if len(data) % 2 or not _HEX.fullmatch(data):
        raise InvalidTokenError(
            f"resume token _data must be hex digits, two per byte; got {data[:40]!r}"
            + ("..." if len(data) > 40 else "")
        )
    return token_cluster_time(token)


def timestamp_datetime(ts: Timestamp) -> datetime:
    """The UTC wall-clock second of a cluster time (its increment orders events within it)."""
    return datetime.fromtimestamp(ts.time, tz=timezone.utc)


def token_datetime(token: ResumeToken | None) -> datetime | None:
    """UTC datetime of a token's cluster time, or None for no token."""
    if token is None:
        return None
    return timestamp_datetime(token_cluster_time(token))


def compare_tokens(a: ResumeToken, b: ResumeToken) -> int:
    """-1, 0 or 1 as token ``a`` is before, at or after token ``b`` in the oplog."""
    da, db = token_data(a), token_data(b)
    return (da > db) - (da < db)


def newer_token(a: ResumeToken | None, b: ResumeToken | None) -> ResumeToken | None:
    """The later of two optional tokens (None when both are None)."""
    if a is None:
        return b
    if b is None:
        return a
    return a if compare_tokens(a, b) >= 0 else b


class ChangeEvent:
    """A change event, read lazily from the raw document the server sent.

    The stored checkpoint position for an event is its :attr:`token`: resuming after it delivers
    the next event, never this one again.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw
        """The change document as the server sent it (every field, read as it is)."""

    @property
    def token(self) -> dict[str, Any]:
        """The event's resume token (its ``_id``)."""
        token = self.raw.get("_id")
        if not isinstance(token, Mapping):
            if self.raw.get("operationType") == "snapshot":
                raise InvalidTokenError("an initial-snapshot row has no resume token: it is not a position")
            raise InvalidTokenError(
                "change event has no _id resume token; a pipeline stage must not remove or rewrite _id"
            )
        return dict(token)

    @property
    def operation_type(self) -> str:
        """``insert``, ``update``, ``replace``, ``delete``, ``drop``, ``rename``, ``dropDatabase``,
        ``invalidate``, the DDL types with ``show_expanded_events``, or ``snapshot`` for a row of
        the initial snapshot."""
        return str(self.raw.get("operationType", ""))

    @property
    def cluster_time(self) -> Timestamp | None:
        """The oplog time of the change (``clusterTime``); None when the server sent none."""
        value = self.raw.get("clusterTime")
        return value if isinstance(value, Timestamp) else None

    @property
    def wall_time(self) -> datetime | None:
        """The server's wall-clock time of the change (``wallTime``, MongoDB 6.0+); None when
        the server sent none."""
        value = self.raw.get("wallTime")
        return value if isinstance(value, datetime) else None

    @property
    def namespace(self) -> tuple[str | None, str | None]:
        """``(database, collection)``; collection is None for database-level events."""
        ns = self.raw.get("ns") or {}
        return ns.get("db"), ns.get("coll")

    @property
    def database(self) -> str | None:
        """The database of the change (``ns.db``)."""
        return self.namespace[0]

    @property
    def collection(self) -> str | None:
        """The collection of the change (``ns.coll``); None for database-level events."""
        return self.namespace[1]

    @property
    def document_key(self) -> Mapping[str, Any] | None:
        """The changed document's ``_id`` (and shard key fields): ``documentKey``; None for
        events not about one document (drop, rename, invalidate)."""
        return self.raw.get("documentKey")

    @property
    def full_document(self) -> Mapping[str, Any] | None:
        """The document after the change (``fullDocument``): on inserts, replaces and snapshot
        rows; on updates only with ``@change_stream(full_document="updateLookup")`` (or
        ``whenAvailable``/``required``); None otherwise."""
        return self.raw.get("fullDocument")

    @property
    def full_document_before_change(self) -> Mapping[str, Any] | None:
        """The document before the change (``fullDocumentBeforeChange``), with
        ``@change_stream(full_document_before_change=...)`` on a collection with pre-images
        enabled; None otherwise."""
        return self.raw.get("fullDocumentBeforeChange")

    @property
    def update_description(self) -> Mapping[str, Any] | None:
        """What an update changed (``updateDescription``: ``updatedFields``, ``removedFields``,
        ``truncatedArrays``); None for other operation types."""
        return self.raw.get("updateDescription")

    def document(self, model: type[M]) -> M:
        """The full document validated as a pydantic model (validation happens here, not earlier)."""
        doc = self.full_document
        if doc is None:
            raise ValueError(
                f"{self.operation_type} event has no fullDocument; use "
                "@change_stream(full_document='updateLookup') for updates"
            )
        validate = getattr(model, "model_validate", None)
        if validate is None:
            raise TypeError(f"{model!r} is not a pydantic model")
        result: M = validate(doc)
        return result

    def __repr__(self) -> str:
        return f"ChangeEvent({self.operation_type!r}, ns={self.namespace!r}, key={self.document_key!r})"


__all__ = [
    "ChangeEvent",
    "ResumeToken",
    "check_resume_token",
    "compare_tokens",
    "newer_token",
    "timestamp_datetime",
    "token_cluster_time",
    "token_data",
    "token_datetime",
]
