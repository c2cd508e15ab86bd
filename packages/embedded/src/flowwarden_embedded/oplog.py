"""The oplog of a replica set member (the replica set's, or one shard's): every write it logged, in
cluster-time order.

The server appends what MongoDB would log (one entry per document write, one entry per committed
transaction, one per DDL command); change-stream cursors read it and ``local.oplog.rs`` finds show
it. Each entry gets one cluster time; each document-level operation inside it is an
:class:`OplogRecord`, the unit a change stream turns into an event.

Hard rules:

* Cluster times are strictly increasing: ``Timestamp(max(now_seconds, last.time), increment)``,
  and every entry comes after the oplog's clock, which a shard's also moves on when a mongos
  tells it a newer cluster time (:meth:`Oplog.advance`): what was read up to the clock is final.
* Everything here runs on the server's event loop thread: :meth:`Oplog.append` wakes the cursors
  awaiting new entries by resolving loop futures, so it must never be called from another thread.
* Documents handed to :meth:`Oplog.append` are kept as they are and shared with every event built
  from them: the caller must never mutate them afterwards.
* With ``max_events=N`` only the newest ``N`` entries are kept; a change stream that needs an
  entry that was dropped fails with ``ChangeStreamHistoryLost`` (code 286).

After each append the oplog encodes the new document events (as a stream with default options
shows them) in small steps on the event loop, so serving a long oplog costs little more than
copying bytes.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
import uuid as _uuid
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bson import Binary, Int64, Timestamp
from bson.errors import InvalidDocument
from bson.raw_bson import RawBSONDocument

from flowwarden_embedded.eventbson import classic_document_event_bson
from flowwarden_embedded.tokens import event_token_data, key_timestamp, ts_key
from flowwarden_embedded.updates import DocDiff, bson_equal, compute_diff, oplog_diff

DOCUMENT_OPS = frozenset({"insert", "update", "replace", "delete"})
"""Operations on one document; they carry ``document_key``."""

CLASSIC_OPS = frozenset({"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase"})
"""Operations every change stream reports; the others only with ``showExpandedEvents``."""

EXPANDED_OPS = frozenset({"create", "createIndexes", "dropIndexes", "modify"})

NOOP = "noop"
"""A no-op entry (``op: "n"``): what a member logs that is no change, e.g. ``replSetInitiate``'s
"initiating set"; its ``description`` is the entry's ``o``. No change stream reports it."""

_ALL_OPS = CLASSIC_OPS | EXPANDED_OPS | {NOOP}
_EPOCH = _dt.datetime(1970, 1, 1)
_ENCODE_STEP = 256  # document events encoded per event-loop step
_ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


@dataclass(frozen=True, slots=True)
class OplogOp:
    """One logged operation, as the server describes it after the write succeeded.

    ``before`` is the whole document before an update, replace or delete (always given);
    ``after`` the whole document after an insert, update or replace. ``pre_image_recorded`` says
    the collection had ``changeStreamPreAndPostImages`` enabled at write time (so
    ``fullDocumentBeforeChange`` and ``fullDocument: whenAvailable|required`` may use the images).
    ``to`` is the target ``(db, coll)`` of a rename. ``description`` carries the DDL details shown
    as ``operationDescription`` with ``showExpandedEvents``: create options, ``{"indexes": [spec]}``
    for index commands (a bare spec is wrapped), collMod options; for ``modify`` a
    ``stateBeforeChange`` key, if present, becomes the event's ``stateBeforeChange``.
    """

    op: str
    db: str
    coll: str | None
    document_key: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    pre_image_recorded: bool = False
    to: tuple[str, str] | None = None
    description: dict[str, Any] | None = None


class OplogRecord:
    """One event-producing operation at one oplog position ``(cluster time, txnOpIndex)``.

    The records of one oplog entry (one ``append`` call) share its cluster time, wall time and
    transaction ids; ``count`` is how many records the entry has, ``index`` this one's place.
    Records are immutable once appended, except for caches change streams fill lazily (token,
    encoded event, update delta), each computed once and shared by every stream. They hold plain
    values where they can: a long oplog is scanned by the garbage collector, so every object a
    record keeps alive costs on every allocation-heavy request.
    """

    __slots__ = (
        "cache",
        "coll",
        "count",
        "db",
        "diff",
        "index",
        "key",
        "kind",
        "lsid",
        "op",
        "raw",
        "seq",
        "to_coll",
        "to_db",
        "token_data",
        "txn_number",
        "uuid",
        "wall_ms",
    )

    def __init__(
        self,
        seq: int,
        key: int,
        index: int,
        count: int,
        op: OplogOp,
        uuid: bytes | None,
        wall_ms: int,
        lsid: dict[str, Any] | None,
        txn_number: int | None,
    ) -> None:
        self.seq = seq
        self.key = key
        self.index = index
        self.count = count
        self.op = op
        self.kind = op.op
        self.db = op.db
        self.coll = op.coll
        to = op.to
        self.to_db = to[0] if to else None
        self.to_coll = to[1] if to else None
        self.uuid = uuid
        self.wall_ms = wall_ms
        self.lsid = lsid
        self.txn_number = txn_number
        self.token_data: str | None = None
        self.raw: RawBSONDocument | None = None
        self.cache: dict[int, Any] | None = None
        self.diff: DocDiff | None = None

    @property
    def wall(self) -> _dt.datetime:
        """The entry's wall time: naive UTC, millisecond precision (what a BSON date holds)."""
        return _EPOCH + _dt.timedelta(milliseconds=self.wall_ms)

    @property
    def ts(self) -> Timestamp:
        """The entry's cluster time."""
        return key_timestamp(self.key)

    def ns_doc(self) -> dict[str, Any]:
        """The event's ``ns``: ``{db, coll}``, or ``{db}`` for a database-level command."""
        if self.coll is None:
            return {"db": self.db}
        return {"db": self.db, "coll": self.coll}

    def operation_description(self) -> dict[str, Any] | None:
        """What MongoDB puts in ``operationDescription`` (and in the token) for command events."""
        op = self.op
        desc = dict(op.description or {})
        if self.kind == "rename":
            desc.pop("renameCollection", None)
            desc.pop("stayTemp", None)
            if isinstance(desc.get("dropTarget"), bool):
                # MongoDB names the dropped target by its UUID, and says nothing when there was none.
                del desc["dropTarget"]
            desc["to"] = {"db": self.to_db, "coll": self.to_coll}
            return desc
        if self.kind == "create":
            desc.pop("create", None)
            if not desc:
                desc = {"idIndex": dict(_ID_INDEX)}
            return desc
        if self.kind in ("createIndexes", "dropIndexes"):
            desc.pop(self.kind, None)
            if "indexes" in desc:
                return desc
            return {"indexes": [desc]}
        if self.kind == "modify":
            desc.pop("collMod", None)
            desc.pop("stateBeforeChange", None)
            return desc
        return None

    def data(self) -> str:
        """The ``_data`` hex of the event's resume token (computed once)."""
        data = self.token_data
        if data is None:
            document_op = self.kind in DOCUMENT_OPS
            data = self.token_data = event_token_data(
                self.key,
                self.index,
                self.uuid,
                self.kind,
                self.op.document_key if document_op else None,
                None if document_op else self.operation_description(),
            )
        return data

    def token(self) -> dict[str, str]:
        """The event's resume token, ``{"_data": ...}`` (a new dict each call)."""
        return {"_data": self.data()}

    def invalidate_token(self) -> dict[str, str]:
        """The token of the invalidate that follows this command: same position, fromInvalidate."""
        data = event_token_data(
            self.key,
            self.index,
            self.uuid,
            self.kind,
            None,
            self.operation_description(),
            from_invalidate=True,
        )
        return {"_data": data}

    def update_diff(self) -> DocDiff:
        diff = self.diff
        if diff is None:
            diff = self.diff = compute_diff(self.op.before or {}, self.op.after or {})
        return diff


class Oplog:
    """A replica set member's oplog: append on write, read by change streams and ``local.oplog.rs``.

    The members of a sharded cluster's shards each have one; they share ``origin`` (the cluster's
    start) and ``uuids`` (a collection's UUID is the cluster's, whichever shard logs it).
    """

    def __init__(
        self,
        max_events: int | None = None,
        *,
        origin: Timestamp | None = None,
        uuids: dict[tuple[str, str], bytes] | None = None,
    ) -> None:
        if max_events is not None and max_events < 1:
            raise ValueError(f"oplog max_events must be at least 1 (or None for no limit), got {max_events}")
        self.max_events = max_events
        self._records: list[OplogRecord] = []
        self._base = 0  # seq of self._records[0]
        self._head = 0  # index in self._records of the oldest kept record
        self._entry_sizes: deque[int] = deque()  # records per kept entry, oldest first
        self._last_key = ts_key(origin if origin is not None else Timestamp(int(time.time()), 0))
        self._clock_key = self._last_key  # at or after the newest entry: see advance()
        self._clock = key_timestamp(self._clock_key)  # every reply carries it: made once per change
        self._origin_key = self._last_key
        self._dropped_key: int | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._encoded_upto = 0  # records below this sequence number were offered to the encoder
        self._encoding = False
        self._uuids: dict[tuple[str, str], bytes] = {} if uuids is None else uuids
        self.uuid_source: Callable[[str, str], Binary | bytes | None] | None = None
        """Where a collection's UUID comes from on first sight (the server's catalog); random if unset."""

    # -- time ---------------------------------------------------------------------------------

    @property
    def cluster_time(self) -> Timestamp:
        """The member's cluster time (for ``$clusterTime`` and ``operationTime``): its newest
        entry's, or the newer one a mongos told it since."""
        return key_timestamp(self._clock_key)

    @property
    def clock_key(self) -> int:
        """The cluster time as one integer: every entry up to it is in the oplog, every later
        entry will come after it."""
        return self._clock_key

    def advance(self, key: int) -> None:
        """Move the clock on to ``key`` if it is behind, logging nothing: what a shard does with
        the cluster time a mongos sends it (gossip), so that its next entry comes after every
        entry the mongos has seen on any shard."""
        if key > self._clock_key:
            self._clock_key = key
            self._clock = key_timestamp(key)

    def next_key(self) -> int:
        """The cluster time (as one integer) an entry appended now would get."""
        return self._next_key(time.time())

    def _next_key(self, now: float) -> int:
        candidate = int(now) << 32 | 1
        last = self._clock_key
        return candidate if candidate > last else last + 1

    # -- collection UUIDs ---------------------------------------------------------------------

    def collection_uuid(self, db: str, coll: str) -> Binary:
        """The UUID events of a collection carry (assigned on first sight; new after a drop)."""
        uuid: Binary = Binary(self._known_uuid(db, coll), 4)
        return uuid

    def _known_uuid(self, db: str, coll: str) -> bytes:
        key = (db, coll)
        value = self._uuids.get(key)
        if value is None:
            source = self.uuid_source(db, coll) if self.uuid_source is not None else None
            value = bytes(source) if source is not None and len(bytes(source)) == 16 else _uuid.uuid4().bytes
            self._uuids[key] = value
        return value

    def _uuid_for(self, op: OplogOp) -> bytes | None:
        if op.coll is None:
            return None
        key = (op.db, op.coll)
        value = self._known_uuid(op.db, op.coll)
        if op.op == "drop":
            del self._uuids[key]
        elif op.op == "rename" and op.to is not None:
            del self._uuids[key]
            self._uuids[op.to] = value
        return value

    # -- writing ------------------------------------------------------------------------------

    def append(
        self,
        ops: Sequence[OplogOp],
        *,
        lsid: dict[str, Any] | None = None,
        txn_number: int | None = None,
        at: int | None = None,
    ) -> Timestamp:
        """Record ``ops`` at ONE new cluster time and wake waiting change-stream cursors.

        A plain write of one document = one call with one op. A committed transaction = one call
        with all its ops (events share the cluster time, carry ``lsid``/``txnNumber``, and their
        tokens are ordered by op index). A non-transactional ``insert_many``/``update_many``/
        ``delete_many`` = one call PER DOCUMENT, as MongoDB gives each document its own entry.

        Updates that changed nothing are not logged (MongoDB writes no oplog entry for them); when
        nothing is left the current cluster time is returned and no entry is added. A
        ``dropDatabase`` is preceded by one ``drop`` entry per collection of that database still
        live, as MongoDB drops the collections first. Returns the cluster time used.

        ``at`` sets that cluster time (as one integer; it must be after :attr:`clock_key`): the
        commit time every shard of a transaction that wrote to several logs its part at.
        """
        if at is not None and at <= self._clock_key:
            raise ValueError(
                f"an entry at {key_timestamp(at)} would not come after the clock {self.cluster_time}"
            )
        if len(ops) == 1 and ops[0].op == "insert":
            kept: Sequence[OplogOp] = ops  # the hot path: nothing to filter
        else:
            kept = [op for op in ops if not self._is_noop(op)]
            for op in kept:
                if op.op not in _ALL_OPS:
                    raise ValueError(f"unknown oplog operation {op.op!r}; expected one of {sorted(_ALL_OPS)}")
            if not kept:
                return self.cluster_time
            if lsid is None and txn_number is None:
                for op in kept:
                    if op.op == "dropDatabase":
                        for coll in self._live_collections(op.db, kept):
                            self._append_entry([OplogOp("drop", op.db, coll)], None, None)
        ts = self._append_entry(kept, lsid, txn_number, at)
        if self._waiters:
            self._wake()
        if not self._encoding:
            self._schedule_encoding()
        return ts

    def _is_noop(self, op: OplogOp) -> bool:
        return (
            op.op == "update"
            and op.before is not None
            and op.after is not None
            and bson_equal(op.before, op.after)
        )

    def _live_collections(self, db: str, ops: Iterable[OplogOp]) -> list[str]:
        dropped_here = {op.coll for op in ops if op.op == "drop" and op.db == db}
        return sorted(coll for (d, coll) in self._uuids if d == db and coll not in dropped_here)

    def _append_entry(
        self,
        ops: Sequence[OplogOp],
        lsid: dict[str, Any] | None,
        txn_number: int | None,
        at: int | None = None,
    ) -> Timestamp:
        now = time.time()
        key = self._next_key(now) if at is None else at
        wall_ms = int(now * 1000)
        records = self._records
        seq = self._base + len(records)
        count = len(ops)
        for index, op in enumerate(ops):
            if op.op == "dropDatabase":
                for ns in [k for k in self._uuids if k[0] == op.db]:
                    del self._uuids[ns]
                uuid = None
            else:
                uuid = self._uuid_for(op)
            records.append(OplogRecord(seq + index, key, index, count, op, uuid, wall_ms, lsid, txn_number))
        self._entry_sizes.append(count)
        self._last_key = self._clock_key = key
        ts = self._clock = key_timestamp(key)
        if self.max_events is not None:
            self._trim(self.max_events)
        return ts

    def _trim(self, limit: int) -> None:
        sizes = self._entry_sizes
        while len(sizes) > limit:
            self._dropped_key = self._records[self._head].key
            self._head += sizes.popleft()
        # Compact lazily so trimming one entry per append stays O(1) amortized.
        if self._head > 4096 and self._head * 2 > len(self._records):
            del self._records[: self._head]
            self._base += self._head
            self._head = 0

    def _schedule_encoding(self) -> None:
        """Encode new document events soon, in small steps between requests.

        A stream reading a long oplog then finds its events encoded already, and the work was
        done while the server had nothing else to do. Off an event loop (a bare oplog in a unit
        test) nothing is scheduled and streams encode what they need on demand.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._encoding = True
        loop.call_soon(self._encode_step)

    def _encode_step(self) -> None:
        self._encoding = False
        records = self._records
        start = max(self._encoded_upto, self.first_seq) - self._base
        stop = min(len(records), start + _ENCODE_STEP)
        for record in records[start:stop]:
            if record.raw is None and record.kind in DOCUMENT_OPS:
                try:
                    record.raw = RawBSONDocument(classic_document_event_bson(record))
                except (InvalidDocument, OverflowError):
                    # Left to the stream that needs the event, which reports the error to its client.
                    continue
        self._encoded_upto = self._base + stop
        if stop < len(records):
            self._schedule_encoding()

    def _wake(self) -> None:
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Return after the next append, or after ``timeout`` seconds, whichever comes first."""
        await wait_for_appends((self,), timeout)

    def wake_all(self) -> None:
        """Wake every awaiting cursor now (a cursor closed while it waits)."""
        self._wake()

    # -- reading ------------------------------------------------------------------------------

    @property
    def first_seq(self) -> int:
        """Sequence number of the oldest kept record."""
        return self._base + self._head

    @property
    def end_seq(self) -> int:
        """Sequence number the next record will get."""
        return self._base + len(self._records)

    def view(self) -> tuple[list[OplogRecord], int]:
        """``(records, base)``: record with sequence ``s`` is ``records[s - base]`` (for ``s`` kept).

        The list is live and only grows at the end between awaits; compaction may rebase it, so
        callers keep sequence numbers, never list indexes, across awaits.
        """
        return self._records, self._base

    def release(self, seq: int) -> None:
        """A reader is done with the records before ``seq``; the oplog keeps them regardless (its
        retention alone drops entries)."""

    def history_lost_before(self, key: int, *, event: bool = False) -> bool:
        """Whether a resume point at cluster time ``key`` is older than the oldest kept entry.

        Before anything was dropped the whole history is kept, so only an ``event`` position
        older than the oplog itself (a token of an earlier server) is lost; a time older than the
        oplog simply means "from the beginning".
        """
        if self._dropped_key is None:
            return event and key < self._origin_key
        records = self._records
        oldest = records[self._head].key if self._head < len(records) else self._last_key + 1
        return key < oldest

    def seek(self, key: int, index: int = 0) -> int:
        """Sequence number of the first kept record at or after position ``(key, index)``."""
        lo = self._head
        pos = bisect_left(self._records, (key, index), lo=lo, key=_position)
        return self._base + pos

    def oplog_rs_find(self, sort_natural: int, limit: int | None) -> list[dict[str, Any]]:
        """Documents of ``local.oplog.rs`` (``{ts, t, v, op, ns, ui?, o, o2?, wall}``).

        Oldest first for ``sort_natural`` 1, newest first for -1.
        """
        records = self._records
        out: list[dict[str, Any]] = []
        wanted = limit if limit is not None and limit > 0 else None
        if sort_natural < 0:
            pos = len(records) - 1
            while pos >= self._head and (wanted is None or len(out) < wanted):
                start = pos - records[pos].index
                out.append(_rs_document(records[start : pos + 1]))
                pos = start - 1
        else:
            pos = self._head
            while pos < len(records) and (wanted is None or len(out) < wanted):
                count = records[pos].count
                out.append(_rs_document(records[pos : pos + count]))
                pos += count
        return out


async def wait_for_appends(oplogs: Sequence[Oplog], timeout: float) -> None:
    """Return after the next append to any of ``oplogs``, or after ``timeout`` seconds."""
    if timeout <= 0:
        return
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    for oplog in oplogs:
        oplog._waiters.add(fut)
    handle = loop.call_later(timeout, _resolve, fut)
    try:
        await fut
    finally:
        handle.cancel()
        for oplog in oplogs:
            oplog._waiters.discard(fut)


def _position(record: OplogRecord) -> tuple[int, int]:
    return (record.key, record.index)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _rs_op(record: OplogRecord) -> dict[str, Any]:
    """One operation as an oplog entry (or an ``applyOps`` element) shows it."""
    op = record.op
    ui = Binary(record.uuid, 4) if record.uuid is not None else None
    doc: dict[str, Any]
    if record.kind == "insert":
        doc = {"op": "i", "ns": f"{op.db}.{op.coll}", "ui": ui, "o": op.after, "o2": op.document_key}
    elif record.kind == "update":
        diff = oplog_diff(record.update_diff())
        doc = {
            "op": "u",
            "ns": f"{op.db}.{op.coll}",
            "ui": ui,
            "o": {"$v": 2, "diff": diff},
            "o2": op.document_key,
        }
    elif record.kind == "replace":
        doc = {"op": "u", "ns": f"{op.db}.{op.coll}", "ui": ui, "o": op.after, "o2": op.document_key}
    elif record.kind == "delete":
        doc = {"op": "d", "ns": f"{op.db}.{op.coll}", "ui": ui, "o": op.document_key}
    elif record.kind == NOOP:
        doc = {"op": "n", "ns": "", "o": dict(op.description or {})}
    else:
        doc = {"op": "c", "ns": f"{op.db}.$cmd", "ui": ui, "o": _command_object(record)}
    if ui is None:
        doc.pop("ui", None)
    return doc


def _command_object(record: OplogRecord) -> dict[str, Any]:
    op = record.op
    desc = dict(op.description or {})
    if record.kind == "drop":
        return {"drop": op.coll}
    if record.kind == "dropDatabase":
        return {"dropDatabase": 1}
    if record.kind == "rename":
        desc.pop("to", None)
        if isinstance(desc.get("dropTarget"), bool):
            del desc["dropTarget"]
        return {
            "renameCollection": f"{op.db}.{op.coll}",
            "to": f"{record.to_db}.{record.to_coll}",
            "stayTemp": False,
            **desc,
        }
    if record.kind == "create":
        desc.pop("create", None)
        return {"create": op.coll, **(desc or {"idIndex": dict(_ID_INDEX)})}
    if record.kind == "createIndexes":
        specs = desc.get("indexes") or [desc]
        return {"createIndexes": op.coll, **specs[0]}
    if record.kind == "dropIndexes":
        specs = desc.get("indexes") or [desc]
        return {"dropIndexes": op.coll, "index": specs[0].get("name", specs[0])}
    desc.pop("stateBeforeChange", None)
    return {"collMod": op.coll, **desc}


def _rs_document(records: Sequence[OplogRecord]) -> dict[str, Any]:
    first = records[0]
    tail: dict[str, Any] = {"ts": first.ts, "t": Int64(1), "v": Int64(2), "wall": first.wall}
    if first.lsid is not None or first.txn_number is not None:
        head: dict[str, Any] = {}
        if first.lsid is not None:
            head["lsid"] = first.lsid
        if first.txn_number is not None:
            head["txnNumber"] = Int64(first.txn_number)
        apply_ops = [_rs_op(record) for record in records]
        return {**head, "op": "c", "ns": "admin.$cmd", "o": {"applyOps": apply_ops}, **tail}
    return {**_rs_op(first), **tail}


__all__ = [
    "CLASSIC_OPS",
    "DOCUMENT_OPS",
    "EXPANDED_OPS",
    "NOOP",
    "Oplog",
    "OplogOp",
    "OplogRecord",
    "key_timestamp",
    "wait_for_appends",
]
