"""The operations a server is running, and what each collection's operations took: what
``currentOp`` and ``$currentOp`` list, what ``killOp`` interrupts and what ``$collStats`` reports
as ``latencyStats`` and ``queryExecStats``.

Every command a process receives is an :class:`Operation` from the moment the host starts it
until its reply is made, with an ``opid`` that no other operation of the deployment has: a
command blocked by a ``failCommand`` fail point, a ``getMore`` waiting for change events and the
``currentOp`` that lists them are all in progress together. The awaitable ``hello`` of a driver's
monitor is the connection's heartbeat, not work, and is not listed.

``killOp`` marks an operation killed and interrupts it where it waits; it then fails with
Interrupted (11601), as mongod's does, and a ``getMore`` killed so kills its cursor.

When an operation ends, its time goes to the latency statistics of the collection it addressed,
as mongod's ``Top`` counts them: ``find``, ``getMore``, ``aggregate``, ``count`` and ``distinct``
are reads, ``insert``, ``update``, ``delete`` and ``findAndModify`` writes, the collection's
other commands (indexes, collMod, drop, ...) commands. The statistics of a collection start
afresh when it is dropped and created again (a new UUID). A read or write that no index could
serve counts as a collection scan (``queryExecStats``).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import Binary, Int64

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.storage import Document

if TYPE_CHECKING:
    from flowwarden_embedded.host import ConnectionInfo

READS = frozenset({"find", "getMore", "aggregate", "count", "distinct"})
WRITES = frozenset({"insert", "update", "delete", "findAndModify"})
COLLECTION_COMMANDS = frozenset(
    {"create", "drop", "createIndexes", "listIndexes", "dropIndexes", "collMod", "collStats"}
)
# What currentOp's ``op`` says of a command, as mongod's CurOp names the network operations.
_OP_NAMES = {
    "find": "query",
    "getMore": "getmore",
    "insert": "insert",
    "update": "update",
    "delete": "remove",
    "killCursors": "killcursors",
}
# The heartbeat of a driver's monitor: never listed as an operation.
_UNLISTED = frozenset({"hello", "isMaster", "ismaster"})

INTERRUPTED = 11601
INTERRUPTED_MESSAGE = "operation was interrupted"


def _lower_bounds() -> tuple[int, ...]:
    """The lower bound, in microseconds, of each bucket of mongod's latency histograms: powers of
    two, with the range from 2^11 to 2^21 split in halves."""
    bounds = [0] + [1 << k for k in range(1, 11)]
    for k in range(11, 21):
        bounds += [1 << k, 3 << (k - 1)]
    bounds += [1 << k for k in range(21, 41)]
    return tuple(bounds)


LATENCY_BUCKETS = _lower_bounds()


def latency_bucket(micros: int) -> int:
    """The index in :data:`LATENCY_BUCKETS` of the bucket ``micros`` falls in."""
    if micros <= 0:
        return 0
    log2 = micros.bit_length() - 1
    if log2 < 11:
        return log2
    if log2 < 21:
        return 2 * log2 - 11 + (1 if micros >= 3 << (log2 - 1) else 0)
    return min(log2 + 10, len(LATENCY_BUCKETS) - 1)


@dataclass(slots=True)
class LatencyHistogram:
    """One kind of operation's latencies on one collection (reads, writes or commands)."""

    latency: int = 0
    ops: int = 0
    buckets: dict[int, int] = field(default_factory=dict)

    def record(self, micros: int) -> None:
        self.latency += micros
        self.ops += 1
        bucket = latency_bucket(micros)
        self.buckets[bucket] = self.buckets.get(bucket, 0) + 1

    def document(self, histograms: bool) -> Document:
        doc: Document = {}
        if histograms:
            doc["histogram"] = [
                {"micros": Int64(LATENCY_BUCKETS[bucket]), "count": Int64(n)}
                for bucket, n in sorted(self.buckets.items())
            ]
        doc["latency"] = Int64(self.latency)
        doc["ops"] = Int64(self.ops)
        return doc


@dataclass(slots=True)
class CollectionUsage:
    """What the operations on one collection (of one UUID) took."""

    uuid: Binary | None
    reads: LatencyHistogram = field(default_factory=LatencyHistogram)
    writes: LatencyHistogram = field(default_factory=LatencyHistogram)
    commands: LatencyHistogram = field(default_factory=LatencyHistogram)
    transactions: LatencyHistogram = field(default_factory=LatencyHistogram)
    collection_scans: int = 0

    def latency_stats(self, histograms: bool) -> Document:
        return {
            "reads": self.reads.document(histograms),
            "writes": self.writes.document(histograms),
            "commands": self.commands.document(histograms),
            "transactions": self.transactions.document(histograms),
        }

    def query_exec_stats(self) -> Document:
        scans = Int64(self.collection_scans)
        return {"collectionScans": {"total": scans, "nonTailable": scans}}


@dataclass(slots=True, eq=False)
class Operation:
    """One command in progress on one connection."""

    opid: int
    conn: ConnectionInfo
    command: Document
    db: str
    name: str
    ns: str
    op: str
    started: float = field(default_factory=time.monotonic)
    task: asyncio.Task[Any] | None = None
    killed: bool = False
    # A getMore's cursor, as currentOp describes it (set by the getMore once it has the cursor).
    cursor: Document | None = None
    originating_command: Document | None = None


def namespace(name: str, cmd: Document, db: str) -> tuple[str, str | None]:
    """The ``ns`` currentOp shows for a command, and the collection it addresses (None for a
    command that addresses none)."""
    if name == "getMore":
        coll = cmd.get("collection")
        return (f"{db}.{coll}", coll) if isinstance(coll, str) else (f"{db}.$cmd", None)
    value = cmd.get(name)
    if isinstance(value, str) and value and name not in ("explain",):
        return f"{db}.{value}", value
    if name == "aggregate":
        return f"{db}.$cmd.aggregate", None
    return f"{db}.$cmd", None


class Operations:
    """The deployment's operations in progress and its collections' usage statistics. Runs on
    the server's event loop only."""

    def __init__(self) -> None:
        self._opids = itertools.count(1)
        self._running: dict[int, Operation] = {}
        self._usage: dict[str, CollectionUsage] = {}

    def begin(self, conn: ConnectionInfo, cmd: Document, db: str) -> Operation | None:
        """Start tracking ``cmd``; None for a command that is never listed (a heartbeat)."""
        name = next(iter(cmd), "")
        if name in _UNLISTED:
            return None
        ns, _ = namespace(name, cmd, db)
        op = Operation(
            opid=next(self._opids),
            conn=conn,
            command=cmd,
            db=db,
            name=name,
            ns=ns,
            op=_OP_NAMES.get(name, "command"),
            task=asyncio.current_task(),
        )
        self._running[op.opid] = op
        return op

    def end(
        self,
        op: Operation | None,
        uuid_of: Callable[[str, str], Binary | None],
        scans: int,
    ) -> None:
        """Stop tracking ``op`` and count its time on the collection it addressed (with
        ``scans`` collection scans), in the statistics of that collection's current UUID."""
        if op is None:
            return
        self._running.pop(op.opid, None)
        _, coll = namespace(op.name, op.command, op.db)
        if coll is None:
            return
        if op.name in READS:
            kind = "reads"
        elif op.name in WRITES:
            kind = "writes"
        elif op.name in COLLECTION_COMMANDS:
            kind = "commands"
        else:
            return
        micros = int((time.monotonic() - op.started) * 1_000_000)
        usage = self.usage_of(op.ns, uuid_of(op.db, coll), create=True)
        assert usage is not None
        histogram: LatencyHistogram = getattr(usage, kind)
        histogram.record(micros)
        usage.collection_scans += scans

    def usage_of(self, ns: str, uuid: Binary | None, *, create: bool = False) -> CollectionUsage | None:
        """The statistics of collection ``ns`` of ``uuid``: a collection made again under the same
        name starts with none."""
        usage = self._usage.get(ns)
        if usage is not None and uuid is not None and usage.uuid is not None and usage.uuid != uuid:
            usage = None
        if usage is None:
            if not create:
                return None
            usage = self._usage[ns] = CollectionUsage(uuid)
        elif usage.uuid is None:
            usage.uuid = uuid
        return usage

    def running(self) -> Iterator[Operation]:
        return iter(list(self._running.values()))

    def get(self, opid: int) -> Operation | None:
        return self._running.get(opid)

    def kill(self, opid: int) -> bool:
        """Interrupt operation ``opid`` where it waits; False if no such operation runs."""
        op = self._running.get(opid)
        if op is None:
            return False
        op.killed = True
        if op.task is not None and op.task is not asyncio.current_task() and not op.task.done():
            op.task.cancel()
        return True

    @staticmethod
    def interrupted(op: Operation | None) -> bool:
        """After ``op``'s task was cancelled: True when the cancellation was ``killOp``'s alone (the
        operation then answers Interrupted), False when something else cancelled it too."""
        if op is None or not op.killed or op.task is None:
            return False
        uncancel = getattr(op.task, "uncancel", None)
        if uncancel is None:
            return True
        return bool(uncancel() == 0)


def interrupted_error() -> CommandError:
    return CommandError(INTERRUPTED, INTERRUPTED_MESSAGE, code_name="Interrupted")


def iso_time(moment: datetime.datetime) -> str:
    """A date as currentOp writes ``currentOpTime``: ISO 8601 with milliseconds and the offset."""
    return moment.isoformat(timespec="milliseconds")
