"""A checkpoint store in process memory, for tests and for streams that may restart from scratch.

Everything is lost with the process. It keeps every rule of the store SPI (fencing, no regress,
atomic writes under one lock), so code tested against it behaves the same on a durable store.
"""

from __future__ import annotations

import builtins
import copy
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import ClassVar

from flowwarden.checkpoints.model import (
    Checkpoint,
    IncrementalProgress,
    SaveResult,
    SnapshotProgress,
    utc_now,
)
from flowwarden.checkpoints.transitions import (
    apply_rewind,
    apply_save,
    apply_save_batch_end,
    apply_save_incremental,
    apply_save_seen,
    apply_save_snapshot,
)
from flowwarden.events import ResumeToken


def _detached(checkpoint: Checkpoint) -> Checkpoint:
    # Metadata may hold nested containers; a deep copy keeps callers from editing the store.
    return replace(checkpoint, metadata=copy.deepcopy(checkpoint.metadata))


class InMemoryCheckpointStore:
    """A :class:`~flowwarden.checkpoints.CheckpointStore` backed by a dict; thread-safe.

    Its calls never block on I/O (``nonblocking = True``), so the committer calls it inline
    rather than through a worker thread.
    """

    nonblocking: ClassVar[bool] = True

    def __init__(self) -> None:
        self._records: dict[str, Checkpoint] = {}
        self._lock = threading.Lock()

    def load(self, stream_id: str) -> Checkpoint | None:
        with self._lock:
            record = self._records.get(stream_id)
        return None if record is None else _detached(record)

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        incoming = _detached(checkpoint)
        return self._apply(checkpoint.stream_id, lambda current, now: apply_save(current, incoming, now))

    def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return self._apply(
            stream_id, lambda current, now: apply_save_seen(current, stream_id, token, epoch, now)
        )

    def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return self._apply(
            stream_id, lambda current, now: apply_save_batch_end(current, stream_id, token, epoch, now)
        )

    def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        return self._apply(
            stream_id, lambda current, now: apply_save_snapshot(current, stream_id, progress, epoch, now)
        )

    def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult:
        return self._apply(
            stream_id, lambda current, now: apply_save_incremental(current, stream_id, progress, epoch, now)
        )

    def _apply(
        self, stream_id: str, change: Callable[[Checkpoint | None, datetime], tuple[SaveResult, Checkpoint]]
    ) -> SaveResult:
        """One transition of :mod:`~flowwarden.checkpoints.transitions` under the lock."""
        with self._lock:
            result, record = change(self._records.get(stream_id), utc_now())
            if result is SaveResult.STORED:
                self._records[stream_id] = record
        return result

    def delete(self, stream_id: str) -> bool:
        with self._lock:
            return self._records.pop(stream_id, None) is not None

    def list(self) -> builtins.list[Checkpoint]:
        with self._lock:
            records = sorted(self._records.values(), key=lambda c: c.stream_id)
        return [_detached(record) for record in records]

    def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        with self._lock:
            record = apply_rewind(self._records.get(stream_id), stream_id, token, utc_now())
            if record is not None:
                self._records[stream_id] = record

    def __repr__(self) -> str:
        return f"InMemoryCheckpointStore({len(self._records)} streams)"


__all__ = ["InMemoryCheckpointStore"]
