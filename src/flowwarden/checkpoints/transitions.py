"""The store rules as pure functions over checkpoint values.

Stores that hold their records in this process (memory, file) run these under their own lock;
the MongoDB stores express the same rules as one conditional update. Keeping the rules in one
place is what makes those stores agree with the contract suite. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from flowwarden.checkpoints.model import Checkpoint, IncrementalProgress, SaveResult, SnapshotProgress
from flowwarden.errors import FencedError
from flowwarden.events import ResumeToken, token_data


def require_processed_token(checkpoint: Checkpoint) -> str:
    """The normalised ``_data`` of the checkpoint's processed token; ValueError when it has none."""
    if checkpoint.last_processed_token is None:
        raise ValueError(
            f"stream {checkpoint.stream_id!r}: save() needs last_processed_token; "
            "use save_seen() for a seen token or rewind() to clear a position"
        )
    return token_data(checkpoint.last_processed_token)


def check_epoch(current: Checkpoint | None, stream_id: str, epoch: int) -> None:
    """Raise FencedError when the stored epoch is higher than ``epoch``."""
    if current is not None and current.epoch > epoch:
        raise FencedError(stream_id, epoch=epoch, stored_epoch=current.epoch)


def is_newer(token: ResumeToken, stored: ResumeToken | None) -> bool:
    return stored is None or token_data(token) > token_data(stored)


def apply_save(
    current: Checkpoint | None, checkpoint: Checkpoint, now: datetime
) -> tuple[SaveResult, Checkpoint]:
    """The record after ``save(checkpoint)``, and whether it changed.

    Fencing is checked before the position, so a stale owner learns it is fenced even when its
    position happens to be old too.
    """
    require_processed_token(checkpoint)
    assert checkpoint.last_processed_token is not None
    check_epoch(current, checkpoint.stream_id, checkpoint.epoch)
    stored_token = None if current is None else current.last_processed_token
    if not is_newer(checkpoint.last_processed_token, stored_token):
        assert current is not None
        return SaveResult.IGNORED, current
    return SaveResult.STORED, Checkpoint(
        stream_id=checkpoint.stream_id,
        instance_id=checkpoint.instance_id,
        instance_token=checkpoint.instance_token,
        last_processed_token=checkpoint.last_processed_token,
        last_processed_at=checkpoint.last_processed_at,
        last_seen_token=None if current is None else current.last_seen_token,
        last_seen_at=None if current is None else current.last_seen_at,
        events_processed=checkpoint.events_processed,
        epoch=checkpoint.epoch,
        updated_at=now,
        metadata=checkpoint.metadata,
        batch_end_token=None if current is None else current.batch_end_token,
        snapshot=None if current is None else current.snapshot,
        incremental_snapshot=None if current is None else current.incremental_snapshot,
    )


def apply_save_snapshot(
    current: Checkpoint | None, stream_id: str, progress: SnapshotProgress, epoch: int, now: datetime
) -> tuple[SaveResult, Checkpoint]:
    """The record after ``save_snapshot(stream_id, progress, epoch)``, and whether it changed.

    Progress of the snapshot already stored (same token) only moves forward (a higher
    :attr:`~SnapshotProgress.order`); progress of another snapshot replaces it.
    """
    token_data(progress.token)
    check_epoch(current, stream_id, epoch)
    changed: dict[str, Any] = {"snapshot": progress, "epoch": epoch, "updated_at": now}
    if current is None:
        return SaveResult.STORED, Checkpoint(stream_id=stream_id, **changed)
    stored = current.snapshot
    if (
        stored is not None
        and token_data(stored.token) == token_data(progress.token)
        and stored.order >= progress.order
    ):
        return SaveResult.IGNORED, current
    return SaveResult.STORED, replace(current, **changed)


def apply_save_incremental(
    current: Checkpoint | None, stream_id: str, progress: IncrementalProgress, epoch: int, now: datetime
) -> tuple[SaveResult, Checkpoint]:
    """The record after ``save_incremental(stream_id, progress, epoch)``, and whether it changed.

    Progress of the request already stored (same ``progress.request``) only moves forward (a
    higher :attr:`~IncrementalProgress.order`); progress of another request replaces it.
    """
    check_epoch(current, stream_id, epoch)
    changed: dict[str, Any] = {"incremental_snapshot": progress, "epoch": epoch, "updated_at": now}
    if current is None:
        return SaveResult.STORED, Checkpoint(stream_id=stream_id, **changed)
    stored = current.incremental_snapshot
    if stored is not None and stored.request == progress.request and stored.order >= progress.order:
        return SaveResult.IGNORED, current
    return SaveResult.STORED, replace(current, **changed)


def apply_save_seen(
    current: Checkpoint | None, stream_id: str, token: ResumeToken, epoch: int, now: datetime
) -> tuple[SaveResult, Checkpoint]:
    """The record after ``save_seen(stream_id, token, epoch)``, and whether it changed."""
    # last_seen_at=None: the new record derives it from the new token.
    return _advance(current, stream_id, token, epoch, now, "last_seen_token", last_seen_at=None)


def apply_save_batch_end(
    current: Checkpoint | None, stream_id: str, token: ResumeToken, epoch: int, now: datetime
) -> tuple[SaveResult, Checkpoint]:
    """The record after ``save_batch_end(stream_id, token, epoch)``, and whether it changed."""
    return _advance(current, stream_id, token, epoch, now, "batch_end_token")


def _advance(
    current: Checkpoint | None,
    stream_id: str,
    token: ResumeToken,
    epoch: int,
    now: datetime,
    slot: str,
    **also: Any,
) -> tuple[SaveResult, Checkpoint]:
    """Move one forward-only token slot (creating the record if missing), fenced by ``epoch``."""
    token_data(token)
    check_epoch(current, stream_id, epoch)
    changed: dict[str, Any] = {slot: dict(token), "epoch": epoch, "updated_at": now}
    if current is None:
        return SaveResult.STORED, Checkpoint(stream_id=stream_id, **changed)
    if not is_newer(token, getattr(current, slot)):
        return SaveResult.IGNORED, current
    return SaveResult.STORED, replace(current, **changed, **also)


def apply_rewind(
    current: Checkpoint | None, stream_id: str, token: ResumeToken | None, now: datetime
) -> Checkpoint | None:
    """The record after ``rewind(stream_id, token)``; None when there is still no record.

    A rewind also forgets the batch end (the batch it ended is not the next one any more) and
    the initial snapshot's progress: the stream goes on from the position it was rewound to.
    An incremental snapshot's progress is kept: it is not tied to a position.
    """
    if token is not None:
        token_data(token)
    if current is None:
        if token is None:
            return None
        return Checkpoint(stream_id=stream_id, last_processed_token=dict(token), updated_at=now)
    return replace(
        current,
        last_processed_token=None if token is None else dict(token),
        last_processed_at=None,
        last_seen_token=None,
        last_seen_at=None,
        batch_end_token=None,
        snapshot=None,
        updated_at=now,
    )


__all__ = [
    "apply_rewind",
    "apply_save",
    "apply_save_batch_end",
    "apply_save_incremental",
    "apply_save_seen",
    "apply_save_snapshot",
    "check_epoch",
    "is_newer",
    "require_processed_token",
]
