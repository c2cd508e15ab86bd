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
