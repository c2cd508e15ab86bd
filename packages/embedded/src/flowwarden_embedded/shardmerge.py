"""What a mongos's change stream reads: its shards' oplogs merged into one, in resume-token order.

A mongos opens a change stream on every shard and merges what they return, sorted by the events'
resume tokens: by cluster time, and events of one cluster time from different shards as their
tokens sort after it (``txnOpIndex``, ``fromInvalidate``, the collection UUID, the document key),
which is how MongoDB breaks such ties. An event is returned only once every shard has reached its
cluster time, since until then a shard could still log an event that sorts before it.

:class:`MergedOplog` is that merge for ONE change-stream cursor, shaped like the
:class:`~flowwarden_embedded.oplog.Oplog` a replica set member's stream reads (``view``,
``seek``, ``first_seq``, ``clock_key``...), so that everything the cursor does (resume points,
filters, invalidates, split events, batch limits, the post-batch resume token) is one code path
through a mongos and on a replica set. Its sequence numbers count the merged records, its own.

Hard rules:

* A record is merged only when its cluster time is at or below the frontier, the oldest clock
  among the shards (``clock_key``): a shard's clock only moves forward and its next entry comes
  after it, so nothing merged later can sort before what was merged already. The post-batch
  resume token of a stream that read everything is a high-water mark at the frontier: the
  minimum of the shards' high-water marks.
* Each time the stream reads, the mongos tells every shard its cluster time (the newest of the
  shards' clocks) and an idle shard's clock moves on to it. On a real cluster the shards' periodic
  no-op writer (``periodicNoopIntervalSecs``, 10 s by default) moves an idle shard on, so events
  wait up to that long; here the shard is moved on when the mongos asks, which writes no oplog
  entry and adds no wait.
* A shard that dropped a record the stream had not merged yet has lost the stream's history:
  the stream fails with ChangeStreamHistoryLost (286), as a mongos reports a shard's.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence

from flowwarden_embedded.oplog import Oplog, OplogRecord, wait_for_appends

_COMPACT_AFTER = 1024  # merged records a reader is done with before they are let go


class MergedOplog:
    """One mongos change stream's merge of its shards' oplogs (see the module docstring)."""

    def __init__(self, shards: Sequence[Oplog]) -> None:
        if not shards:
            raise ValueError("a mongos merges the oplogs of at least one shard")
        self._shards = tuple(shards)
        # Per shard, the sequence number of its first record not merged yet: a new stream starts
        # after everything logged so far (seek() moves it for a stream with a start point).
        self._next = [shard.end_seq for shard in self._shards]
        self._merged: list[OplogRecord] = []
        self._base = 0  # merged sequence number of self._merged[0]
        self._frontier = self._gossip()

    def _gossip(self) -> int:
        """Tell every shard the mongos's cluster time; returns the frontier after that."""
        mongos_time = max(shard.clock_key for shard in self._shards)
        for shard in self._shards:
            shard.advance(mongos_time)
        return min(shard.clock_key for shard in self._shards)

    # -- what a change-stream cursor reads --------------------------------------------------------

    @property
    def clock_key(self) -> int:
        """The frontier: every shard has logged everything up to it."""
        return self._frontier

    @property
    def end_seq(self) -> int:
        return self._base + len(self._merged)

    @property
    def first_seq(self) -> int:
        """The oldest merged record kept; past :attr:`end_seq` once a shard dropped a record this
        stream had not merged (its reader then fails with ChangeStreamHistoryLost)."""
        for shard, position in zip(self._shards, self._next, strict=True):
            if position < shard.first_seq:
                return self.end_seq + 1
        return self._base

    def history_lost_before(self, key: int, *, event: bool = False) -> bool:
        """Whether any shard no longer has its entries from cluster time ``key`` on."""
        return any(shard.history_lost_before(key, event=event) for shard in self._shards)

    def seek(self, key: int, index: int = 0) -> int:
        """Start every shard at cluster time ``key``; the merged sequence number to read from.

        ``index`` (a ``txnOpIndex``) orders only the events of its own shard's transaction: every
        shard starts at the time itself, and the cursor swallows what sorts before its token.
        """
        if self._merged:
            raise RuntimeError("a merged oplog is positioned once, before it is read")
        self._next = [shard.seek(key) for shard in self._shards]
        return self.end_seq

    def view(self) -> tuple[list[OplogRecord], int]:
        """``(records, base)`` as :meth:`Oplog.view` gives them, after merging what every shard
        logged up to the new frontier."""
        frontier = self._frontier = self._gossip()
        runs: list[list[OplogRecord]] = []
        for position, shard in enumerate(self._shards):
            start = self._next[position]
            if start < shard.first_seq:
                continue  # lost: first_seq says so to the reader
            records, base = shard.view()
            stop = bisect_right(records, frontier, lo=start - base, key=_cluster_time)
            if stop > start - base:
                runs.append(records[start - base : stop])
                self._next[position] = base + stop
        if len(runs) == 1:
            self._merged.extend(runs[0])
        elif runs:
            self._merged.extend(heapq.merge(*runs, key=_TokenOrder))
        return self._merged, self._base

    def release(self, seq: int) -> None:
        """The reader is done with the merged records before ``seq``: let them go."""
        done = seq - self._base
        if done > _COMPACT_AFTER and done * 2 > len(self._merged):
            del self._merged[:done]
            self._base = seq

    async def wait(self, timeout: float) -> None:
        """Return after the next append to any shard's oplog, or after ``timeout`` seconds."""
        await wait_for_appends(self._shards, timeout)

    def wake_all(self) -> None:
        for shard in self._shards:
            shard.wake_all()


def _cluster_time(record: OplogRecord) -> int:
    return record.key


class _TokenOrder:
    """Orders records as their resume tokens sort: by cluster time, then (only between shards
    whose records share a cluster time) by the token's bytes."""

    __slots__ = ("record",)

    def __init__(self, record: OplogRecord) -> None:
        self.record = record

    def __lt__(self, other: _TokenOrder) -> bool:
        mine, theirs = self.record, other.record
        if mine.key != theirs.key:
            return mine.key < theirs.key
        return mine.data() < theirs.data()


__all__ = ["MergedOplog"]
