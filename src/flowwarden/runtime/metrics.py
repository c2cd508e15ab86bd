"""What the connector tells Prometheus, and its health probes.

Each stream counts into a :class:`StreamMetrics`: plain integers and bucket lists that only the
stream's event loop writes, so counting costs the hot path a dict update and no lock. A
scrape reads them (and the streams' status) from the HTTP server's thread through one collector
registered in ``prometheus_client.REGISTRY``; handler code adds its own metrics to that same
registry (``prometheus_client.Counter(...)`` registers there by default) and they are served
beside flowwarden's.

:class:`MetricsServer` serves, on 127.0.0.1 unless told otherwise:

- ``/metrics``: the registry in the Prometheus text format;
- ``/healthz``: 200 while the connector's event loop turns (a handler holding the loop makes it
  fail), 503 otherwise;
- ``/readyz``: 200 when every stream is RUNNING and can save its checkpoint, else 503 with a JSON
  body naming the streams that are not ready: their state, and why one cannot save.

Every flowwarden metric is named ``flowwarden_*`` and labelled by ``stream``, except the oplog
window, which is the deployment's.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, Protocol

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from flowwarden.runtime.status import StreamState, StreamStatus

# Seconds: a sync handler's call takes microseconds, a DataFrame batch's seconds.
DURATION_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
BATCH_BUCKETS = (1, 10, 100, 1000, 10_000, 100_000)
SAVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
OUTCOMES = ("ok", "retried", "skipped", "dead_lettered", "failed", "filtered")
# /healthz fails when the event loop has not turned for this long.
STALL_SECONDS = 10.0
# The metrics server's bounds (see MetricsServer): connects waiting to be accepted, seconds a
# connection may take for its request and answer, connections open at once, threads building
# answers, and the size of a request's head.
LISTEN_BACKLOG = 256
CONNECTION_TIMEOUT_SECONDS = 10.0
MAX_CONNECTIONS = 256
ANSWER_THREADS = 2
MAX_REQUEST_BYTES = 16 * 1024


class Buckets:
    """A histogram's state: counts per upper bound (the last one +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Once per handler call, so the count is not kept: it is the sum of the buckets.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        buckets, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        return buckets


class StreamMetrics:
    """One stream's counters and histograms; written only on the stream's event loop."""

    def __init__(self) -> None:
        self.ok: dict[str, int] = {}
        """operation type -> events handled on the first call (the hot path counts here)."""
        self.events: dict[tuple[str, str], int] = {}
        """(operation type, outcome) -> events, for every outcome but "ok"."""
        self.handler_seconds = Buckets(DURATION_BUCKETS)
        self.batch_events = Buckets(BATCH_BUCKETS)
        self.save_seconds = Buckets(SAVE_BUCKETS)
        self.saves = 0
        self.save_failures = 0
        self.dead_letters = 0

    def handled(self, operation: str, outcome: str, count: int = 1) -> None:
        if outcome == "ok":
            self.ok[operation] = self.ok.get(operation, 0) + count
        else:
            key = (operation, outcome)
            self.events[key] = self.events.get(key, 0) + count

    def outcomes(self) -> dict[tuple[str, str], int]:
        """(operation type, outcome) -> events, every outcome together."""
        return {**{(operation, "ok"): n for operation, n in self.ok.items()}, **self.events}

    def saved(self, seconds: float) -> None:
        self.saves += 1
        self.save_seconds.observe(seconds)

    def save_failed(self) -> None:
        self.save_failures += 1


# What each metric counts, in the words of docs/operations.md's metrics table (a test holds
# the two equal): the HELP text a scraper shows beside the series.
HELP: dict[str, str] = {
    "flowwarden_events": (
        "Events handled, by operation type and outcome: ok, retried (succeeded after a retry), skipped, "
        "dead_lettered, failed, filtered (left out by the @event_filter); snapshot rows (initial or "
        "requested) count under the operation snapshot."
    ),
    "flowwarden_handler_duration_seconds": (
        "Seconds one handler call took (a batch method's call for batches); each attempt of a retried "
        "event or batch is a call."
    ),
    "flowwarden_batch_events": (
        "Events per batch handed to @on_batch/@on_dataframe, once per batch however many attempts it took."
    ),
    "flowwarden_checkpoint_saves": (
        "Writes of the stream's position to the checkpoint store (lastProcessed, lastSeen, a batch's end) "
        "that succeeded; the initial snapshot's progress writes are not counted."
    ),
    "flowwarden_checkpoint_save_failures": (
        "Writes of the stream's position to the checkpoint store that failed (each is tried again at the "
        "next save)."
    ),
    "flowwarden_checkpoint_save_duration_seconds": (
        "Seconds one write of the stream's position to the checkpoint store took, for the writes that "
        "succeeded."
    ),
    "flowwarden_checkpoint_save_failures_in_row": (
        "Checkpoint writes that failed since the last one that succeeded (across re-opens)."
    ),
    "flowwarden_checkpoint_save_failing_seconds": (
        "Seconds since the first failed or unanswered checkpoint write after the last successful one "
        "began, while the stream cannot save (/readyz fails); 0 otherwise."
    ),
    "flowwarden_seconds_behind": (
        "Now minus the cluster time of the newest event handled with nothing unfinished before it "
        "(lastProcessed)."
    ),
    "flowwarden_seen_seconds_behind": "Now minus the cluster time of the last seen position (lastSeen).",
    "flowwarden_restarts": "Re-opens after errors.",
    "flowwarden_stream_state": (
        "1 for the stream's current state (STARTING, RUNNING, RESTARTING, STANDBY, STOPPING, STOPPED, "
        "FAILED), 0 for the others."
    ),
    "flowwarden_lease_held": (
        "1 while this instance holds the stream's single-leader lease; for a partitioned stream, per "
        "bucket, so the processes' series together show which one runs which bucket."
    ),
    "flowwarden_dead_letters": "Events written to the dead-letter collection.",
    "flowwarden_snapshot_documents_copied": (
        "Documents the initial snapshot copied so far: those of every chunk the methods finished, as its "
        "checkpoint holds them (streams with snapshot)."
    ),
    "flowwarden_snapshot_documents_estimated": (
        "Documents the initial snapshot was to copy, estimated when it began."
    ),
    "flowwarden_snapshot_done": "1 once the initial snapshot was copied.",
    "flowwarden_snapshot_requested_documents_copied": (
        "Rows the newest incremental snapshot (flowwarden snapshot request) handed over, in the chunks "
        "the methods finished."
    ),
    "flowwarden_snapshot_requested_documents_dropped": (
        "Rows the newest incremental snapshot left out because their document changed while their chunk "
        "was read (the change was delivered instead)."
    ),
    "flowwarden_snapshot_requested_documents_estimated": (
        "Documents the newest incremental snapshot was to copy, estimated when it began."
    ),
    "flowwarden_snapshot_requested_running": (
        "1 while the newest incremental snapshot copies, 0 once it is done or cancelled."
    ),
    "flowwarden_oplog_window_hours": (
        "Hours between the oldest and the newest oplog entry, where the user may read local.oplog.rs; "
        "read at start and once a minute (while the deployment is out of reach, the last window read "
        "stays)."
    ),
}


def _family(cls: Any, name: str, labels: list[str] | None = None) -> Any:
    """The metric family ``name`` of type ``cls``, with its HELP text."""
    return cls(name, HELP[name], labels=labels)


class FlowwardenCollector:
    """The one collector of this process's connectors (registered once in REGISTRY)."""

    def __init__(self) -> None:
        self._connectors: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, connector: Any) -> None:
        self._connectors.add(connector)

    def discard(self, connector: Any) -> None:
        self._connectors.discard(connector)

    def describe(self) -> Iterable[Metric]:
        return []  # names come and go with connectors; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        runners: list[MeasuredStream] = [r for c in list(self._connectors) for r in c.runners()]
        oplog_hours = [h for c in list(self._connectors) if (h := c.oplog_window_hours) is not None]
        yield from _families(runners)
        if oplog_hours:
            window = _family(GaugeMetricFamily, "flowwarden_oplog_window_hours")
            window.add_metric([], oplog_hours[-1])
            yield window


class MeasuredStream(Protocol):
    """What the metrics read of a running stream (the runtime's StreamRunner)."""

    @property
    def name(self) -> str: ...

    @property
    def metrics(self) -> StreamMetrics | None: ...

    @property
    def holds_lease(self) -> bool: ...

    def status(self) -> StreamStatus: ...


def _families(runners: list[MeasuredStream]) -> Iterator[Metric]:
    events = _family(CounterMetricFamily, "flowwarden_events", ["stream", "operation", "outcome"])
    durations = _family(HistogramMetricFamily, "flowwarden_handler_duration_seconds", ["stream"])
    batches = _family(HistogramMetricFamily, "flowwarden_batch_events", ["stream"])
    saves = _family(CounterMetricFamily, "flowwarden_checkpoint_saves", ["stream"])
    failures = _family(CounterMetricFamily, "flowwarden_checkpoint_save_failures", ["stream"])
    save_seconds = _family(HistogramMetricFamily, "flowwarden_checkpoint_save_duration_seconds", ["stream"])
    failures_in_row = _family(GaugeMetricFamily, "flowwarden_checkpoint_save_failures_in_row", ["stream"])
    cannot_save = _family(GaugeMetricFamily, "flowwarden_checkpoint_save_failing_seconds", ["stream"])
    behind = _family(GaugeMetricFamily, "flowwarden_seconds_behind", ["stream"])
    seen_behind = _family(GaugeMetricFamily, "flowwarden_seen_seconds_behind", ["stream"])
    restarts = _family(CounterMetricFamily, "flowwarden_restarts", ["stream"])
    state = _family(GaugeMetricFamily, "flowwarden_stream_state", ["stream", "state"])
    lease = _family(GaugeMetricFamily, "flowwarden_lease_held", ["stream"])
    dead_letters = _family(CounterMetricFamily, "flowwarden_dead_letters", ["stream"])
    snapshot_copied = _family(GaugeMetricFamily, "flowwarden_snapshot_documents_copied", ["stream"])
    snapshot_total = _family(GaugeMetricFamily, "flowwarden_snapshot_documents_estimated", ["stream"])
    snapshot_done = _family(GaugeMetricFamily, "flowwarden_snapshot_done", ["stream"])
    requested_copied = _family(
        GaugeMetricFamily, "flowwarden_snapshot_requested_documents_copied", ["stream", "request"]
    )
    requested_dropped = _family(
        GaugeMetricFamily, "flowwarden_snapshot_requested_documents_dropped", ["stream", "request"]
    )
    requested_total = _family(
        GaugeMetricFamily, "flowwarden_snapshot_requested_documents_estimated", ["stream", "request"]
    )
    requested_running = _family(
        GaugeMetricFamily, "flowwarden_snapshot_requested_running", ["stream", "request"]
    )
    now = time.time()
    for runner in runners:
        name = runner.name
        metrics = runner.metrics
        if metrics is None:
            continue
        status = runner.status()
        for (operation, outcome), count in sorted(metrics.outcomes().items()):
            events.add_metric([name, operation, outcome], count)
        durations.add_metric([name], metrics.handler_seconds.cumulative(), metrics.handler_seconds.total)
        batches.add_metric([name], metrics.batch_events.cumulative(), metrics.batch_events.total)
        save_seconds.add_metric([name], metrics.save_seconds.cumulative(), metrics.save_seconds.total)
        saves.add_metric([name], metrics.saves)
        failures.add_metric([name], metrics.save_failures)
        failures_in_row.add_metric([name], status.save_failures_in_row)
        since = status.cannot_save_since
        cannot_save.add_metric([name], 0.0 if since is None else max(0.0, now - since.timestamp()))
        dead_letters.add_metric([name], metrics.dead_letters)
        restarts.add_metric([name], status.restarts)
        for each in StreamState:
            state.add_metric([name, each.value], 1.0 if status.state == each else 0.0)
        lease.add_metric([name], 1.0 if runner.holds_lease else 0.0)
        if status.snapshot is not None:
            snapshot_copied.add_metric([name], status.snapshot.copied)
            if status.snapshot.total is not None:
                snapshot_total.add_metric([name], status.snapshot.total)
            snapshot_done.add_metric([name], 1.0 if status.snapshot.done else 0.0)
        requested = status.incremental_snapshot
        if requested is not None:
            labels = [name, requested.request]
            requested_copied.add_metric(labels, requested.copied)
            requested_dropped.add_metric(labels, requested.dropped)
            if requested.total is not None:
                requested_total.add_metric(labels, requested.total)
            requested_running.add_metric(labels, 1.0 if requested.running else 0.0)
        if status.last_processed_time is not None:
            behind.add_metric([name], max(0.0, now - status.last_processed_time.timestamp()))
        if status.last_seen_time is not None:
            seen_behind.add_metric([name], max(0.0, now - status.last_seen_time.timestamp()))
    yield from (events, durations, batches, saves, failures, save_seconds, failures_in_row, cannot_save)
    yield from (behind, seen_behind)
    yield from (restarts, state, lease, dead_letters, snapshot_copied, snapshot_total, snapshot_done)
    yield from (requested_copied, requested_dropped, requested_total, requested_running)


COLLECTOR = FlowwardenCollector()
REGISTRY.register(COLLECTOR)


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` over HTTP, with a fixed number of threads.

    ``alive()`` says whether the connector's loop turns; ``not_ready()`` maps each stream that is
    not RUNNING to its state.

    Scrapers and idle or slow connections cannot grow the process: one thread runs an event loop
    that accepts connections and reads their requests (an open connection costs a coroutine, not
    a thread), and :data:`ANSWER_THREADS` threads build the answers. A connection whose request
    and answer are not through within :data:`CONNECTION_TIMEOUT_SECONDS` is closed; at most
    :data:`MAX_CONNECTIONS` are open, and a new one beyond that closes the oldest one still
    sending its request. The listen backlog (:data:`LISTEN_BACKLOG`) holds bursts of connects.
    Each connection carries one request (``Connection: close``), as HTTP/1.0 servers do.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        alive: Callable[[], bool],
        not_ready: Callable[[], Mapping[str, str]],
    ) -> None:
        self._alive = alive
        self._not_ready = not_ready
        self._socket = _listening_socket(host, port)  # OSError when the port is taken
        self.host, self.port = self._socket.getsockname()[:2]
        self._answers = ThreadPoolExecutor(ANSWER_THREADS, thread_name_prefix="flowwarden-metrics-answer")
        self._reading: dict[asyncio.StreamWriter, None] = {}  # oldest first: still sending a request
        self._open: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}  # each with its task
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None
        self._serving = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="flowwarden-metrics", daemon=True)
        self._thread.start()
        self._serving.wait()
        if self._failed is not None:
            self._socket.close()
            raise self._failed

    def close(self) -> None:
        if self._thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(5)
        self._answers.shutdown(wait=False, cancel_futures=True)
        self._socket.close()

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as error:  # before serving: the constructor raises it
            self._failed = error
        finally:
            self._serving.set()
            self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self._socket, limit=MAX_REQUEST_BYTES)
        self._serving.set()
        try:
            await self._stopped.wait()
        finally:
            server.close()
            # Every connection ends here, on this loop: one left pending would be finalised when
            # collected, after the loop closed.
            connections = list(self._open.items())
            for writer, task in connections:
                writer.transport.abort()
                task.cancel()
            await asyncio.gather(*(task for _, task in connections), return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS and self._reading:
            oldest = next(iter(self._reading))
            self._reading.pop(oldest)
            oldest.transport.abort()
        task = asyncio.current_task()
        assert task is not None  # start_server runs each connection as a task
        self._open[writer] = task
        self._reading[writer] = None
        try:
            await asyncio.wait_for(self._exchange(reader, writer), CONNECTION_TIMEOUT_SECONDS)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that went away, stalled or sent too much: nothing to answer
        except asyncio.CancelledError:
            pass  # the server is closing (_serve): the connection ends as any dropped one does
        finally:
            self._reading.pop(writer, None)
            self._open.pop(writer, None)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self._reading.pop(writer, None)
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.partition(" ")[0].split("?", 1)[0]
        loop = asyncio.get_running_loop()
        code, body, content_type = await loop.run_in_executor(self._answers, self._answer, method, path)
        headers = [
            f"HTTP/1.1 {code} {HTTPStatus(code).phrase}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(["Allow: GET, HEAD"] if code == HTTPStatus.METHOD_NOT_ALLOWED else []),
        ]
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            writer.write(body)
        await writer.drain()

    def _answer(self, method: str, path: str) -> tuple[int, bytes, str]:
        """(status, body, content type) of a request; called in one of the answer threads."""
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD are served here\n", text
        if path == "/metrics":
            return 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST
        if path == "/healthz":
            ok = self._alive()
            return (200, b"ok\n", text) if ok else (503, b"the event loop is not turning\n", text)
        if path == "/readyz":
            waiting = dict(self._not_ready())
            body = json.dumps({"ready": not waiting, "not_ready": waiting}).encode() + b"\n"
            return 503 if waiting else 200, body, "application/json"
        return 404, b"not found: /metrics, /healthz and /readyz are served here\n", text


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (an IPv4 address where the name has one)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = min(found, key=lambda info: info[0] != socket.AF_INET)
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(LISTEN_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


__all__ = [
    "COLLECTOR",
    "OUTCOMES",
    "STALL_SECONDS",
    "Buckets",
    "MetricsServer",
    "StreamMetrics",
]
