"""Server-side cursors: the protocol every cursor implements, result cursors, and the registry.

A cursor id handed to a client is a non-zero int64 that stays valid until the cursor is exhausted,
killed, its session ends, or it sits idle past the timeout; ``getMore`` on any other id fails with
code 43 (CursorNotFound), which is what drivers resume change streams from.
"""

from __future__ import annotations

import datetime
import random
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bson import Int64
from bson.raw_bson import RawBSONDocument

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.rawstrings import encode

# MongoDB's limits: a batch stops growing once it passes 16 MiB, a first batch defaults to 101
# documents, and a cursor idle for 10 minutes is reaped.
MAX_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_FIRST_BATCH = 101
CURSOR_TIMEOUT_SECONDS = 600.0


@runtime_checkable
class ServerCursor(Protocol):
    """What the server needs from a cursor to answer ``aggregate``/``find`` and ``getMore``."""

    ns: str

    async def fetch(
        self, batch_size: int | None, max_time_ms: int | None, *, first: bool
    ) -> tuple[list[Any], dict[str, Any]]:
        """Next batch and extra cursor-reply fields (e.g. ``{"postBatchResumeToken": ...}``).

        ``first=True`` is the firstBatch of the command that opened the cursor: answer at once,
        never await. May raise :class:`CommandError`.
        """
        ...

    @property
    def exhausted(self) -> bool:
        """True once no further batch can come: the server replies cursor id 0 and forgets it."""
        ...

    def close(self) -> None:
        """Release the cursor (killCursors, session end, idle timeout, server stop)."""
        ...


class ListCursor:
    """A cursor over a result computed up front (find, ordinary aggregate, listCollections...).

    Documents are encoded one at a time as batches are cut, so a batch respects MongoDB's 16 MiB
    cap while the reply still encodes each document only once.
    """

    __slots__ = ("_docs", "_pos", "ns", "single_batch")

    def __init__(self, ns: str, docs: list[Any], *, single_batch: bool = False) -> None:
        self.ns = ns
        self._docs = docs
        self._pos = 0
        self.single_batch = single_batch

    async def fetch(
        self, batch_size: int | None, max_time_ms: int | None, *, first: bool
    ) -> tuple[list[Any], dict[str, Any]]:
        return self.next_batch(batch_size, first=first), {}

    def next_batch(self, batch_size: int | None, *, first: bool) -> list[Any]:
        limit = batch_size if batch_size else (DEFAULT_FIRST_BATCH if first else None)
        end = len(self._docs) if limit is None else min(len(self._docs), self._pos + limit)
        batch: list[Any] = []
        size = 0
        docs = self._docs
        pos = self._pos
        while pos < end:
            raw = RawBSONDocument(encode(docs[pos]))
            size += len(raw.raw)
            if batch and size > MAX_BATCH_BYTES:
                break
            batch.append(raw)
            pos += 1
        self._pos = pos
        if self.single_batch:
            self._pos = len(self._docs)
        return batch

    @property
    def exhausted(self) -> bool:
        return self._pos >= len(self._docs)

    def close(self) -> None:
        self._docs = []
        self._pos = 0


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(slots=True)
class _Entry:
    cursor: ServerCursor
    session: Hashable | None
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    no_timeout: bool = False
    # What currentOp shows of the cursor: the command that opened it, when, and what it returned.
    originating: dict[str, Any] | None = None
    created: datetime.datetime = field(default_factory=_utcnow)
    last_access: datetime.datetime = field(default_factory=_utcnow)
    docs_returned: int = 0
    batches_returned: int = 0

    def describe(self, cursor_id: int) -> dict[str, Any]:
        """The cursor as currentOp's ``cursor`` field and its ``idleCursor`` entries show it."""
        tailable = bool(getattr(self.cursor, "tailable", False))
        doc: dict[str, Any] = {
            "cursorId": Int64(cursor_id),
            "createdDate": self.created,
            "lastAccessDate": self.last_access,
            "nDocsReturned": Int64(self.docs_returned),
            "nBatchesReturned": Int64(self.batches_returned),
            "noCursorTimeout": self.no_timeout,
            "tailable": tailable,
            "awaitData": tailable,
        }
        if self.originating is not None:
            doc["originatingCommand"] = self.originating
        return doc


class CursorRegistry:
    """Open cursors by id. Runs on the server's event loop only, so it needs no locking."""

    def __init__(self, timeout_seconds: float = CURSOR_TIMEOUT_SECONDS) -> None:
        self._entries: dict[int, _Entry] = {}
        self._timeout = timeout_seconds
        self._random = random.Random()

    def __len__(self) -> int:
        return len(self._entries)

    def register(
        self,
        cursor: ServerCursor,
        session: Hashable | None,
        *,
        no_timeout: bool = False,
        originating: dict[str, Any] | None = None,
        first_batch: int = 0,
    ) -> Int64:
        """Give ``cursor`` a fresh non-zero id; ``no_timeout`` exempts it from the idle reaper.
        ``originating`` is the command that opened it, which returned ``first_batch`` documents."""
        while True:
            cursor_id = self._random.randint(1, 2**63 - 1)
            if cursor_id not in self._entries:
                break
        self._entries[cursor_id] = _Entry(
            cursor,
            session,
            no_timeout=no_timeout,
            originating=originating,
            docs_returned=first_batch,
            batches_returned=1,
        )
        return Int64(cursor_id)

    def returned(self, cursor_id: int, count: int) -> None:
        """Count a batch of ``count`` documents a getMore returned from the cursor."""
        entry = self._entries.get(int(cursor_id))
        if entry is not None:
            entry.docs_returned += count
            entry.batches_returned += 1

    def describe(self, cursor_id: int) -> dict[str, Any] | None:
        """The cursor as currentOp shows it; None if there is no such cursor."""
        entry = self._entries.get(int(cursor_id))
        return None if entry is None else entry.describe(cursor_id)

    def idle(self) -> list[tuple[str, Hashable | None, dict[str, Any]]]:
        """Every cursor no getMore is using: its namespace, session and description."""
        return [
            (entry.cursor.ns, entry.session, entry.describe(cid))
            for cid, entry in self._entries.items()
            if not entry.busy
        ]

    def lookup(self, cursor_id: int) -> ServerCursor:
        entry = self._entries.get(int(cursor_id))
        if entry is None:
            raise CommandError(43, f"cursor id {int(cursor_id)} not found")
        entry.last_used = time.monotonic()
        return entry.cursor

    def checkout(self, cursor_id: int) -> ServerCursor:
        """Mark the cursor as running a getMore; a second concurrent getMore is refused as MongoDB does."""
        entry = self._entries.get(int(cursor_id))
        if entry is None:
            raise CommandError(43, f"cursor id {int(cursor_id)} not found")
        if entry.busy:
            raise CommandError(292, f"Cursor id {int(cursor_id)} is already in use", code_name="CursorInUse")
        entry.busy = True
        entry.last_used = time.monotonic()
        entry.last_access = _utcnow()
        return entry.cursor

    def checkin(self, cursor_id: int) -> None:
        entry = self._entries.get(int(cursor_id))
        if entry is not None:
            entry.busy = False
            entry.last_used = time.monotonic()

    def kill(self, cursor_id: int) -> bool:
        entry = self._entries.pop(int(cursor_id), None)
        if entry is None:
            return False
        entry.cursor.close()
        return True

    def kill_session(self, session: Hashable) -> int:
        """Close every cursor opened under ``session`` (endSessions, or the session's end)."""
        doomed = [cid for cid, entry in self._entries.items() if entry.session == session]
        for cid in doomed:
            self.kill(cid)
        return len(doomed)

    def reap_idle(self) -> int:
        now = time.monotonic()
        doomed = [
            cid
            for cid, entry in self._entries.items()
            if not entry.busy and not entry.no_timeout and now - entry.last_used > self._timeout
        ]
        for cid in doomed:
            self.kill(cid)
        return len(doomed)

    def close_all(self) -> None:
        for cid in list(self._entries):
            self.kill(cid)
