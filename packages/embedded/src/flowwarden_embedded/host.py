"""The deployment's state and the command pipeline every request goes through.

:class:`ReplicaSetHost` holds everything a command can touch (catalog, oplogs, cursors, sessions)
and the deployment's processes (:mod:`~flowwarden_embedded.topology`: the member; or a
mongos and one member per shard, each with its oplog), and is the ``ChangeStreamHost`` change
streams read documents and options from. Its :meth:`ReplicaSetHost.run` takes one decoded
request, received by one of the processes, through the steps MongoDB takes: the command's lookup,
that process's fail point, the refusals of a mongos, session and transaction bookkeeping,
retryable-write replay, the command itself, and the ``$clusterTime``/``operationTime`` every reply
carries: the member's own cluster time, or a mongos's, the newest of its shards'. Throughout, the
command is an operation in progress (:mod:`~flowwarden_embedded.operations`), which
``currentOp`` lists and ``killOp`` interrupts, and its time counts in its collection's statistics.

Where a write is logged: on the member that received it; through a mongos, on the shard that
:class:`~flowwarden_embedded.topology.Placement` names for it, after the mongos told that
shard its cluster time.

Everything here runs on the server's event loop thread; nothing may block it.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import os
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import Binary, Int64, ObjectId, Timestamp

from flowwarden_embedded import commands
from flowwarden_embedded.commands.handshake import (
    FEATURE_COMPATIBILITY_VERSION,
    LOGICAL_SESSION_TIMEOUT_MINUTES,
)
from flowwarden_embedded.crud import Scope
from flowwarden_embedded.cursors import CursorRegistry
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import value_key
from flowwarden_embedded.operations import Operation, Operations, interrupted_error
from flowwarden_embedded.oplog import NOOP, Oplog, OplogOp, key_timestamp
from flowwarden_embedded.plans import collection_scans
from flowwarden_embedded.sessions import TRANSACTION_CONTROL, SessionRegistry, TxnState
from flowwarden_embedded.shardmerge import MergedOplog
from flowwarden_embedded.storage import Catalog, Document
from flowwarden_embedded.topology import (
    REPLICA_SET_NAME,
    Placement,
    Process,
    Role,
    refuse_local_through_mongos,
    shard_name,
)
from flowwarden_embedded.ttl import expire_ttl_documents

if TYPE_CHECKING:
    from flowwarden_embedded.changestream import ChangeSource

log = logging.getLogger(__name__)

ZERO_SIGNATURE = {"hash": Binary(b"\x00" * 20, 0), "keyId": Int64(0)}


class CloseConnection(Exception):
    """Raised by a command that must end its connection without replying (a fail point)."""


@dataclass(slots=True)
class ConnectionInfo:
    """What the server knows about one client connection."""

    id: int
    peer: str
    # The process the client connected to: the replica set member, or a sharded deployment's mongos.
    process: Process
    app_name: str | None = None
    metadata: Document | None = None
    # The OP_COMPRESSED compressors this connection's hello negotiated; no others are accepted.
    compressors: tuple[str, ...] = ()
    opened: float = field(default_factory=time.monotonic)


class ReplicaSetHost:
    """State of the single-node replica set (``rs0``), or of a sharded cluster (``sharded``): a
    mongos and ``shards`` single-node shards, each with its own oplog of at most
    ``oplog_max_events`` entries; the ``ChangeStreamHost`` of their change streams."""

    def __init__(
        self, oplog_max_events: int | None = None, *, sharded: bool = False, shards: int = 1
    ) -> None:
        if shards < 1 or (shards > 1 and not sharded):
            raise ValueError(f"a sharded cluster has 1 or more shards, a replica set 1; got {shards}")
        self.catalog = Catalog()
        self.started_wall = time.time()
        origin = Timestamp(int(self.started_wall), 0)
        uuids: dict[tuple[str, str], bytes] = {}
        names = [shard_name(k) for k in range(shards)] if sharded else [REPLICA_SET_NAME]
        self.members: tuple[Process, ...] = tuple(
            Process(Role.MEMBER, name, oplog=Oplog(oplog_max_events, origin=origin, uuids=uuids))
            for name in names
        )
        for member in self.members:
            # Events and local.oplog.rs show the catalog's collection UUIDs.
            oplog = self.oplog_of(member)
            oplog.uuid_source = self.collection_uuid
            if sharded:
                # A shard's oplog is never empty: replSetInitiate logs this first, as MongoDB's does.
                oplog.append([OplogOp(NOOP, "", None, description={"msg": "initiating set"})])
        self.member = self.members[0]
        self.oplog = self.oplog_of(self.member)
        """The replica set's oplog; a sharded cluster's first shard's."""
        self.mongos = Process(Role.MONGOS) if sharded else None
        self.placement = Placement(self.members, Timestamp(int(self.started_wall), 1)) if sharded else None
        self.cursors = CursorRegistry()
        self.sessions = SessionRegistry(self.catalog)
        self.operations = Operations()
        # The open client connections of every process, by connection id (currentOp lists idle ones).
        self.connections: dict[int, ConnectionInfo] = {}
        self.election_id = ObjectId("7fffffff0000000000000001")
        self.started = time.monotonic()
        self.connections_current = 0
        self.connections_total = 0
        self.opcounters: dict[str, int] = dict.fromkeys(
            ("insert", "query", "update", "delete", "getmore", "command"), 0
        )
        self.parameters: dict[str, Any] = {
            "enableTestCommands": True,
            "ttlMonitorSleepSecs": 60,
            "transactionLifetimeLimitSeconds": 60,
            "maxTransactionLockRequestTimeoutMillis": 5,
            "featureCompatibilityVersion": {"version": FEATURE_COMPATIBILITY_VERSION},
            "changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": "off"}},
            "logLevel": 0,
            "notablescan": False,
        }
        self._shutdown: asyncio.Event | None = None
        self._member_scopes = {
            member: Scope(self.catalog, functools.partial(self._log_on, member)) for member in self.members
        }
        # The TTL monitor of a cluster deletes on each shard, which logs its own documents' deletes.
        self._ttl_scope = (
            self._member_scopes[self.member] if self.placement is None else Scope(self.catalog, self._route)
        )
        self._last_ttl_pass = time.monotonic()

    # -- identity --------------------------------------------------------------------------

    @property
    def processes(self) -> tuple[Process, ...]:
        """Every process of the deployment, the one clients connect to first."""
        return self.members if self.mongos is None else (self.mongos, *self.members)

    @staticmethod
    def oplog_of(process: Process) -> Oplog:
        """A member's oplog (a mongos has none: it reads its shards')."""
        if process.oplog is None:
            raise CommandError(20, "a mongos has no oplog of its own", code_name="IllegalOperation")
        return process.oplog

    def shards(self) -> list[Document]:
        """``config.shards`` as a mongos answers it (empty when the deployment is not sharded)."""
        return [] if self.placement is None else self.config_documents("shards") or []

    def config_documents(self, name: str) -> list[Document] | None:
        """``config.<name>`` as a mongos reads it from its config servers, for the collections it
        has (``shards``, ``databases``, ``collections``); None otherwise, or when not sharded."""
        return None if self.placement is None else self.placement.config_documents(name)

    def reset_loop_state(self) -> None:
        """Forget objects bound to a previous event loop (the server is being started again)."""
        self._shutdown = None

    @property
    def shutdown_event(self) -> asyncio.Event:
        if self._shutdown is None:
            self._shutdown = asyncio.Event()
        return self._shutdown

    def cluster_time(self, process: Process) -> Timestamp:
        """The process's cluster time: a member's own; a mongos's, the newest of its shards'."""
        if process.oplog is not None:
            return process.oplog.cluster_time
        return key_timestamp(self._mongos_clock())

    def _mongos_clock(self) -> int:
        return max(self.oplog_of(member).clock_key for member in self.members)

    def cluster_time_fields(self, process: Process) -> Document:
        ts = self.cluster_time(process)
        return {"$clusterTime": {"clusterTime": ts, "signature": ZERO_SIGNATURE}, "operationTime": ts}

    def change_source(self, process: Process) -> ChangeSource:
        """What a change stream opened on ``process`` reads: a member's oplog, or for a mongos the
        merge of every shard's."""
        if process.oplog is not None:
            return process.oplog
        return MergedOplog([self.oplog_of(member) for member in self.members])

    # -- where writes are logged -----------------------------------------------------------------

    def scope_for(self, process: Process) -> Scope:
        """Where a command received by ``process`` outside a transaction writes and logs: on a
        mongos, each write on its shard, told the mongos's cluster time as of now (the command's
        start) before its first write."""
        if process.oplog is not None:
            return self._member_scopes[process]
        return Scope(self.catalog, functools.partial(self._route, gossip=self._mongos_clock()))

    def _log_on(self, member: Process, op: OplogOp) -> None:
        self.oplog_of(member).append((op,))
        if self.placement is not None:
            self.placement.observe(op)

    def _route(self, op: OplogOp, gossip: int = 0) -> None:
        assert self.placement is not None
        shard = self.oplog_of(self.placement.owner(op))
        shard.advance(gossip)
        shard.append((op,))
        self.placement.observe(op)

    def log_transaction(self, process: Process, ops: Sequence[OplogOp], lsid: Document, number: int) -> None:
        """Log a committed transaction's ``ops``: one entry on the member that ran it; through a
        mongos, one entry on each shard it wrote to, all at one commit time."""
        if process.oplog is not None or self.placement is None:
            self.oplog_of(process).append(ops, lsid=lsid, txn_number=number)
            return
        parts: dict[Process, list[OplogOp]] = {}
        for op in ops:
            parts.setdefault(self.placement.owner(op), []).append(op)
        gossip = self._mongos_clock()
        shards = [self.oplog_of(shard) for shard in parts]
        for shard in shards:
            shard.advance(gossip)
        commit = max(shard.next_key() for shard in shards)
        for shard, part in zip(shards, parts.values(), strict=True):
            shard.append(part, lsid=lsid, txn_number=number, at=commit)

    # -- ChangeStreamHost --------------------------------------------------------------------

    def lookup_document(self, db: str, coll: str, document_key: Document) -> Document | None:
        """The current committed document with this ``_id`` (for ``fullDocument: updateLookup``)."""
        collection = self.catalog.get(db, coll)
        if collection is None or "_id" not in document_key:
            return None
        return collection.docs.get(value_key(document_key["_id"]))

    def collection_options(self, db: str, coll: str) -> Document | None:
        """The collection's options as ``listCollections`` shows them; None if it does not exist."""
        collection = self.catalog.get(db, coll)
        return None if collection is None else dict(collection.options)

    def collection_uuid(self, db: str, coll: str) -> Binary | None:
        """The collection's UUID (``collectionUUID`` of expanded events); None if it does not exist."""
        collection = self.catalog.get(db, coll)
        return None if collection is None else collection.uuid

    # -- the command pipeline ----------------------------------------------------------------

    async def run(self, conn: ConnectionInfo, command: Document, db: str) -> Document:
        """Execute one command and return its reply (an error reply on failure).

        Raises :class:`CloseConnection` when a fail point asks for the connection to be dropped.
        The command is an operation in progress (``currentOp``) until its reply is made; one that
        ``killOp`` interrupts answers Interrupted.
        """
        operation = self.operations.begin(conn, command, db)
        try:
            try:
                reply = await self._run(conn, command, db, operation)
            except CommandError as exc:
                reply = exc.to_reply()
            except CloseConnection:
                raise
            except asyncio.CancelledError:
                if not self.operations.interrupted(operation):
                    raise
                reply = interrupted_error().to_reply()
            except Exception as exc:  # a bug must not kill the connection loop: answer InternalError
                log.exception("embedded replica set: command %r failed", next(iter(command), None))
                reply = CommandError(1, f"internal error in the embedded replica set: {exc!r}").to_reply()
        finally:
            self._end_operation(operation)
        reply.update(self.cluster_time_fields(conn.process))
        return reply

    def _end_operation(self, operation: Operation | None) -> None:
        if operation is None:
            return
        scans = 0
        collection = operation.command.get(operation.name)
        if isinstance(collection, str):
            coll = self.catalog.get(operation.db, collection)
            scans = collection_scans(operation.name, operation.command, coll)
        self.operations.end(operation, self.collection_uuid, scans)

    async def _run(
        self, conn: ConnectionInfo, cmd: Document, db: str, operation: Operation | None
    ) -> Document:
        if not cmd:
            raise CommandError(59, "no such command: ''")
        name = next(iter(cmd))
        process = conn.process
        spec = commands.lookup(name, process.role)
        self.opcounters[spec.counter] = self.opcounters.get(spec.counter, 0) + 1
        action = None
        if spec.failable:
            action = process.failpoints.check(spec.name, conn.app_name, commands.namespace_of(cmd, db))
        if action is not None:
            if action.block_ms:
                await asyncio.sleep(action.block_ms / 1000)
            if action.close_connection:
                raise CloseConnection()
            if action.error is not None:
                raise action.error
        refuse_local_through_mongos(process, db)
        session = None
        lsid = cmd.get("lsid")
        if lsid is not None and spec.sessions:
            session = self.sessions.get(lsid)
        txn = None
        if "autocommit" in cmd:
            if session is None:
                raise CommandError(
                    50768, "Transactions need a session: the command carries autocommit but no lsid"
                )
            txn = self.sessions.transaction_for(session, name, cmd)
        scope = self.scope_for(process)
        if txn is not None and txn.state is TxnState.IN_PROGRESS and name not in TRANSACTION_CONTROL:
            scope = Scope(txn.catalog, txn.ops.append, txn.txn_id)
        retry_key: Hashable | None = None
        if session is not None and txn is None and spec.retryable and "txnNumber" in cmd:
            number = int(cmd["txnNumber"])
            if number == session.retry_number and session.retry_reply is not None:
                replay = copy.copy(session.retry_reply)
                self._attach_write_concern_error(replay, action)
                return replay
            newest = max(session.retry_number, session.txn_number)
            if number < newest:
                raise CommandError(
                    225,
                    f"Retryable write with txnNumber {number} is prohibited on session because a newer "
                    f"retryable write with txnNumber {newest} has already started on this session.",
                    code_name="TransactionTooOld",
                )
            session.retry_number = number
            session.retry_reply = None
            session.txn_number = max(session.txn_number, number)
            retry_key = session.key
        ctx = commands.Context(
            host=self,
            conn=conn,
            cmd=cmd,
            db=db,
            name=name,
            session=session,
            txn=txn,
            scope=scope,
            operation=operation,
        )
        try:
            reply = await spec.handler(ctx)
        except CommandError:
            if session is not None and txn is not None and name not in TRANSACTION_CONTROL:
                self.sessions.abort(session)
            raise
        if (
            session is not None
            and txn is not None
            and name not in TRANSACTION_CONTROL
            and reply.get("writeErrors")
        ):
            self.sessions.abort(session)
        if retry_key is not None and session is not None:
            session.retry_reply = dict(reply)
        self._attach_write_concern_error(reply, action)
        return reply

    @staticmethod
    def _attach_write_concern_error(reply: Document, action: Any) -> None:
        if action is not None and action.write_concern_error is not None:
            reply["writeConcernError"] = dict(action.write_concern_error)

    # -- housekeeping ----------------------------------------------------------------------

    def housekeeping(self) -> None:
        """Periodic duties: reap idle cursors, abort expired transactions, run the TTL monitor."""
        self.cursors.reap_idle()
        self.sessions.expire_transactions()
        for session in self.sessions.expire_idle(LOGICAL_SESSION_TIMEOUT_MINUTES * 60.0):
            self.cursors.kill_session(session.key)
        interval = float(self.parameters.get("ttlMonitorSleepSecs", 60))
        now = time.monotonic()
        if now - self._last_ttl_pass >= interval:
            self._last_ttl_pass = now
            expire_ttl_documents(self._ttl_scope)

    def close(self) -> None:
        self.cursors.close_all()
        self.sessions.close_all()
        for process in self.processes:
            process.failpoints.clear()

    def pid(self) -> int:
        return os.getpid()
