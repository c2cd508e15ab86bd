"""How a running connector is seen from outside: metrics and probes, progress lines, the oplog window.

Started by :class:`~flowwarden.runtime.connector.Connector` when it runs:

- with a metrics port, a :class:`~flowwarden.runtime.metrics.MetricsServer` (``/metrics``,
  ``/healthz``, ``/readyz``), a heartbeat that ``/healthz`` reads (so a handler holding the event
  loop shows as unhealthy), and the oplog's window in hours, read once a minute where the
  deployment lets it be read (through a mongos, on every shard: see
  :func:`~flowwarden.mongo.positions.oplog_edge_async`);
- with a progress interval, one INFO line per stream per interval: events per second, seconds
  behind, and the position saved last; while the initial snapshot copies, the documents copied of
  the estimate, per second, and the time left instead; a WARNING line, saying why, while the
  stream cannot save its checkpoint. Rates are never negative: a stream re-opened since the last
  line is measured from the re-open (its count restarts from its checkpoint's).

A stream is ready when it is RUNNING and its checkpoint saves get through (see
:mod:`~flowwarden.runtime.save_health`): a stream that handles events it cannot save is not. A
bucket standing by because another member of its fleet runs it is ready too: it is not this
instance's to run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pymongo.errors import PyMongoError

from flowwarden.errors import ConfigurationError
from flowwarden.mongo.positions import oplog_window_async
from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.metrics import STALL_SECONDS, MetricsServer
from flowwarden.runtime.status import StreamState, StreamStatus

if TYPE_CHECKING:
    from flowwarden.runtime.stream import StreamRunner

log = logging.getLogger(__name__)

OPLOG_WINDOW_REFRESH_SECONDS = 60.0
_BEAT_SECONDS = 1.0


class Observability:
    """One connector's metrics endpoint, heartbeat, oplog window and progress lines."""

    def __init__(
        self,
        runners: Callable[[], list[StreamRunner]],
        *,
        metrics_host: str,
        metrics_port: int | None,
        progress_interval: float,
    ) -> None:
        self._runners = runners
        self.metrics_host = metrics_host
        self.metrics_port = metrics_port
        self.progress_interval = progress_interval
        self.oplog_window_hours: float | None = None
        self._beat = time.monotonic()
        self._server: MetricsServer | None = None

    @property
    def exports_metrics(self) -> bool:
        return self.metrics_port is not None

    @property
    def address(self) -> tuple[str, int] | None:
        """Where ``/metrics`` is served (the port chosen when 0 was asked for), or None."""
        server = self._server
        return (str(server.host), int(server.port)) if server is not None else None

    def serve(self) -> None:
        """Start the HTTP server; a port that cannot be bound is a ConfigurationError."""
        if self.metrics_port is None:
            return
        try:
            self._server = MetricsServer(
                self.metrics_host, self.metrics_port, alive=self.alive, not_ready=self.not_ready
            )
        except OSError as error:
            reason = error.strerror or error
            raise ConfigurationError(
                f"cannot serve metrics on {self.metrics_host}:{self.metrics_port} ({reason}); "
                "choose another port, or stop the process that holds it",
                owner="Connector",
                option="metrics_port",
                value=self.metrics_port,
            ) from None
        log.info("metrics, /healthz and /readyz served on http://%s:%s", *self._server_address())

    def _server_address(self) -> tuple[Any, Any]:
        assert self._server is not None
        return self._server.host, self._server.port

    async def run(self, client: Any) -> None:
        """The tasks behind the probes and the progress lines; cancelled when the connector ends."""
        tasks = [asyncio.create_task(self._heartbeat(), name="flowwarden-heartbeat")]
        if self.exports_metrics:
            tasks.append(asyncio.create_task(self._oplog_window(client), name="flowwarden-oplog-window"))
        if self.progress_interval > 0:
            tasks.append(asyncio.create_task(self._progress(), name="flowwarden-progress"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- probes ----------------------------------------------------------------------------------

    def alive(self) -> bool:
        """The event loop turned within the last STALL_SECONDS (called from the server's thread)."""
        return time.monotonic() - self._beat < STALL_SECONDS

    def not_ready(self) -> dict[str, str]:
        """Each stream that is not RUNNING (unless another member of its fleet runs it), or cannot
        save its checkpoint, with its state and why it cannot save (called from the server's
        thread)."""
        runners = self._runners()
        if not runners:
            return {"connector": "STARTING"}
        waiting = {}
        for runner in runners:
            status = runner.status()
            problem = status.save_problem
            if problem is not None:
                waiting[runner.name] = f"{status.state.value}: {problem}"
            elif status.state != StreamState.RUNNING and not status.runs_elsewhere:
                waiting[runner.name] = status.state.value
        return waiting

    async def _heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(_BEAT_SECONDS)

    async def _oplog_window(self, client: Any) -> None:
        while True:
            try:
                oldest, newest = await oplog_window_async(client)
            except PyMongoError as error:
                # The deployment out of reach for now: the last window read stays, and this task
                # must not end, since the heartbeat and the progress lines end with it.
                log.warning(
                    "cannot read the oplog window (%s: %s); reading it again in %.0f s",
                    type(error).__name__,
                    error,
                    OPLOG_WINDOW_REFRESH_SECONDS,
                )
            else:
                if oldest is not None and newest is not None:
                    self.oplog_window_hours = (newest.time - oldest.time) / 3600
            await asyncio.sleep(OPLOG_WINDOW_REFRESH_SECONDS)

    # -- progress lines --------------------------------------------------------------------------

    async def _progress(self) -> None:
        marks: dict[str, ProgressMark] = {}
        # Between lines a stream seen for the first time, or whose copy has just begun, is marked
        # within a second, so that its first line's rates cover nearly the whole interval.
        tick = min(self.progress_interval, _MARK_SECONDS)
        next_line = time.monotonic() + self.progress_interval
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            due = now >= next_line
            for runner in self._runners():
                status = runner.status()
                mark = marks.get(runner.name)
                if due:
                    level, message = progress_line(status, mark, now, runner.opened, runner.saved_position)
                    stream_logger(__name__, runner.name).log(level, "%s", message)
                elif mark is not None and (mark.copied is not None or not copying(status)):
                    continue
                marks[runner.name] = ProgressMark.of(status, now)
            if due:
                next_line = now + self.progress_interval


_MARK_SECONDS = 1.0


@dataclass(frozen=True)
class ProgressMark:
    """Where a stream's counts stood at ``at`` (``time.monotonic()``): the next progress line's
    rates are measured from here."""

    at: float
    events: int
    copied: int | None
    """Documents the initial snapshot had copied; None while no copy ran."""

    @classmethod
    def of(cls, status: StreamStatus, now: float) -> ProgressMark:
        snapshot = status.snapshot
        copied = snapshot.copied if snapshot is not None and not snapshot.done else None
        return cls(now, status.events_processed, copied)


def copying(status: StreamStatus) -> bool:
    """Whether the stream is copying its existing documents (its initial snapshot runs)."""
    return status.snapshot is not None and not status.snapshot.done


def rates(
    mark: ProgressMark | None, now: float, status: StreamStatus, opened: tuple[float, int] | None
) -> tuple[float, float | None]:
    """Events handled per second and documents copied per second since ``mark``; never negative.

    A stream re-opened since the mark counts its events again from its checkpoint's count (which
    is lower than the count before), so its rate is measured from the re-open (``opened``: when,
    and the count then). The copy rate is None without a mark taken during the same copy.
    """
    if opened is not None and (mark is None or opened[0] > mark.at):
        began, before = opened
    elif mark is not None:
        began, before = mark.at, mark.events
    else:
        began, before = now, status.events_processed
    events = max(0.0, (status.events_processed - before) / (now - began)) if now > began else 0.0
    copied = None
    snapshot = status.snapshot
    if (
        snapshot is not None
        and copying(status)
        and mark is not None
        and mark.copied is not None
        and mark.copied <= snapshot.copied
        and now > mark.at
    ):
        copied = (snapshot.copied - mark.copied) / (now - mark.at)
    return events, copied


def progress_line(
    status: StreamStatus,
    mark: ProgressMark | None,
    now: float,
    opened: tuple[float, int] | None,
    saved_position: Callable[[], str],
) -> tuple[int, str]:
    """A stream's progress line and its level (WARNING while the stream cannot save)."""
    events_rate, copy_rate = rates(mark, now, status, opened)
    problem = status.save_problem
    level = logging.INFO if problem is None else logging.WARNING
    suffix = "" if problem is None else f"; {problem}"
    snapshot = status.snapshot
    if snapshot is not None and copying(status):
        copy = copy_progress(snapshot.copied, snapshot.total, copy_rate)
        return level, f"stream {status.name}: {copy}{suffix}"
    behind = f"{status.lag_seconds:.1f} s behind" if status.lag_seconds is not None else "not running"
    return level, (
        f"stream {status.name}: {status.state.value}, {events_rate:.0f} events/s, "
        f"{status.events_processed} handled in all, {behind}; saved at {saved_position()}{suffix}"
    )


def copy_progress(copied: int, total: int | None, rate: float | None) -> str:
    """The initial snapshot's progress in words: copied of the estimate, the rate, time left."""
    parts = ["copying the existing documents (initial snapshot)"]
    if total is not None and total >= copied and total > 0:
        parts.append(f"{copied:,} of about {total:,} copied ({copied * 100 // total}%)")
    else:
        parts.append(f"{copied:,} copied")
    if rate is not None:
        parts.append(f"{rate:,.0f} documents/s")
        if rate > 0 and total is not None and total > copied:
            parts.append(f"about {duration((total - copied) / rate)} left")
    return ", ".join(parts) + "; the change stream opens once the copy is done"


def duration(seconds: float) -> str:
    """``seconds`` for a person: "45 s", "3 min 20 s", "2 h 5 min"."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


__all__ = [
    "OPLOG_WINDOW_REFRESH_SECONDS",
    "Observability",
    "ProgressMark",
    "copy_progress",
    "duration",
    "progress_line",
    "rates",
]
