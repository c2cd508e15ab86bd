"""The connector process: runs every handler class's stream, each in its own task.

One stream failing does not stop the others. A stop (SIGINT/SIGTERM under :meth:`Connector.run`,
or :meth:`Connector.stop`) stops reading, lets in-flight handlers finish, flushes checkpoints and
releases leases before returning. Under :meth:`Connector.run`, a second SIGINT/SIGTERM stops at
once (:class:`ForcedStop`): handlers still running are abandoned and their events stay
unprocessed, so the stored checkpoints remain before them and a restart handles them again.

The buckets of a partitioned ``single_leader`` stream are shared by every connector running it:
each connector is a member of the stream's fleet (:mod:`flowwarden.runtime.fleet`) for as long as
it runs, and leaves it when it stops.

:meth:`Connector.run` owns its process's event loop and signals, and, while it runs, keeps the
objects that were alive when it began out of the cyclic garbage collector's passes
(:func:`_heap_frozen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flowwarden.checkpoints.store import AwaitableStore, check_store
from flowwarden.config import DeadLetterOptions, Deployment, OnError, SchemaMode
from flowwarden.config.spec import partition_specs
from flowwarden.decorators import StreamSpec, stream_spec
from flowwarden.errors import ConfigurationError
from flowwarden.mongo.calls import maybe_await, run, run_async
from flowwarden.mongo.positions import reachable
from flowwarden.mongo.redaction import (
    redact_uri as redact_uri,  # re-exported: the runtime logs and exports it
)
from flowwarden.mongo.signals import (
    DEFAULT_CHECKPOINT_DATABASE,
    SIGNALS_COLLECTION,
    RequestProblem,
    insert_request,
    request_document,
    request_namespaces,
)
from flowwarden.runtime.connections import check_pool_size, client_pool_size, make_client, uri_pool_size
from flowwarden.runtime.dead_letter import DeadLetterWriter
from flowwarden.runtime.fleet import Fleet
from flowwarden.runtime.lease import LOCKS_COLLECTION, instance_token
from flowwarden.runtime.metrics import COLLECTOR, StreamMetrics
from flowwarden.runtime.observability import Observability
from flowwarden.runtime.preflight import check_dataframe_needs, check_handlers, check_hash_salts, check_names
from flowwarden.runtime.status import StreamState, StreamStatus
from flowwarden.runtime.stream import StreamRunner

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT_SECONDS = 2.0


class ForcedStop(SystemExit):
    """A second SIGINT/SIGTERM arrived while :meth:`Connector.run` was stopping: it stops at once.

    A ``SystemExit`` (code 130), so it leaves handler code and the event loop alike. Handlers
    still running are abandoned and nothing more is saved: each stream's stored checkpoint
    stays before the events they were handling. A handler stuck in a worker thread keeps that
    thread alive; the ``flowwarden`` command exits the process without waiting for it.
    """

    def __init__(self, signal_name: str) -> None:
        self.signal_name = signal_name
        super().__init__(130)


class Connector:
    """Consumes the change streams of decorated handler classes.

    ``uri_or_client``: a MongoDB URI, or a ``pymongo.AsyncMongoClient`` (or a motor client) that
    the connector uses as given; a client must be used on the event loop that runs the connector
    (:meth:`run_async`). Each stream holds one of the client's connections while it waits for
    events: a client made from the URI gets ``maxPoolSize`` = streams + 100 unless the URI sets
    one, and a ``maxPoolSize`` (the URI's or the client's) not larger than the number of streams
    is refused (see :mod:`flowwarden.runtime.connections`).

    ``checkpoint_store`` applies to every handler without its own ``@checkpoint(store=...)``; by
    default checkpoints live in ``_fw_checkpoints`` of the stream's database
    (``checkpoint_database`` for cluster streams).

    ``spark_master``, ``spark_app_name``, ``spark_conf`` and ``spark_log`` (where the JVM's
    output goes: a file, a logger, or None for this process's stderr; see
    :func:`~flowwarden.spark.session.get_or_create_session`) apply when the connector starts Spark
    for ``@on_dataframe`` handlers, which it does when ``spark`` is not given.

    ``metrics_port`` serves ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` on
    ``metrics_host`` (127.0.0.1 by default; 0 picks a free port, see :attr:`metrics_address`).
    ``progress_interval`` (seconds, 0 for none) logs one INFO progress line per stream.
    """

    def __init__(
        self,
        uri_or_client: Any,
        handlers: Iterable[type],
        *,
        instance_id: str | None = None,
        checkpoint_store: Any = None,
        checkpoint_database: str = DEFAULT_CHECKPOINT_DATABASE,
        spark: Any = None,
        spark_master: str = "local[*]",
        spark_app_name: str = "flowwarden",
        spark_conf: Mapping[str, str] | None = None,
        spark_log: str | Path | logging.Logger | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        progress_interval: float = 30.0,
    ) -> None:
        if isinstance(uri_or_client, str):
            self._uri: str | None = uri_or_client
            self._given_client = None
        else:
            _check_async_client(uri_or_client)
            self._uri = None
            self._given_client = uri_or_client
        classes = [stream_spec(h) for h in handlers]
        if not classes:
            raise ConfigurationError("needs at least one handler class", owner="Connector", option="handlers")
        self.specs: list[StreamSpec] = [part for spec in classes for part in partition_specs(spec)]
        """The streams run: one per handler class, or one per bucket of a partitioned class."""
        names = [s.name for s in self.specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(
                f"two handler classes share the stream name(s) {duplicates}; each stream needs its "
                "own name (it keys the checkpoint): set @change_stream(name=...)",
                owner="Connector",
                option="handlers",
            )
        check_handlers(classes)
        check_hash_salts(classes)
        check_names(instance_id, checkpoint_database)
        check_dataframe_needs(classes, spark_given=spark is not None, spark_master=spark_master)
        if self._given_client is not None:
            check_pool_size(client_pool_size(self._given_client), len(self.specs), given_client=True)
        else:
            check_pool_size(uri_pool_size(uri_or_client), len(self.specs), given_client=False)
        self.instance_id = instance_id or f"fw-{uuid.uuid4().hex[:12]}"
        self.instance_token = instance_token()
        """This connector's own name in leases and checkpoints (``host:pid:random``): unlike
        ``instance_id``, which is configured and may be shared, no other connector has it."""
        if checkpoint_store is not None:
            check_store(checkpoint_store, owner="Connector", option="checkpoint_store")
        self._checkpoint_store = checkpoint_store
        self._checkpoint_database = checkpoint_database
        self._spark = spark
        self._spark_master = spark_master
        self._spark_app_name = spark_app_name
        self._spark_conf = dict(spark_conf or {})
        self._spark_log = spark_log
        self._spark_lock = threading.Lock()
        self._runners: list[StreamRunner] = []
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._thread_error: BaseException | None = None
        self._stop_requested = False
        self._observability = Observability(
            self.runners,
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            progress_interval=progress_interval,
        )

    # ------------------------------------------------------------------------------------------
    # running

    def run(self) -> None:
        """Run until every stream ended or SIGINT/SIGTERM asks for a graceful stop.

        A second SIGINT/SIGTERM during the stop raises :class:`ForcedStop` at once. Signals are
        handled only when called from the main thread.
        """
        restore = self._handle_signals()
        try:
            with _own_loop() as loop, _heap_frozen():
                loop.run_until_complete(self.run_async())
        except ForcedStop as stop:
            log.error(
                "flowwarden connector %s: %s again, stopped at once; handlers still running were "
                "abandoned and their events are handled again after a restart",
                self.instance_id,
                stop.signal_name,
            )
            raise
        finally:
            restore()

    async def run_async(self) -> None:
        """Run on the current event loop until every stream ended or :meth:`stop` is called."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stop_requested:
            self._stop_event.set()
        observability = self._observability
        observability.serve()
        if observability.exports_metrics:
            COLLECTOR.add(self)
        if self._given_client is not None:
            client = self._given_client
        else:
            assert self._uri is not None
            client = make_client(self._uri, len(self.specs))
        self._client = client
        watching = asyncio.create_task(observability.run(client), name="flowwarden-observability")
        fleets = self._fleets(client)
        membership = [asyncio.create_task(f.run(), name=f"flowwarden-fleet:{n}") for n, f in fleets.items()]
        try:
            self._runners = [self._runner(spec, client, fleets) for spec in self.specs]
            log.info(
                "flowwarden connector %s starting %d stream(s) on %s",
                self.instance_id,
                len(self._runners),
                redact_uri(self._uri) if self._uri else type(client).__name__,
            )
            tasks = [asyncio.create_task(r.run(), name=f"flowwarden:{r.name}") for r in self._runners]
            self._started.set()
            stopper = asyncio.create_task(self._stop_event.wait())
            pending: set[asyncio.Task[Any]] = set(tasks)
            while pending:
                done, _ = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
                if stopper in done:
                    for runner in self._runners:
                        runner.request_stop()
                    # Leaving the fleets at once: the other members are ready to take the buckets
                    # as soon as their streams, finishing meanwhile, release the leases.
                    await asyncio.gather(*pending, self._leave(fleets, membership), return_exceptions=True)
                    break
            stopper.cancel()
        finally:
            self._started.set()
            await self._leave(fleets, membership)
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            COLLECTOR.discard(self)
            observability.close()
            self._client = None
            if self._given_client is None:
                await _close_client(client)
        errors = self.stream_errors()
        if not errors:
            log.info("flowwarden connector %s stopped gracefully", self.instance_id)
        else:
            log.warning(
                "flowwarden connector %s stopped; %d stream(s) ended with an error: %s",
                self.instance_id,
                len(errors),
                ", ".join(sorted(errors)),
            )

    def start(self, timeout: float = 30.0) -> None:
        """Run in a background thread; returns once every stream has opened its change stream.

        "Opened" means RUNNING (what is written from then on is delivered), or STANDBY,
        RESTARTING, FAILED or STOPPED: :meth:`status` says which.
        """
        if self._thread is not None:
            raise RuntimeError("this connector was already started")

        def main() -> None:
            try:
                with _own_loop() as loop:
                    loop.run_until_complete(self.run_async())
            except BaseException as error:  # reported by stop()
                self._thread_error = error
                self._started.set()

        self._thread = threading.Thread(target=main, name="flowwarden-connector", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        if not self._started.wait(timeout):
            raise TimeoutError(f"the connector did not start within {timeout}s")
        if self._thread_error is not None:
            raise self._thread_error
        while any(r.state == StreamState.STARTING for r in self._runners):
            if time.monotonic() > deadline or not self._thread.is_alive():
                opening = [r.name for r in self._runners if r.state == StreamState.STARTING]
                raise TimeoutError(f"streams {opening} did not open within {timeout}s")
            time.sleep(0.005)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop gracefully and wait up to ``timeout`` seconds for in-flight work and final saves."""
        self._request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the connector did not stop within {timeout}s")
            if self._thread_error is not None:
                raise self._thread_error

    def _request_stop(self) -> None:
        """Ask for a graceful stop; safe from any thread and from a signal handler."""
        self._stop_requested = True
        for runner in self._runners:
            runner.mark_stopping()
        loop, event = self._loop, self._stop_event
        if loop is None or event is None or loop.is_closed():
            return
        # call_soon_threadsafe even on the loop's own thread: a signal handler may run in the
        # middle of the loop's own bookkeeping, where only this call is safe.
        loop.call_soon_threadsafe(event.set)

    def _handle_signals(self) -> Callable[[], None]:
        """Install SIGINT/SIGTERM handlers (main thread only); returns what restores the old ones.

        Python-level handlers rather than the loop's: they run even while a sync handler holds
        the event loop, which is exactly when a second signal must still get through.
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        received: list[str] = []

        def on_signal(signum: int, frame: Any) -> None:
            name = signal.Signals(signum).name
            received.append(name)
            if len(received) > 1:
                raise ForcedStop(name)
            log.warning(
                "flowwarden connector %s: %s received; stopping gracefully (handlers in flight finish, "
                "checkpoints are saved). Send it again to stop at once.",
                self.instance_id,
                name,
            )
            self._request_stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def status(self) -> dict[str, StreamStatus]:
        """Per-stream state; callable from any thread."""
        if not self._runners:
            return {
                spec.name: StreamStatus(
                    spec.name, StreamState.STARTING, None, None, None, 0, 0, 0, None, None
                )
                for spec in self.specs
            }
        return {runner.name: runner.status() for runner in self._runners}

    def request_snapshot(
        self,
        stream: str,
        collections: Iterable[str] | None = None,
        filter: Mapping[str, Any] | None = None,
        *,
        chunk_size: int | None = None,
    ) -> str:
        """Ask ``stream`` for an incremental snapshot; returns the request's id.

        The stream copies the documents of ``collections`` (None: every collection it covers)
        that ``filter`` (a find filter) matches, in chunks of ``chunk_size`` (default: its
        ``snapshot_chunk_size``) handed over between its changes as ``operation_type
        "snapshot"`` rows (see :mod:`flowwarden.runtime.incremental`). ``stream`` names one of
        this connector's streams; a partitioned class's name makes each bucket copy its own
        documents. The request is a document in ``_fw_signals`` of the stream's checkpoint
        database, taken by whichever process runs the stream, at its next heartbeat.

        Writes through the running connector's client, or, before it runs, through a client of
        its URI. On the connector's own event loop, ``await`` :meth:`request_snapshot_async`.
        """
        document, database = self._snapshot_request(stream, collections, filter, chunk_size)
        loop = self._loop
        if loop is not None and loop.is_running() and self._client is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise RuntimeError(
                    "request_snapshot() would block the connector's own event loop; "
                    "use `await connector.request_snapshot_async(...)` there"
                )
            future = asyncio.run_coroutine_threadsafe(self._insert_request(document, database), loop)
            return future.result(timeout=60)
        if self._uri is None:
            raise ConfigurationError(
                "a connector given a client writes snapshot requests through it while it runs; "
                "start the connector first, or write the request with `flowwarden snapshot request`",
                owner="Connector",
                option="request_snapshot",
            )
        import pymongo

        client: pymongo.MongoClient[dict[str, Any]]
        with pymongo.MongoClient(self._uri, appname="flowwarden") as client:
            return run(insert_request(client[database][SIGNALS_COLLECTION], document))

    async def request_snapshot_async(
        self,
        stream: str,
        collections: Iterable[str] | None = None,
        filter: Mapping[str, Any] | None = None,
        *,
        chunk_size: int | None = None,
    ) -> str:
        """:meth:`request_snapshot` for code running on the connector's event loop (a handler, a
        task beside :meth:`run_async`), or on any loop before the connector runs."""
        document, database = self._snapshot_request(stream, collections, filter, chunk_size)
        if self._client is not None and self._loop is asyncio.get_running_loop():
            return await self._insert_request(document, database)
        if self._uri is None:
            raise ConfigurationError(
                "a connector given a client writes snapshot requests through it, on its event loop, "
                "while it runs; start the connector first",
                owner="Connector",
                option="request_snapshot",
            )
        import pymongo

        client: Any = pymongo.AsyncMongoClient(self._uri, appname="flowwarden")
        try:
            return await run_async(insert_request(client[database][SIGNALS_COLLECTION], document))
        finally:
            await client.close()

    async def _insert_request(self, document: dict[str, Any], database: str) -> str:
        return await run_async(insert_request(self._client[database][SIGNALS_COLLECTION], document))

    def _snapshot_request(
        self,
        stream: str,
        collections: Iterable[str] | None,
        filter: Mapping[str, Any] | None,
        chunk_size: int | None,
    ) -> tuple[dict[str, Any], str]:
        """The request's document, checked against the stream it names, and its database."""
        specs = [spec for spec in self.specs if spec.name == stream or spec.stream.name == stream]
        if not specs:
            known = sorted({str(spec.stream.name) for spec in self.specs} | {s.name for s in self.specs})
            raise ConfigurationError(
                f"this connector runs no stream named {stream!r}",
                owner="Connector",
                option="stream",
                value=stream,
                allowed=", ".join(known),
            )
        spec = specs[0]
        try:
            document = request_document(stream, collections, filter, chunk_size)
            request_namespaces(
                document["collections"] and tuple(document["collections"]),
                database=spec.stream.database,
                collection=spec.stream.collection,
                selection=spec.stream.selection,
            )
        except RequestProblem as problem:
            raise ConfigurationError(
                str(problem), owner="Connector.request_snapshot", stream=stream
            ) from None
        return document, self._database_for(spec)

    def runners(self) -> list[StreamRunner]:
        """The running streams (empty before :meth:`run_async` started them)."""
        return list(self._runners)

    @property
    def oplog_window_hours(self) -> float | None:
        """Hours between the oldest and the newest oplog entry, when metrics are served and the
        deployment lets the oplog be read."""
        return self._observability.oplog_window_hours

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of ``/metrics`` while it is served, else None."""
        return self._observability.address

    def stream_errors(self) -> dict[str, BaseException]:
        """The error that ended each stream that did not stop gracefully: FAILED, or stopped by
        an invalidate (its namespace was dropped or renamed)."""
        return {r.name: r.error for r in self._runners if r.error is not None}

    # ------------------------------------------------------------------------------------------
    # wiring

    def _database_for(self, spec: StreamSpec) -> str:
        return spec.stream.database or self._checkpoint_database

    def _fleets(self, client: Any) -> dict[str, Fleet]:
        """One fleet per partitioned single_leader stream, by the stream's name."""
        buckets: dict[str, list[StreamSpec]] = {}
        for spec in self.specs:
            stream = spec.stream
            if stream.partitions > 1 and stream.deployment == Deployment.SINGLE_LEADER:
                assert stream.name is not None  # filled in by stream_spec
                buckets.setdefault(stream.name, []).append(spec)
        return {
            name: Fleet(
                client[self._database_for(specs[0])][LOCKS_COLLECTION],
                name,
                [spec.name for spec in specs],
                owner=self.instance_id,
                token=self.instance_token,
                ttl_seconds=specs[0].stream.lease_ttl_seconds,
            )
            for name, specs in buckets.items()
        }

    async def _leave(self, fleets: Mapping[str, Fleet], membership: list[asyncio.Task[None]]) -> None:
        """Stop renewing this connector's fleet memberships and withdraw them (once)."""
        tasks = list(membership)
        membership.clear()
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(fleet.leave(_CLOSE_TIMEOUT_SECONDS) for fleet in fleets.values()))

    def _runner(self, spec: StreamSpec, client: Any, fleets: Mapping[str, Fleet]) -> StreamRunner:
        from flowwarden.checkpoints import AsyncMongoCheckpointStore

        db = client[self._database_for(spec)]
        store = spec.checkpoint.store or self._checkpoint_store or AsyncMongoCheckpointStore(db)
        dead_letters = None
        drops_malformed = spec.dataframe is not None and spec.dataframe.mode == SchemaMode.DROPMALFORMED
        if spec.retry.on_exhausted == OnError.DEAD_LETTER or spec.dead_letter is not None or drops_malformed:
            options = spec.dead_letter or DeadLetterOptions()
            dlq_db = client[options.database] if options.database else db
            dead_letters = DeadLetterWriter(dlq_db[options.collection], options.retention_days)
        return StreamRunner(
            spec,
            client=client,
            store=AwaitableStore(store),
            instance_id=self.instance_id,
            instance_token=self.instance_token,
            locks_collection=db[LOCKS_COLLECTION],
            signals_collection=db[SIGNALS_COLLECTION],
            dead_letters=dead_letters,
            spark_provider=self._spark_session if spec.dataframe is not None else None,
            metrics=StreamMetrics() if self._observability.exports_metrics else None,
            fleet=fleets.get(spec.stream.name or ""),
        )

    def _spark_session(self) -> Any:
        """The Spark session for DataFrame handlers, created on first use (thread-safe)."""
        with self._spark_lock:
            if self._spark is None:
                from flowwarden.spark import get_or_create_session

                self._spark = get_or_create_session(
                    master=self._spark_master,
                    app_name=self._spark_app_name,
                    conf=self._spark_conf,
                    jvm_log=self._spark_log,
                )
            return self._spark


def _check_async_client(client: Any) -> None:
    from pymongo import MongoClient

    if isinstance(client, MongoClient):
        raise ConfigurationError(
            "got a synchronous pymongo.MongoClient; pass a MongoDB URI, a pymongo.AsyncMongoClient "
            "or a motor client",
            owner="Connector",
            option="uri_or_client",
        )


async def _close_client(client: Any) -> None:
    """Close the connector's own client; with the deployment out of reach this does not wait
    for server selection to end its sessions."""
    timeout = _CLOSE_TIMEOUT_SECONDS if reachable(client) else 0.2
    try:
        await asyncio.wait_for(maybe_await(client.close()), timeout)
    except asyncio.TimeoutError:
        log.info("the MongoDB client did not close within %.1fs (the deployment is out of reach)", timeout)


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """Leave the objects alive now (modules, classes, the handler classes and their options: tens
    of thousands once pymongo, pydantic and flowwarden are imported) out of the cyclic garbage
    collector's passes until the block ends (``gc.freeze``).

    Decoded change events live long enough (a batch of them waits in the driver and the read
    loop's queue) to be promoted, so full passes come every few thousand events; each one visited
    every object of the process, and they cost a connector reading at full speed about a fifth of
    its time. Frozen objects are still freed when their last reference goes; only cycles among
    them wait for the block to end, when they are handed back to the collector. A process that
    froze its heap itself keeps its own arrangement.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _own_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A new event loop whose worker threads (blocking stores, sync handlers) are an executor of
    its own, then the clean-up of :func:`_finish_loop` (skipped after a forced stop) and close."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(thread_name_prefix="flowwarden")
    loop.set_default_executor(executor)
    forced = False
    try:
        yield loop
    except ForcedStop:
        forced = True
        raise
    finally:
        try:
            if not forced:
                _finish_loop(loop, executor)
        finally:
            loop.close()  # does not wait for worker threads: a hung handler may still hold one


def _finish_loop(loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor) -> None:
    """What ``asyncio.run`` does after its coroutine (cancel what is left, close generators, shut
    the default executor down), each step waiting at most ``_CLOSE_TIMEOUT_SECONDS``: a save the
    driver holds on to through its cancellation, or a handler hung in a worker thread, is
    abandoned rather than waited for. The executor is shut down from a thread of its own, not by
    ``loop.shutdown_default_executor()``, which before Python 3.12 joins the executor's threads
    on the loop however long one of them is held."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=_CLOSE_TIMEOUT_SECONDS))
        for task in pending:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, so that asyncio does not warn
    loop.run_until_complete(loop.shutdown_asyncgens())
    shutting_down = threading.Thread(
        target=executor.shutdown, kwargs={"cancel_futures": True}, name="flowwarden-shutdown", daemon=True
    )
    shutting_down.start()
    shutting_down.join(_CLOSE_TIMEOUT_SECONDS)
    if shutting_down.is_alive():
        log.warning(
            "a worker thread (a handler or a blocking store call) was still busy when the connector stopped"
        )
