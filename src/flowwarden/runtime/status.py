"""Per-stream state as the connector reports it through ``Connector.status()``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from flowwarden.checkpoints.model import IncrementalProgress, SnapshotProgress


class StreamState(str, enum.Enum):
    """Where a stream is in its life, as ``StreamStatus.state`` reports it."""

    STARTING = "STARTING"
    """Loading its checkpoint, taking its lease, opening the change stream."""
    RUNNING = "RUNNING"
    """Reading events and handing them to the methods."""
    RESTARTING = "RESTARTING"
    """Waiting its backoff before re-opening from the checkpoint after an error (``last_error``)."""
    STANDBY = "STANDBY"
    """Not reading: with ``deployment="single_leader"``, another instance holds the lease, or the
    fleet sharing a partitioned stream gives this bucket to another member (``reason`` names it)."""
    STOPPING = "STOPPING"
    """A stop was asked for: no new reads; handlers in flight finish, then the checkpoint is saved."""
    STOPPED = "STOPPED"
    """Stopped on request, or by an invalidate (then ``Connector.stream_errors()`` names it)."""
    FAILED = "FAILED"
    """Ended by an error no re-open could fix, or after ``max_restarts``; ``last_error`` says which."""


@dataclass(frozen=True)
class StreamStatus:
    """A snapshot of one stream; cheap to build, safe to hand to another thread."""

    name: str
    """The stream's name (``@change_stream(name=...)``, else the class name), which keys its
    checkpoint."""
    state: StreamState
    """Where the stream is in its life."""
    last_processed_time: datetime | None
    """UTC cluster time of the newest event handled with no unhandled one before it: the
    position the checkpoint holds, or will hold at its next save. None before any."""
    last_seen_time: datetime | None
    """UTC cluster time of the newest position the server reported while nothing was in flight
    (idle, or every event filtered out). None before any."""
    lag_seconds: float | None
    """Seconds from the newer of the two times above to now, while RUNNING; None otherwise."""
    events_processed: int
    """Events whose handling finished since the stream started (events the ``@event_filter``
    left out included: their position moves on the same way)."""
    events_failed: int
    """Events whose handler used up its retries (stopped, skipped or dead-lettered) since the
    stream started."""
    restarts: int
    """Re-opens after errors since the stream started."""
    last_error: str | None
    """The last error the stream met, as ``"Type: message"``; None if there was none."""
    reason: str | None
    """Why the stream stopped, failed or stands by (who holds its lease), what a stream still
    opening after 30 seconds waits for, or to whom a bucket is being handed over; None otherwise."""
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
    incremental_snapshot: IncrementalProgress | None = None
    """The newest incremental snapshot's progress (``state``, ``copied``, ``dropped``, ``total``
    estimate), once the stream took a request (``flowwarden snapshot request``) or loaded one."""
    events_filtered: int = 0
    """Events (and initial-snapshot rows) the ``@event_filter`` left out since the stream
    started; their positions moved on as handled events' do, and ``events_processed`` counts
    the events among them."""
    inferred_schema: str | None = None
    """For ``@on_dataframe(schema="infer")``: the full-document schema the stream inferred when it
    started, as a Spark DDL field list; None otherwise, and until the sample was read."""
    lease_holder: str | None = None
    """With ``deployment="single_leader"``: the instance id of the connector holding the stream's
    lease (this one's while it runs the stream), as last read; None while nobody holds it."""
    lease_holder_token: str | None = None
    """The lease holder's instance token (``host:pid:random``), which tells apart processes given
    the same instance id."""
    runs_elsewhere: bool = False
    """STANDBY because another member of the fleet sharing a partitioned ``single_leader`` stream
    runs this bucket (holds its lease) or is given it: nothing for this instance to do, so
    ``/readyz`` counts the stream as ready."""

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
