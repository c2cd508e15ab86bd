"""Per-stream state as the connector reports it through ``Connector.status()``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from flowwarden.checkpoints.model import SnapshotProgress


class StreamState(str, enum.Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    STANDBY = "STANDBY"
    STOPPING = "STOPPING"
    """A stop was asked for: no new reads; handlers in flight finish, then the checkpoint is saved."""
    STOPPED = "STOPPED"
    """Stopped on request, or by an invalidate (then ``Connector.stream_errors()`` names it)."""
    FAILED = "FAILED"


@dataclass(frozen=True)
class StreamStatus:
    """A snapshot of one stream; cheap to build, safe to hand to another thread."""

    name: str
    state: StreamState
    last_processed_time: datetime | None
    last_seen_time: datetime | None
    lag_seconds: float | None
    events_processed: int
    events_failed: int
    restarts: int
    last_error: str | None
    reason: str | None
    events_waiting: int = 0
    """Events read from the stream and not yet handed to a method: read ahead, and gathered in
    the batch being formed while the one before it is in flight."""
    snapshot: SnapshotProgress | None = None
    """The initial snapshot's progress (``copied``, ``total`` estimate, ``done``), for streams
    with ``snapshot`` other than NEVER once they loaded or began one."""
    save_failures_in_row: int = 0
    """Checkpoint writes that failed since the last one that succeeded, across re-opens."""
    last_save_error: str | None = None
    """The last failed checkpoint write's error on one line, MongoDB URIs redacted; None once a
    write succeeded."""
    cannot_save_since: datetime | None = None
    """When the stream stopped getting its checkpoint saved: when the first failed or still
    unanswered write since the last successful one began. Set once that lasted
    ``SAVE_GRACE_SECONDS`` (10 s), None while writes get through; ``/readyz`` answers 503
    meanwhile."""

    @property
    def save_problem(self) -> str | None:
        """Why the stream cannot save, on one line (for ``/readyz`` and the progress line), or
        None while it can."""
        since = self.cannot_save_since
        if since is None:
            return None
        when = since.isoformat(timespec="seconds")
        if self.save_failures_in_row == 0:
            return f"cannot save its checkpoint since {when}: the checkpoint store has not answered"
        count = self.save_failures_in_row
        failed = "1 failed save" if count == 1 else f"{count} failed saves"
        return f"cannot save its checkpoint since {when}: {failed} in a row, the last: {self.last_save_error}"
