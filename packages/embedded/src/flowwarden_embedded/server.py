"""The public :class:`EmbeddedReplicaSet`: a TCP server on 127.0.0.1 run by a background thread.

The thread owns one asyncio event loop; every connection, command, cursor and oplog call runs
on it, so none of them need locks. The methods of :class:`EmbeddedReplicaSet` are called from
other threads (a test, the CLI) and hand their work to the loop thread-safely. A sharded
deployment listens on a port per process, the mongos's and each shard member's, from the same
loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import threading
import types
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

from bson.errors import BSONError

from flowwarden_embedded import wire
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.host import CloseConnection, ConnectionInfo, ReplicaSetHost
from flowwarden_embedded.oplog import Oplog
from flowwarden_embedded.rawstrings import encode
from flowwarden_embedded.topology import Process

log = logging.getLogger(__name__)

T = TypeVar("T")

_HOUSEKEEPING_SECONDS = 1.0
_START_TIMEOUT_SECONDS = 30.0
# Commands a driver may still send as legacy OP_QUERY: only the connection handshake.
_OP_QUERY_COMMANDS = frozenset({"hello", "isMaster", "ismaster"})
# Loop iterations between the kernel accepting a connection and the server tracking it.
_ACCEPT_TURNS = 5

Topology = Literal["replica_set", "sharded"]
_TOPOLOGIES: tuple[Topology, ...] = ("replica_set", "sharded")


class _TrackedProtocol(asyncio.StreamReaderProtocol):
    """A stream protocol that records its transport from the first moment the loop has one."""

    def __init__(
        self,
        registry: set[asyncio.BaseTransport],
        reader: asyncio.StreamReader,
        serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        refusing: Callable[[], bool],
    ) -> None:
        super().__init__(reader, serve)
        self._registry = registry
        self._refusing = refusing
        self._tracked: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._tracked = transport
        self._registry.add(transport)
        super().connection_made(transport)
        if self._refusing() and isinstance(transport, asyncio.Transport):
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._tracked is not None:
            self._registry.discard(self._tracked)
        super().connection_lost(exc)


class EmbeddedReplicaSet:
    """A single-node MongoDB replica set (``rs0``) on 127.0.0.1 for tests, examples and demos.

    Unmodified PyMongo (sync and async) and motor clients connect with :attr:`uri`. It is a test
    double, not a database: data lives in memory and is gone when the process ends.

    ``topology="sharded"`` makes it a sharded cluster of ``shards`` shards instead: :attr:`uri`
    reaches a mongos (``hello`` says ``msg: "isdbgrid"``, drivers see topology type Sharded, the
    ``local`` database is refused, ``config.shards`` lists the shards), and each shard's replica
    set member (``shard0``, ``shard1``, ...) listens on a port of its own (:attr:`shard_uris`)
    with its own oplog, retention (``oplog_max_events`` entries each) and cluster time, so that a
    client can read a shard's oplog there as on a real cluster. A database's collections live on
    its primary shard, unless ``shardCollection`` with the key ``{_id: "hashed"}`` spreads one
    over every shard; the mongos merges the shards' change streams in cluster-time order. All
    processes serve one store of documents. :mod:`flowwarden_embedded.topology` says what
    is modelled and what is not.

    ``start()`` and ``stop()`` are idempotent; a stopped server can be started again and comes
    back on the same ports with its data and oplogs, so a client's URI stays valid across restarts.
    """

    def __init__(
        self,
        port: int = 0,
        oplog_max_events: int | None = None,
        *,
        topology: Topology = "replica_set",
        shards: int = 1,
        shard_port: int = 0,
    ) -> None:
        if oplog_max_events is not None and oplog_max_events < 1:
            raise ValueError(f"oplog_max_events must be at least 1 or None, got {oplog_max_events}")
        if topology not in _TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(map(repr, _TOPOLOGIES))}, got {topology!r}")
        if topology == "replica_set" and shard_port:
            raise ValueError("shard_port is for topology='sharded'; a replica set listens on port only")
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be an integer of at least 1, got {shards!r}")
        if topology == "replica_set" and shards != 1:
            raise ValueError(
                f"shards is for topology='sharded'; a replica set has no shards, got shards={shards}"
            )
        self._host = ReplicaSetHost(oplog_max_events, sharded=topology == "sharded", shards=shards)
        self._topology: Topology = topology
        # The port each process binds (0: the OS chooses, and the chosen one is kept, so that a
        # restart comes back where clients look for it).
        if self._host.mongos is None:
            self._host.member.port = port
        else:
            self._host.mongos.port = port
            for index, member in enumerate(self._host.members):
                member.port = shard_port + index if shard_port else 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._connections: dict[int, tuple[asyncio.StreamWriter, asyncio.Task[None]]] = {}
        self._transports: set[asyncio.BaseTransport] = set()
        self._connection_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._refuse_until = 0.0
        self._stopping = False
        self._housekeeping: asyncio.Task[None] | None = None
        self._lifecycle = threading.Lock()

    # -- public API --------------------------------------------------------------------------

    @property
    def topology(self) -> Topology:
        """``"replica_set"`` or ``"sharded"``, as created."""
        return self._topology

    @property
    def port(self) -> int:
        """The TCP port clients connect to, the mongos's when sharded (chosen by the OS when
        created with ``port=0``)."""
        return self._host.processes[0].port

    @property
    def uri(self) -> str:
        """``mongodb://127.0.0.1:<port>/?replicaSet=rs0``; sharded, ``mongodb://127.0.0.1:<port>/``
        (a mongos is no replica set member)."""
        if self._host.mongos is not None:
            return f"mongodb://127.0.0.1:{self.port}/"
        return f"mongodb://127.0.0.1:{self.port}/?replicaSet={self._host.member.set_name}"

    @property
    def shard_ports(self) -> tuple[int, ...]:
        """The port of each shard's replica set member, ``shard0``'s first (``shard_port + k``
        for shard ``k`` when created with a ``shard_port``); empty for a replica set."""
        return () if self._host.mongos is None else tuple(member.port for member in self._host.members)

    @property
    def shard_uris(self) -> tuple[str, ...]:
        """``mongodb://127.0.0.1:<port>/?replicaSet=shard<k>`` for each shard: the shard itself,
        where its oplog is readable (what ``config.shards`` names); empty for a replica set."""
        if self._host.mongos is None:
            return ()
        members = self._host.members
        return tuple(f"mongodb://127.0.0.1:{m.port}/?replicaSet={m.set_name}" for m in members)

    @property
    def shard_port(self) -> int | None:
        """The port of the first shard's replica set member when sharded; None for a replica set."""
        return self.shard_ports[0] if self.shard_ports else None

    @property
    def shard_uri(self) -> str | None:
        """The first of :attr:`shard_uris` (``shard0``); None for a replica set."""
        return self.shard_uris[0] if self.shard_uris else None

    @property
    def oplog(self) -> Oplog:
        """The replica set's oplog; a sharded cluster's first shard's (:attr:`shard_oplogs` has
        every shard's). Touch it only from the server's loop (or while it is stopped)."""
        return self._host.oplog

    @property
    def shard_oplogs(self) -> tuple[Oplog, ...]:
        """Each shard's oplog, ``shard0``'s first; empty for a replica set. As :attr:`oplog`, touch
        them only from the server's loop (or while it is stopped)."""
        if self._host.mongos is None:
            return ()
        return tuple(self._host.oplog_of(member) for member in self._host.members)

    @property
    def running(self) -> bool:
        return self._loop is not None

    def start(self) -> EmbeddedReplicaSet:
        """Bind the port and start serving; returns once clients can connect."""
        with self._lifecycle:
            if self._loop is not None:
                return self
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=self._run_loop,
                args=(loop, ready),
                name=f"flowwarden-embedded-rs-{id(self):x}",
                daemon=True,
            )
            thread.start()
            ready.wait()
            self._loop, self._thread = loop, thread
            try:
                self._call(self._open(), timeout=_START_TIMEOUT_SECONDS)
            except BaseException:
                self._halt_loop()
                raise
        return self

    def stop(self) -> None:
        """Close every connection and cursor, stop serving and join the server thread."""
        with self._lifecycle:
            if self._loop is None:
                return
            try:
                self._call(self._close(), timeout=_START_TIMEOUT_SECONDS)
            finally:
                self._halt_loop()

    def drop_connections(self) -> None:
        """Close every client connection now (clients see a network error and reconnect).

        Returns once the connections are closed; new connections are accepted at once.
        """
        self._call(self._drop_all())

    def outage(self, seconds: float) -> None:
        """Close every connection and refuse new ones for ``seconds``; returns at once.

        A call during an outage starts a new window from now, so ``outage(0)`` ends an outage.
        """
        if seconds < 0:
            raise ValueError(f"outage seconds must be >= 0, got {seconds}")
        self._call(self._begin_outage(seconds))

    def run_in_server(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the server's event-loop thread and return its result.

        The way for a test or benchmark to touch server state such as :attr:`oplog` while the
        server runs (everything on the loop is single-threaded). ``fn`` must not block.
        """

        async def call() -> T:
            return fn()

        result: T = self._call(call())
        return result

    def serve_forever(self) -> None:
        """Serve until Ctrl-C or SIGTERM, then stop cleanly (the ``flowwarden embedded-mongo`` CLI)."""
        self.start()
        stop = threading.Event()
        previous: Any = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self) -> EmbeddedReplicaSet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        uris = self.shard_uris
        shard = f", shard_uri={uris[0]!r}" if len(uris) == 1 else f", shard_uris={uris!r}" if uris else ""
        return f"EmbeddedReplicaSet(uri={self.uri!r}{shard}, {state})"

    # -- loop plumbing -------------------------------------------------------------------------

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the EmbeddedReplicaSet is not running; call start() first")
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result(timeout)

    def _halt_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join()
        loop.close()

    async def _open(self) -> None:
        host = self._host
        host.reset_loop_state()
        self._stopping = False
        loop = asyncio.get_running_loop()
        try:
            for process in host.processes:
                server = await self._listen(loop, process)
                self._servers.append(server)
                process.port = server.sockets[0].getsockname()[1]
        except BaseException:
            # A port already taken: the listeners opened so far must not outlive the failed start.
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self._housekeeping = loop.create_task(self._housekeep())

    async def _listen(self, loop: asyncio.AbstractEventLoop, process: Process) -> asyncio.base_events.Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve_client(process, reader, writer)

        def protocol() -> _TrackedProtocol:
            return _TrackedProtocol(self._transports, asyncio.StreamReader(loop=loop), serve, self._refusing)

        return await loop.create_server(protocol, "127.0.0.1", process.port, reuse_address=True)

    async def _close(self) -> None:
        self._stopping = True
        self._host.shutdown_event.set()
        if self._servers:
            # Stop accepting, then let accepts already under way finish (they are refused at
            # once) before the listening sockets go away: an accept that completes after its
            # socket closed would leave a connection open with nobody serving it.
            loop = asyncio.get_running_loop()
            for server in self._servers:
                for listening in server.sockets:
                    loop.remove_reader(listening.fileno())
            await self._settle()
            for server in self._servers:
                server.close()
        await self._drop_all()
        # Connections accepted but not yet served, and any other work of this loop, end here too:
        # nothing may outlive stop() holding a socket.
        current = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        self._housekeeping = None
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        self._host.close()

    @staticmethod
    async def _settle() -> None:
        """Turn the loop a few times: a connection whose TCP handshake completed before now is
        accepted and tracked by the time this returns."""
        for _ in range(_ACCEPT_TURNS):
            await asyncio.sleep(0)

    async def _drop_all(self) -> None:
        # "Every connection" includes a client that connected just before this call.
        await self._settle()
        for transport in list(self._transports):
            if isinstance(transport, asyncio.Transport):
                transport.abort()
        tasks = [task for _, task in self._connections.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _begin_outage(self, seconds: float) -> None:
        self._refuse_until = asyncio.get_running_loop().time() + seconds
        await self._drop_all()

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(_HOUSEKEEPING_SECONDS)
            try:
                self._host.housekeeping()
            except Exception:
                log.exception("embedded replica set: housekeeping failed")

    # -- one connection -----------------------------------------------------------------------

    def _refusing(self) -> bool:
        """True while stopping or during an outage: new connections are closed on arrival."""
        return self._stopping or asyncio.get_running_loop().time() < self._refuse_until

    async def _serve_client(
        self, process: Process, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._refusing():
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        conn = ConnectionInfo(
            id=next(self._connection_ids),
            peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
            process=process,
        )
        host = self._host
        self._connections[conn.id] = (writer, task)
        host.connections[conn.id] = conn
        host.connections_current += 1
        host.connections_total += 1
        try:
            await self._request_loop(conn, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, CloseConnection):
            pass
        except wire.MalformedMessage as exc:
            log.debug("embedded replica set: closing connection %d: %s", conn.id, exc)
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.pop(conn.id, None)
            host.connections.pop(conn.id, None)
            host.connections_current -= 1
            writer.transport.abort()

    async def _request_loop(
        self, conn: ConnectionInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host = self._host
        while True:
            header = await reader.readexactly(wire.HEADER_SIZE)
            length, request_id, _, op_code = wire.parse_header(header)
            message = header + await reader.readexactly(length - wire.HEADER_SIZE)
            try:
                request = wire.parse_message(request_id, op_code, message, conn.compressors)
            except wire.ObjectTooLarge as too_large:
                # MongoDB answers this one and keeps the connection: the message itself was sound.
                if not too_large.more_to_come:
                    refusal = CommandError(10334, too_large.errmsg).to_reply()
                    refusal.update(host.cluster_time_fields(conn.process))
                    await self._send(
                        writer,
                        too_large.op_code,
                        request_id,
                        encode(refusal),
                        checksum=too_large.checksum,
                    )
                continue
            if (
                request.op_code == wire.OP_QUERY
                and next(iter(request.command), None) not in _OP_QUERY_COMMANDS
            ):
                name = next(iter(request.command), "")
                reply = CommandError(
                    352,
                    f"Unsupported OP_QUERY command: {name}. The client driver may require an upgrade.",
                    code_name="UnsupportedOpQueryCommand",
                ).to_reply()
                reply.update(host.cluster_time_fields(conn.process))
            else:
                reply = await host.run(conn, request.command, request.db)
            if request.more_to_come:
                continue
            try:
                payload = encode(reply)
            except (BSONError, TypeError, ValueError, OverflowError) as exc:
                error = CommandError(
                    10334, f"reply could not be encoded as BSON: {exc}", code_name="BSONObjectTooLarge"
                )
                payload = encode({**error.to_reply(), **host.cluster_time_fields(conn.process)})
            await self._send(writer, request.op_code, request.request_id, payload, checksum=request.checksum)

    async def _send(
        self, writer: asyncio.StreamWriter, op_code: int, response_to: int, payload: bytes, *, checksum: bool
    ) -> None:
        """Answer a request in its own kind: OP_REPLY to OP_QUERY, OP_MSG (checksummed if it was) else."""
        if op_code == wire.OP_QUERY:
            out = wire.build_op_reply(next(self._request_ids), response_to, payload)
        else:
            out = wire.build_op_msg(next(self._request_ids), response_to, payload, checksum=checksum)
        writer.write(out)
        await writer.drain()
