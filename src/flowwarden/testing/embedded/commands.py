"""The commands the embedded replica set answers, with MongoDB's reply shapes and error codes.

Each handler takes a :class:`Context` and returns the reply document without ``$clusterTime``
(the host adds it). Handlers raise :class:`CommandError` for ``ok: 0`` replies; per-statement
failures of write commands go into ``writeErrors`` as MongoDB reports them. The table
:data:`COMMANDS` says, per command, which opcounter it bumps, whether ``failCommand`` may fail it
and whether it is a retryable write.
"""

from __future__ import annotations

import asyncio
import datetime
import platform
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson import Binary, Int64, Timestamp
from bson.binary import UuidRepresentation

from flowwarden.testing.embedded import crud, engine, wire
from flowwarden.testing.embedded.crud import Scope
from flowwarden.testing.embedded.cursors import ListCursor, ServerCursor
from flowwarden.testing.embedded.errors import CommandError
from flowwarden.testing.embedded.limits import MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE
from flowwarden.testing.embedded.oplog import OplogOp
from flowwarden.testing.embedded.sessions import Session, Transaction, TxnState
from flowwarden.testing.embedded.storage import Collection, Document, DuplicateKey, IndexSpec

if TYPE_CHECKING:
    from flowwarden.testing.embedded.host import ConnectionInfo, ReplicaSetHost

# MongoDB 7.0 speaks wire version 21; buildInfo must report a matching version.
MAX_WIRE_VERSION = 21
SERVER_VERSION = "7.0.14"
FEATURE_COMPATIBILITY_VERSION = "7.0"
MAX_WRITE_BATCH_SIZE = 100_000
LOGICAL_SESSION_TIMEOUT_MINUTES = 30
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}

# Fields of a command that are protocol envelope, never options of the command itself.
_GENERIC_FIELDS = frozenset(
    {
        "$db",
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "$clusterTime",
        "$readPreference",
        "readConcern",
        "writeConcern",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
        "comment",
        "maxTimeMS",
        "$audit",
        "$client",
        "mayBypassWriteBlocking",
        "recoveryToken",
    }
)


@dataclass(slots=True)
class Context:
    """One command being executed: who sent it, where it reads and writes."""

    host: ReplicaSetHost
    conn: ConnectionInfo
    cmd: Document
    db: str
    name: str
    session: Session | None
    txn: Transaction | None
    scope: Scope

    @property
    def in_transaction(self) -> bool:
        return self.txn is not None and self.txn.state is TxnState.IN_PROGRESS

    def collection_name(self) -> str:
        value = self.cmd[self.name]
        if not isinstance(value, str):
            raise CommandError(
                73,
                f"collection name has invalid type {_type_name(value)}",
                code_name="InvalidNamespace",
            )
        if not value:
            raise CommandError(73, f"Invalid namespace specified '{self.db}.'", code_name="InvalidNamespace")
        return value

    def get(self, name: str) -> Collection | None:
        return self.scope.catalog.get(self.db, name)


Handler = Callable[[Context], Awaitable[Document]]


@dataclass(frozen=True, slots=True)
class CommandSpec:
    name: str
    handler: Handler
    counter: str = "command"
    failable: bool = True
    sessions: bool = True
    retryable: bool = False


COMMANDS: dict[str, CommandSpec] = {}


def command(
    *names: str,
    counter: str = "command",
    failable: bool = True,
    sessions: bool = True,
    retryable: bool = False,
) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            COMMANDS[name] = CommandSpec(names[0], handler, counter, failable, sessions, retryable)
        return handler

    return register


def namespace_of(cmd: Document, db: str) -> str | None:
    """``db.coll`` for commands addressed to a collection (fail points can match on it)."""
    value = next(iter(cmd.values()), None)
    return f"{db}.{value}" if isinstance(value, str) else None


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, Int64)):
        return "int" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return type(value).__name__


def _field(ctx: Context, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = ctx.cmd.get(name, default)
    if value is None or value is default:
        return value
    expected = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in expected:
        ok = False
    else:
        ok = isinstance(value, expected)
    if not ok:
        wanted = {dict: "object", list: "array", str: "string", int: "int", bool: "bool", float: "double"}
        names = "', '".join(wanted.get(k, k.__name__) for k in expected)
        raise CommandError(
            14,
            f"BSON field '{ctx.name}.{name}' is the wrong type '{_type_name(value)}', "
            f"expected type '{names}'",
        )
    return value


def _non_negative(ctx: Context, name: str, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(
            14,
            f"BSON field '{ctx.name}.{name}' is the wrong type '{_type_name(value)}', expected types "
            "'[long, int, decimal, double]'",
        )
    if value < 0:
        raise CommandError(51024, f"BSON field '{name}' value must be >= 0, actual value '{value}'")
    return int(value)


def _batch_size(ctx: Context, source: Document | None) -> int | None:
    if not source or "batchSize" not in source:
        return None
    value = source["batchSize"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CommandError(51024, f"BSON field 'batchSize' value must be >= 0, actual value '{value}'")
    return int(value)


async def _cursor_reply(
    ctx: Context,
    cursor: ServerCursor,
    batch_size: int | None,
    *,
    max_time_ms: int | None = None,
    no_timeout: bool = False,
) -> Document:
    """Answer the first batch of a cursor-returning command, registering the cursor if it has more."""
    batch, extra = await cursor.fetch(batch_size, max_time_ms, first=True)
    cursor_id = Int64(0)
    if cursor.exhausted:
        cursor.close()
    else:
        owner = ctx.session.key if ctx.session is not None else None
        cursor_id = ctx.host.cursors.register(cursor, owner, no_timeout=no_timeout)
    return {"cursor": {"firstBatch": batch, "id": cursor_id, "ns": cursor.ns, **extra}, "ok": 1.0}


def _write_concern_error(ctx: Context) -> Document | None:
    concern = ctx.cmd.get("writeConcern")
    if not isinstance(concern, dict):
        return None
    w = concern.get("w")
    if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 1:
        return {
            "code": 100,
            "codeName": "UnsatisfiableWriteConcern",
            "errmsg": "Not enough data-bearing nodes",
            "errInfo": {"writeConcern": dict(concern)},
        }
    if isinstance(w, str) and w != "majority":
        return {
            "code": 79,
            "codeName": "UnknownReplWriteConcern",
            "errmsg": f"Unrecognized write concern mode: {w}",
            "errInfo": {"writeConcern": dict(concern)},
        }
    return None


def _write_reply(ctx: Context, reply: Document) -> Document:
    ts: Timestamp = ctx.host.oplog.cluster_time
    reply["opTime"] = {"ts": ts, "t": Int64(1)}
    reply["electionId"] = ctx.host.election_id
    wce = _write_concern_error(ctx)
    if wce is not None:
        reply["writeConcernError"] = wce
    reply["ok"] = 1.0
    return reply


# ---------------------------------------------------------------------------------------------
# handshake and server information


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def hello_reply(host: ReplicaSetHost, conn: ConnectionInfo, *, legacy: bool, hello_ok: bool) -> Document:
    ts: Timestamp = host.oplog.cluster_time
    written = ts.as_datetime() if ts.time else _utcnow()
    reply: Document = {}
    if hello_ok:
        reply["helloOk"] = True
    reply.update(
        {
            "topologyVersion": {"processId": host.process_id, "counter": Int64(0)},
            "hosts": [host.address],
            "setName": "rs0",
            "setVersion": 1,
            ("ismaster" if legacy else "isWritablePrimary"): True,
            "secondary": False,
            "primary": host.address,
            "me": host.address,
            "electionId": host.election_id,
            "lastWrite": {
                "opTime": {"ts": ts, "t": Int64(1)},
                "lastWriteDate": written,
                "majorityOpTime": {"ts": ts, "t": Int64(1)},
                "majorityWriteDate": written,
            },
            "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
            "maxMessageSizeBytes": MAX_MESSAGE_SIZE,
            "maxWriteBatchSize": MAX_WRITE_BATCH_SIZE,
            "localTime": _utcnow(),
            "logicalSessionTimeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES,
            "connectionId": conn.id,
            "minWireVersion": 0,
            "maxWireVersion": MAX_WIRE_VERSION,
            "readOnly": False,
        }
    )
    if conn.compressors:
        reply["compression"] = list(conn.compressors)
    reply["ok"] = 1.0
    return reply


@command("hello", "isMaster", "ismaster", counter="command", sessions=False)
async def cmd_hello(ctx: Context) -> Document:
    """hello / isMaster. An awaitable hello (``topologyVersion`` + ``maxAwaitTimeMS``) that names
    the current topology waits up to ``maxAwaitTimeMS`` for a change, as MongoDB's streaming
    monitoring protocol expects; the topology of a single node never changes, so it times out."""
    cmd = ctx.cmd
    metadata = cmd.get("client")
    if isinstance(metadata, dict) and ctx.conn.metadata is None:
        ctx.conn.metadata = metadata
        application = metadata.get("application")
        if isinstance(application, dict) and isinstance(application.get("name"), str):
            ctx.conn.app_name = application["name"]
    if "compression" in cmd:
        ctx.conn.compressors = wire.negotiate_compressors(_compression_offer(ctx))
    version = cmd.get("topologyVersion")
    wait_ms = cmd.get("maxAwaitTimeMS")
    if isinstance(version, dict) and wait_ms is not None:
        if not isinstance(wait_ms, (int, float)) or isinstance(wait_ms, bool) or wait_ms < 0:
            raise CommandError(2, "maxAwaitTimeMS must be a non-negative integer")
        if version.get("processId") == ctx.host.process_id and version.get("counter") == 0:
            try:
                await asyncio.wait_for(ctx.host.shutdown_event.wait(), wait_ms / 1000)
            except asyncio.TimeoutError:
                pass
            if ctx.host.shutdown_event.is_set():
                raise CommandError(91, "The server is in quiesce mode and will shut down")
    return hello_reply(ctx.host, ctx.conn, legacy=ctx.name != "hello", hello_ok=bool(cmd.get("helloOk")))


def _compression_offer(ctx: Context) -> list[str]:
    """hello's ``compression``: the compressor names the client can use, most preferred first.

    With the field, hello negotiates afresh (an empty list turns compression off); without it,
    hello only reports what was negotiated, as MongoDB does.
    """
    offered = ctx.cmd["compression"]
    if not isinstance(offered, list):
        raise CommandError(
            14,
            f"BSON field '{ctx.name}.compression' is the wrong type '{_type_name(offered)}', "
            "expected type 'array'",
        )
    for position, name in enumerate(offered):
        if not isinstance(name, str):
            raise CommandError(
                14,
                f"BSON field '{ctx.name}.compression.{position}' is the wrong type "
                f"'{_type_name(name)}', expected type 'string'",
            )
    return offered


@command("ping", sessions=False)
async def cmd_ping(ctx: Context) -> Document:
    return {"ok": 1.0}


def build_info() -> Document:
    parts = [int(p) for p in SERVER_VERSION.split(".")]
    return {
        "version": SERVER_VERSION,
        "gitVersion": "0000000000000000000000000000000000000000",
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": [*parts, 0],
        "openssl": {"running": "disabled", "compiled": "disabled"},
        "buildEnvironment": {"distmod": "flowwarden-embedded", "target_os": platform.system().lower()},
        "bits": 64,
        "debug": False,
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["embedded"],
        "ok": 1.0,
    }


@command("buildInfo", "buildinfo", sessions=False)
async def cmd_build_info(ctx: Context) -> Document:
    return build_info()


@command("getCmdLineOpts", sessions=False)
async def cmd_get_cmd_line_opts(ctx: Context) -> Document:
    port = ctx.host.port
    return {
        "argv": ["mongod", "--replSet", "rs0", "--bind_ip", "127.0.0.1", "--port", str(port)],
        "parsed": {
            "net": {"bindIp": "127.0.0.1", "port": port},
            "replication": {"replSet": "rs0"},
            "setParameter": {"enableTestCommands": "1"},
        },
        "ok": 1.0,
    }


@command("getParameter", sessions=False)
async def cmd_get_parameter(ctx: Context) -> Document:
    params = ctx.host.parameters
    if ctx.cmd.get("getParameter") == "*" or ctx.cmd.get("allParameters"):
        return {**params, "ok": 1.0}
    wanted = [k for k in ctx.cmd if k not in _GENERIC_FIELDS and k != "getParameter"]
    if not wanted:
        raise CommandError(72, "no option found to get", code_name="InvalidOptions")
    reply: Document = {}
    for name in wanted:
        if name not in params:
            raise CommandError(72, "no option found to get", code_name="InvalidOptions")
        reply[name] = params[name]
    reply["ok"] = 1.0
    return reply


@command("setParameter", sessions=False)
async def cmd_set_parameter(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "setParameter may only be run against the admin database.", code_name="Unauthorized"
        )
    params = ctx.host.parameters
    reply: Document = {}
    changed = [k for k in ctx.cmd if k not in _GENERIC_FIELDS and k != "setParameter"]
    if not changed:
        raise CommandError(2, "no option found to set, use help:true to see options ")
    for name in changed:
        if name not in params or name in ("featureCompatibilityVersion",):
            raise CommandError(
                2, f"attempted to set unrecognized parameter [{name}], use help:true to see options "
            )
        reply["was"] = params[name]
        params[name] = ctx.cmd[name]
    reply["ok"] = 1.0
    return reply


@command("serverStatus", sessions=False)
async def cmd_server_status(ctx: Context) -> Document:
    host = ctx.host
    elapsed = max(0.0, time.monotonic() - host.started)
    hello = hello_reply(host, ctx.conn, legacy=False, hello_ok=False)
    hello.pop("ok")
    return {
        "host": socket.gethostname(),
        "version": SERVER_VERSION,
        "process": "mongod",
        "pid": Int64(host.pid()),
        "uptime": float(int(elapsed)),
        "uptimeMillis": Int64(int(elapsed * 1000)),
        "uptimeEstimate": Int64(int(elapsed)),
        "localTime": _utcnow(),
        "connections": {
            "current": host.connections_current,
            "available": 1_000_000 - host.connections_current,
            "totalCreated": host.connections_total,
            "active": host.connections_current,
        },
        "opcounters": {k: Int64(v) for k, v in host.opcounters.items()},
        "repl": {
            k: hello[k]
            for k in (
                "topologyVersion",
                "hosts",
                "setName",
                "setVersion",
                "isWritablePrimary",
                "secondary",
                "primary",
                "me",
                "electionId",
                "lastWrite",
            )
        },
        "metrics": {"cursor": {"open": {"total": Int64(len(host.cursors))}}},
        "logicalSessionRecordCache": {"activeSessionsCount": len(host.sessions)},
        "storageEngine": {"name": "embedded", "supportsCommittedReads": True, "persistent": False},
        "ok": 1.0,
    }


@command("replSetGetStatus", sessions=False)
async def cmd_repl_set_get_status(ctx: Context) -> Document:
    host = ctx.host
    ts: Timestamp = host.oplog.cluster_time
    optime = {"ts": ts, "t": Int64(1)}
    return {
        "set": "rs0",
        "date": _utcnow(),
        "myState": 1,
        "term": Int64(1),
        "heartbeatIntervalMillis": Int64(2000),
        "optimes": {"lastCommittedOpTime": optime, "appliedOpTime": optime, "durableOpTime": optime},
        "members": [
            {
                "_id": 0,
                "name": host.address,
                "health": 1.0,
                "state": 1,
                "stateStr": "PRIMARY",
                "uptime": int(time.monotonic() - host.started),
                "optime": optime,
                "optimeDate": ts.as_datetime() if ts.time else _utcnow(),
                "electionId": host.election_id,
                "configVersion": 1,
                "self": True,
            }
        ],
        "ok": 1.0,
    }


@command("connectionStatus", sessions=False)
async def cmd_connection_status(ctx: Context) -> Document:
    return {"authInfo": {"authenticatedUsers": [], "authenticatedUserRoles": []}, "ok": 1.0}


@command("whatsmyuri", sessions=False)
async def cmd_whatsmyuri(ctx: Context) -> Document:
    return {"you": ctx.conn.peer, "ok": 1.0}


@command("hostInfo", sessions=False)
async def cmd_host_info(ctx: Context) -> Document:
    return {
        "system": {"currentTime": _utcnow(), "hostname": socket.gethostname(), "cpuArch": platform.machine()},
        "os": {"type": platform.system(), "name": platform.platform()},
        "extra": {},
        "ok": 1.0,
    }


@command("configureFailPoint", failable=False, sessions=False)
async def cmd_configure_fail_point(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "configureFailPoint may only be run against the admin database.", code_name="Unauthorized"
        )
    reply = ctx.host.failpoints.configure(ctx.cmd)
    reply["ok"] = 1.0
    return reply


# ---------------------------------------------------------------------------------------------
# sessions and transactions


@command("endSessions", sessions=False)
async def cmd_end_sessions(ctx: Context) -> Document:
    ids = ctx.cmd.get("endSessions")
    if not isinstance(ids, list):
        raise CommandError(14, "BSON field 'endSessions' is the wrong type, expected type 'array'")
    for lsid in ids:
        if isinstance(lsid, dict) and "id" in lsid:
            session = ctx.host.sessions.end(lsid)
            if session is not None:
                ctx.host.cursors.kill_session(session.key)
    return {"ok": 1.0}


@command("refreshSessions", "killSessions", sessions=False)
async def cmd_refresh_sessions(ctx: Context) -> Document:
    ids = ctx.cmd.get(ctx.name)
    if not isinstance(ids, list):
        raise CommandError(14, f"BSON field '{ctx.name}' is the wrong type, expected type 'array'")
    for lsid in ids:
        if not isinstance(lsid, dict) or "id" not in lsid:
            continue
        if ctx.name == "killSessions":
            session = ctx.host.sessions.end(lsid)
            if session is not None:
                ctx.host.cursors.kill_session(session.key)
        else:
            ctx.host.sessions.get(lsid)
    return {"ok": 1.0}


@command("startSession", sessions=False)
async def cmd_start_session(ctx: Context) -> Document:
    lsid = {"id": Binary.from_uuid(uuid.uuid4(), UuidRepresentation.STANDARD)}
    ctx.host.sessions.get(lsid)
    return {"id": lsid, "timeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES, "ok": 1.0}


def _transaction_session(ctx: Context) -> tuple[Session, Transaction]:
    if ctx.session is None:
        raise CommandError(50768, f"{ctx.name} must be run within a session")
    if ctx.txn is None:
        if "txnNumber" not in ctx.cmd:
            raise CommandError(50768, f"{ctx.name} must be run within a transaction")
        raise ctx.host.sessions.no_such_transaction(int(ctx.cmd["txnNumber"]))
    return ctx.session, ctx.txn


@command("commitTransaction")
async def cmd_commit_transaction(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "commitTransaction may only be run against the admin database.", code_name="Unauthorized"
        )
    session, _ = _transaction_session(ctx)
    ctx.host.sessions.commit(session)
    reply: Document = {"ok": 1.0}
    wce = _write_concern_error(ctx)
    if wce is not None:
        reply["writeConcernError"] = wce
    return reply


@command("abortTransaction")
async def cmd_abort_transaction(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "abortTransaction may only be run against the admin database.", code_name="Unauthorized"
        )
    session, txn = _transaction_session(ctx)
    if txn.state is TxnState.COMMITTED:
        raise CommandError(
            256,
            "Cannot abort transaction since it has already been committed",
            code_name="TransactionCommitted",
        )
    if txn.state is TxnState.ABORTED:
        raise ctx.host.sessions.no_such_transaction(txn.number, aborted=True)
    ctx.host.sessions.abort(session)
    return {"ok": 1.0}


# ---------------------------------------------------------------------------------------------
# namespaces


def _collection_entry(coll: Collection, name_only: bool) -> Document:
    if name_only:
        return {"name": coll.name, "type": "collection"}
    return {
        "name": coll.name,
        "type": "collection",
        "options": dict(coll.options),
        "info": {"readOnly": False, "uuid": coll.uuid},
        "idIndex": dict(ID_INDEX),
    }


@command("listCollections")
async def cmd_list_collections(ctx: Context) -> Document:
    name_only = bool(ctx.cmd.get("nameOnly", False))
    query = _field(ctx, "filter", dict) or {}
    entries = [_collection_entry(c, name_only) for c in ctx.scope.catalog.collections(ctx.db)]
    if ctx.db == "local":
        entries.append(
            {"name": "oplog.rs", "type": "collection"}
            if name_only
            else {
                "name": "oplog.rs",
                "type": "collection",
                "options": {"capped": True, "size": Int64(MAX_MESSAGE_SIZE)},
                "info": {"readOnly": False},
            }
        )
    if query:
        try:
            entries = [e for e in entries if engine.matches(query, e)]
        except Exception as exc:
            raise crud.engine_error(exc) from None
    cursor = ListCursor(f"{ctx.db}.$cmd.listCollections", entries)
    return await _cursor_reply(ctx, cursor, _batch_size(ctx, _field(ctx, "cursor", dict)))


@command("listDatabases", sessions=False)
async def cmd_list_databases(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "listDatabases may only be run against the admin database.", code_name="Unauthorized"
        )
    catalog = ctx.host.catalog
    names = set(catalog.databases()) | {"admin", "config", "local"}
    # Sizes are nominal: documents live in memory, so a database reports one 8 KiB page per
    # collection (MongoDB's smallest allocation), which keeps totals monotonic and non-zero.
    sizes = {name: 8192 * max(len(catalog.collections(name)), 1) for name in names}
    entries: list[Document] = [
        {"name": name, "sizeOnDisk": Int64(sizes[name]), "empty": False} for name in sorted(names)
    ]
    query = _field(ctx, "filter", dict)
    if query:
        entries = [e for e in entries if engine.matches(query, e)]
    if ctx.cmd.get("nameOnly"):
        return {"databases": [{"name": e["name"]} for e in entries], "ok": 1.0}
    total = sum(sizes[e["name"]] for e in entries)
    return {
        "databases": entries,
        "totalSize": Int64(total),
        "totalSizeMb": Int64(total // (1024 * 1024)),
        "ok": 1.0,
    }


@command("dbStats")
async def cmd_db_stats(ctx: Context) -> Document:
    colls = ctx.scope.catalog.collections(ctx.db)
    objects = sum(len(c.docs) for c in colls)
    indexes = sum(len(c.indexes) for c in colls)
    return {
        "db": ctx.db,
        "collections": len(colls),
        "views": 0,
        "objects": objects,
        "indexes": indexes,
        "scaleFactor": 1,
        "ok": 1.0,
    }


_CREATE_OPTIONS = (
    "capped",
    "size",
    "max",
    "validator",
    "validationLevel",
    "validationAction",
    "changeStreamPreAndPostImages",
    "collation",
    "storageEngine",
    "indexOptionDefaults",
    "expireAfterSeconds",
    "clusteredIndex",
)


@command("create")
async def cmd_create(ctx: Context) -> Document:
    name = ctx.collection_name()
    for unsupported in ("viewOn", "timeseries"):
        if unsupported in ctx.cmd:
            raise CommandError(
                2, f"'{unsupported}' collections are not supported by the embedded replica set"
            )
    unknown = [
        k
        for k in ctx.cmd
        if k != "create"
        and k not in _GENERIC_FIELDS
        and k not in _CREATE_OPTIONS
        and k not in ("idIndex", "autoIndexId")
    ]
    if unknown:
        raise CommandError(
            40415, f"BSON field 'create.{unknown[0]}' is an unknown field.", code_name="Location40415"
        )
    options = {k: ctx.cmd[k] for k in _CREATE_OPTIONS if k in ctx.cmd}
    _validate_pre_post_images(options.get("changeStreamPreAndPostImages"), "create")
    if options.get("capped") and "size" not in options:
        raise CommandError(
            72, "the 'size' field is required when 'capped' is true", code_name="InvalidOptions"
        )
    crud.validate_collection_name(ctx.db, name)
    existing = ctx.get(name)
    if existing is not None:
        if existing.options == options:
            return {"ok": 1.0}
        raise CommandError(48, f"Collection {ctx.db}.{name} already exists.")
    ctx.scope.catalog.create(ctx.db, name, options)
    ctx.scope.emit(OplogOp("create", ctx.db, name, description={**options, "idIndex": dict(ID_INDEX)}))
    return {"ok": 1.0}


def _validate_pre_post_images(value: Any, command_name: str) -> None:
    if value is None:
        return
    field_name = f"{command_name}.changeStreamPreAndPostImages"
    if isinstance(value, dict) and "enabled" not in value:
        raise CommandError(40414, f"BSON field '{field_name}.enabled' is missing but a required field")
    if not isinstance(value, dict) or set(value) != {"enabled"} or not isinstance(value["enabled"], bool):
        raise CommandError(14, f"BSON field '{field_name}' must be {{enabled: <bool>}}")


@command("drop")
async def cmd_drop(ctx: Context) -> Document:
    name = ctx.collection_name()
    coll = ctx.scope.catalog.drop(ctx.db, name)
    if coll is None:
        # MongoDB 7+ answers ok for a missing collection.
        return {"ok": 1.0}
    ctx.scope.emit(OplogOp("drop", ctx.db, name))
    return {"nIndexesWas": len(coll.indexes), "ns": coll.ns, "ok": 1.0}


@command("dropDatabase")
async def cmd_drop_database(ctx: Context) -> Document:
    catalog = ctx.scope.catalog
    colls = catalog.collections(ctx.db)
    for coll in colls:
        catalog.drop(ctx.db, coll.name)
        ctx.scope.emit(OplogOp("drop", ctx.db, coll.name))
    if colls:
        ctx.scope.emit(OplogOp("dropDatabase", ctx.db, None))
    return {"ok": 1.0}


def _split_ns(value: Any, field_name: str) -> tuple[str, str]:
    if not isinstance(value, str) or "." not in value:
        raise CommandError(73, f"Invalid {field_name} namespace: {value!r}", code_name="InvalidNamespace")
    db, _, coll = value.partition(".")
    if not db or not coll:
        raise CommandError(73, f"Invalid {field_name} namespace: {value}", code_name="InvalidNamespace")
    return db, coll


@command("renameCollection")
async def cmd_rename_collection(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "renameCollection may only be run against the admin database.", code_name="Unauthorized"
        )
    src_db, src_name = _split_ns(ctx.cmd.get("renameCollection"), "source")
    dst_db, dst_name = _split_ns(ctx.cmd.get("to"), "target")
    crud.validate_collection_name(dst_db, dst_name)
    catalog = ctx.scope.catalog
    source = catalog.get(src_db, src_name)
    if source is None:
        raise CommandError(26, f"Source collection {src_db}.{src_name} does not exist")
    if (src_db, src_name) == (dst_db, dst_name):
        raise CommandError(20, "Can't rename a collection to itself")
    target = catalog.get(dst_db, dst_name)
    if target is not None:
        if not ctx.cmd.get("dropTarget"):
            raise CommandError(48, "target namespace exists")
        catalog.drop(dst_db, dst_name)
        ctx.scope.emit(OplogOp("drop", dst_db, dst_name))
    catalog.rename(source, dst_db, dst_name)
    ctx.scope.emit(
        OplogOp(
            "rename",
            src_db,
            src_name,
            to=(dst_db, dst_name),
            # As in MongoDB's oplog, dropTarget names the UUID of the collection it replaced.
            description={"to": {"db": dst_db, "coll": dst_name}}
            if target is None
            else {"to": {"db": dst_db, "coll": dst_name}, "dropTarget": target.uuid},
        )
    )
    return {"ok": 1.0}


@command("collMod")
async def cmd_coll_mod(ctx: Context) -> Document:
    name = ctx.collection_name()
    coll = ctx.get(name)
    if coll is None:
        raise CommandError(26, f"ns does not exist: {ctx.db}.{name}")
    changes: Document = {}
    reply: Document = {}
    for key, value in ctx.cmd.items():
        if key == "collMod" or key in _GENERIC_FIELDS:
            continue
        if key == "changeStreamPreAndPostImages":
            _validate_pre_post_images(value, "collMod")
            changes[key] = value
        elif key in ("validator", "validationLevel", "validationAction", "expireAfterSeconds"):
            changes[key] = value
        elif key == "index":
            reply.update(_coll_mod_index(coll, value))
            changes[key] = value
        else:
            raise CommandError(
                40415, f"BSON field 'collMod.{key}' is an unknown field.", code_name="Location40415"
            )
    state_before: Document = {"collectionOptions": dict(coll.options)}
    if "index" in changes:
        state_before["indexOptions"] = {
            k: reply[f"{k}_old"] for k in ("expireAfterSeconds", "hidden") if f"{k}_old" in reply
        }
    for key, value in changes.items():
        if key == "index":
            continue
        if key == "changeStreamPreAndPostImages" and not value.get("enabled"):
            coll.options.pop(key, None)
        else:
            coll.options[key] = value
    if changes:
        ctx.scope.emit(
            OplogOp("modify", ctx.db, name, description={**changes, "stateBeforeChange": state_before})
        )
    reply["ok"] = 1.0
    return reply


def _coll_mod_index(coll: Collection, spec: Any) -> Document:
    if not isinstance(spec, dict):
        raise CommandError(14, "BSON field 'collMod.index' is the wrong type, expected type 'object'")
    index = _find_index(coll, spec.get("name", spec.get("keyPattern")))
    reply: Document = {}
    if "expireAfterSeconds" in spec:
        reply["expireAfterSeconds_old"] = index.spec.get("expireAfterSeconds")
        index.spec["expireAfterSeconds"] = spec["expireAfterSeconds"]
        reply["expireAfterSeconds_new"] = spec["expireAfterSeconds"]
    if "hidden" in spec:
        reply["hidden_old"] = bool(index.spec.get("hidden", False))
        if spec["hidden"]:
            index.spec["hidden"] = True
        else:
            index.spec.pop("hidden", None)
        reply["hidden_new"] = bool(spec["hidden"])
    return reply


def _find_index(coll: Collection, which: Any) -> IndexSpec:
    if isinstance(which, str):
        index = coll.indexes.get(which)
        if index is None:
            raise CommandError(27, f"index not found with name [{which}]", code_name="IndexNotFound")
        return index
    if isinstance(which, dict):
        for index in coll.indexes.values():
            if index.key == dict(which):
                return index
        raise CommandError(27, f"can't find index with key: {which}", code_name="IndexNotFound")
    raise CommandError(2, "index must be specified by name or key pattern")


# ---------------------------------------------------------------------------------------------
# writes


@command("insert", counter="insert", retryable=True)
async def cmd_insert(ctx: Context) -> Document:
    name = ctx.collection_name()
    documents = _field(ctx, "documents", list)
    if documents is None:
        raise CommandError(40414, "BSON field 'insert.documents' is missing but a required field")
    if not documents:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    n, errors = crud.insert_documents(ctx.scope, ctx.db, name, documents, ordered=ordered)
    reply: Document = {"n": n}
    if errors:
        reply["writeErrors"] = errors
    return _write_reply(ctx, reply)


def _statement_error(position: int, exc: Exception) -> Document:
    if isinstance(exc, DuplicateKey):
        return exc.write_error(position)
    assert isinstance(exc, CommandError)
    return {"index": position, "code": exc.code, "errmsg": exc.errmsg}


@command("update", counter="update", retryable=True)
async def cmd_update(ctx: Context) -> Document:
    name = ctx.collection_name()
    statements = _field(ctx, "updates", list)
    if not statements:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    matched = modified = 0
    upserted: list[Document] = []
    errors: list[Document] = []
    for position, statement in enumerate(statements):
        try:
            if not isinstance(statement, dict) or "q" not in statement or "u" not in statement:
                raise CommandError(40414, "BSON field 'update.updates.q' is missing but a required field")
            query = statement["q"]
            if not isinstance(query, dict):
                raise CommandError(
                    14, "BSON field 'update.updates.q' is the wrong type, expected type 'object'"
                )
            result = crud.update_one_statement(
                ctx.scope,
                ctx.db,
                name,
                query,
                statement["u"],
                multi=bool(statement.get("multi", False)),
                upsert=bool(statement.get("upsert", False)),
                array_filters=statement.get("arrayFilters"),
                sort=statement.get("sort"),
            )
        except (CommandError, DuplicateKey) as exc:
            if isinstance(exc, CommandError) and exc.code == 112:
                raise
            errors.append(_statement_error(position, exc))
            if ordered:
                break
            continue
        if result.upserted:
            matched += 1
            upserted.append({"index": position, "_id": result.upserted_id})
        else:
            matched += result.matched
            modified += result.modified
    reply: Document = {"n": matched, "nModified": modified}
    if upserted:
        reply["upserted"] = upserted
    if errors:
        reply["writeErrors"] = errors
    return _write_reply(ctx, reply)


@command("delete", counter="delete", retryable=True)
async def cmd_delete(ctx: Context) -> Document:
    name = ctx.collection_name()
    statements = _field(ctx, "deletes", list)
    if not statements:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    deleted = 0
    errors: list[Document] = []
    for position, statement in enumerate(statements):
        try:
            if not isinstance(statement, dict) or "q" not in statement or "limit" not in statement:
                raise CommandError(40414, "BSON field 'delete.deletes.limit' is missing but a required field")
            limit = statement["limit"]
            if limit not in (0, 1):
                raise CommandError(9, f"The limit field in delete objects must be 0 or 1. Got {limit}")
            deleted += len(crud.delete_statement(ctx.scope, ctx.db, name, statement["q"], limit=int(limit)))
        except CommandError as exc:
            if exc.code == 112:
                raise
            errors.append(_statement_error(position, exc))
            if ordered:
                break
    reply: Document = {"n": deleted}
    if errors:
        reply["writeErrors"] = errors
    return _write_reply(ctx, reply)


@command("findAndModify", "findandmodify", counter="command", retryable=True)
async def cmd_find_and_modify(ctx: Context) -> Document:
    name = ctx.collection_name()
    cmd = ctx.cmd
    query = _field(ctx, "query", dict) or {}
    sort = _field(ctx, "sort", dict)
    fields = _field(ctx, "fields", dict)
    remove = bool(cmd.get("remove", False))
    update = cmd.get("update")
    new = bool(cmd.get("new", False))
    upsert = bool(cmd.get("upsert", False))
    if remove and update is not None:
        raise CommandError(9, "Cannot specify both an update and remove=true")
    if not remove and update is None:
        raise CommandError(9, "Either an update or remove=true must be specified")
    if remove and new:
        raise CommandError(
            9, "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document"
        )
    if remove and upsert:
        raise CommandError(9, "Cannot specify both upsert=true and remove=true ")
    tools = ctx.scope.catalog.engine[ctx.db][name]
    try:
        if remove:
            deleted = crud.delete_statement(ctx.scope, ctx.db, name, query, limit=1, sort=sort)
            value = crud.project(tools, deleted, fields)[0] if deleted else None
            return _write_reply(ctx, {"lastErrorObject": {"n": len(deleted)}, "value": value})
        result = crud.update_one_statement(
            ctx.scope,
            ctx.db,
            name,
            query,
            update,
            multi=False,
            upsert=upsert,
            array_filters=cmd.get("arrayFilters"),
            sort=sort,
        )
    except DuplicateKey as dup:
        raise dup.command_error() from None
    last_error: Document = {
        "n": 1 if (result.matched or result.upserted) else 0,
        "updatedExisting": bool(result.matched),
    }
    if result.upserted:
        last_error["upserted"] = result.upserted_id
    chosen = result.after if new else (None if result.upserted else result.before)
    value = crud.project(tools, [chosen], fields)[0] if chosen is not None else None
    return _write_reply(ctx, {"lastErrorObject": last_error, "value": value})


# ---------------------------------------------------------------------------------------------
# reads


@command("find", counter="query")
async def cmd_find(ctx: Context) -> Document:
    name = ctx.collection_name()
    cmd = ctx.cmd
    query = _field(ctx, "filter", dict) or {}
    sort = _field(ctx, "sort", dict)
    projection = _field(ctx, "projection", dict)
    skip = _non_negative(ctx, "skip", cmd.get("skip"))
    limit = _non_negative(ctx, "limit", cmd.get("limit"))
    batch_size = _batch_size(ctx, cmd)
    single_batch = bool(cmd.get("singleBatch", False))
    ns = f"{ctx.db}.{name}"
    if ctx.db == "local" and name == "oplog.rs":
        docs = _oplog_rs(ctx, query, sort, skip, limit)
    else:
        coll = ctx.get(name)
        docs = crud.select(coll, query, sort=sort, skip=skip, limit=limit)
    if projection:
        docs = crud.project(ctx.scope.catalog.engine[ctx.db][name], docs, projection)
    if limit and batch_size is None and limit <= len(docs):
        # A limit that fits one batch comes back whole, as MongoDB closes such cursors at once.
        batch_size = limit
    cursor = ListCursor(ns, docs, single_batch=single_batch)
    return await _cursor_reply(ctx, cursor, batch_size, no_timeout=bool(cmd.get("noCursorTimeout", False)))


def _oplog_rs(ctx: Context, query: Document, sort: Document | None, skip: int, limit: int) -> list[Document]:
    natural = 1
    if sort:
        if set(sort) != {"$natural"}:
            raise CommandError(2, "local.oplog.rs can only be sorted by $natural on the embedded replica set")
        natural = -1 if sort["$natural"] < 0 else 1
    plain = not query and not skip
    docs = ctx.host.oplog.oplog_rs_find(natural, limit if (plain and limit) else None)
    if query:
        try:
            docs = [d for d in docs if engine.matches(query, d)]
        except Exception as exc:
            raise crud.engine_error(exc) from None
    if skip:
        docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    return docs


@command("getMore", counter="getmore")
async def cmd_get_more(ctx: Context) -> Document:
    cursor_id = ctx.cmd.get("getMore")
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        raise CommandError(
            14,
            f"BSON field 'getMore.getMore' is the wrong type '{_type_name(cursor_id)}', expected type 'long'",
        )
    collection = ctx.cmd.get("collection")
    if not isinstance(collection, str):
        raise CommandError(40414, "BSON field 'getMore.collection' is missing but a required field")
    batch_size = _batch_size(ctx, ctx.cmd)
    max_time = ctx.cmd.get("maxTimeMS")
    if max_time is not None and (
        isinstance(max_time, bool) or not isinstance(max_time, (int, float)) or max_time < 0
    ):
        raise CommandError(2, f"{max_time!r} value for maxTimeMS is out of range")
    registry = ctx.host.cursors
    cursor = registry.lookup(cursor_id)
    ns = f"{ctx.db}.{collection}"
    if cursor.ns != ns:
        raise CommandError(
            13,
            f"Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {cursor.ns}",
            code_name="Unauthorized",
        )
    registry.checkout(cursor_id)
    try:
        batch, extra = await cursor.fetch(
            batch_size, int(max_time) if max_time is not None else None, first=False
        )
    except CommandError:
        # A getMore that fails kills its cursor, as MongoDB does.
        registry.kill(cursor_id)
        raise
    except BaseException:
        # The client went away mid-getMore (or the server is stopping): the cursor's position is
        # no longer something a client can rely on, so it dies with the operation.
        registry.kill(cursor_id)
        raise
    registry.checkin(cursor_id)
    reply_id = Int64(cursor_id)
    if cursor.exhausted:
        registry.kill(cursor_id)
        reply_id = Int64(0)
    return {"cursor": {"nextBatch": batch, "id": reply_id, "ns": cursor.ns, **extra}, "ok": 1.0}


@command("killCursors")
async def cmd_kill_cursors(ctx: Context) -> Document:
    ids = ctx.cmd.get("cursors")
    if not isinstance(ids, list):
        raise CommandError(40414, "BSON field 'killCursors.cursors' is missing but a required field")
    killed: list[Int64] = []
    missing: list[Int64] = []
    for cursor_id in ids:
        (killed if ctx.host.cursors.kill(int(cursor_id)) else missing).append(Int64(cursor_id))
    return {
        "cursorsKilled": killed,
        "cursorsNotFound": missing,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    }


@command("count", counter="command")
async def cmd_count(ctx: Context) -> Document:
    name = ctx.collection_name()
    query = _field(ctx, "query", dict) or {}
    skip = _non_negative(ctx, "skip", ctx.cmd.get("skip"))
    limit_value = ctx.cmd.get("limit")
    limit = (
        abs(int(limit_value))
        if isinstance(limit_value, (int, float)) and not isinstance(limit_value, bool)
        else 0
    )
    docs = crud.select(ctx.get(name), query, skip=skip, limit=limit)
    return {"n": len(docs), "ok": 1.0}


@command("distinct", counter="command")
async def cmd_distinct(ctx: Context) -> Document:
    name = ctx.collection_name()
    key = ctx.cmd.get("key")
    if not isinstance(key, str):
        raise CommandError(40414, "BSON field 'distinct.key' is missing but a required field")
    query = _field(ctx, "query", dict) or {}
    return {"values": crud.distinct(ctx.get(name), key, query), "ok": 1.0}


@command("aggregate", counter="command")
async def cmd_aggregate(ctx: Context) -> Document:
    cmd = ctx.cmd
    target = cmd.get("aggregate")
    coll_name: str | None
    if target == 1 or (isinstance(target, float) and target == 1.0):
        coll_name = None
    else:
        coll_name = ctx.collection_name()
    pipeline = _field(ctx, "pipeline", list)
    if pipeline is None:
        raise CommandError(40414, "BSON field 'aggregate.pipeline' is missing but a required field")
    if cmd.get("explain"):
        raise CommandError(2, "explain is not supported by the embedded replica set")
    cursor_opts = _field(ctx, "cursor", dict)
    if cursor_opts is None:
        raise CommandError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    batch_size = _batch_size(ctx, cursor_opts)
    first = pipeline[0] if pipeline else None
    if isinstance(first, dict) and "$changeStream" in first:
        if ctx.in_transaction:
            raise CommandError(
                263, "Cannot run aggregate with $changeStream in a multi-document transaction."
            )
        # Imported here so the rest of the server never depends on the change-stream engine.
        from flowwarden.testing.embedded.changestream import open_change_stream

        stream = await open_change_stream(ctx.host, ctx.db, coll_name, pipeline, cmd)
        return await _cursor_reply(ctx, stream, batch_size)
    if coll_name is None:
        stage = next(iter(first), "") if isinstance(first, dict) else ""
        raise CommandError(
            73,
            f"{{aggregate: 1}} is not valid for '{stage}'; a collection is required.",
            code_name="InvalidNamespace",
        )
    if ctx.in_transaction:
        # Stages that read other collections must see the transaction's snapshot of them too.
        ctx.scope.catalog.collections(ctx.db)
    docs = crud.run_pipeline(ctx.scope.catalog, ctx.db, coll_name, pipeline)
    return await _cursor_reply(ctx, ListCursor(f"{ctx.db}.{coll_name}", docs), batch_size)


# ---------------------------------------------------------------------------------------------
# indexes

_INDEX_TYPES = ("text", "2dsphere", "2d", "hashed", "geoHaystack")


def _validate_index_spec(spec: Any) -> Document:
    if not isinstance(spec, dict):
        raise CommandError(14, "the index specification must be an object")
    key = spec.get("key")
    if not isinstance(key, dict) or not key:
        raise CommandError(
            67,
            f"Error in specification {spec} :: caused by :: The 'key' field must be a non-empty object",
            code_name="CannotCreateIndex",
        )
    for field_name, direction in key.items():
        numeric = isinstance(direction, (int, float)) and not isinstance(direction, bool) and direction != 0
        if not numeric and direction not in _INDEX_TYPES:
            raise CommandError(
                67,
                f"Error in specification {spec} :: caused by :: Values in the index key pattern can only be "
                "positive or negative numbers or one of the index type strings, "
                f"found {field_name}: {direction!r}",
                code_name="CannotCreateIndex",
            )
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise CommandError(
            9,
            f"Error in specification {spec} :: caused by :: The 'name' field is a required property of an "
            "index specification",
        )
    if name == "*":
        raise CommandError(67, "The index name '*' is not valid.", code_name="CannotCreateIndex")
    ttl = spec.get("expireAfterSeconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0):
        raise CommandError(
            67,
            f"TTL index 'expireAfterSeconds' option must be a non-negative number: {ttl!r}",
            code_name="CannotCreateIndex",
        )
    return spec


def _comparable(spec: Document) -> Document:
    return {k: v for k, v in spec.items() if k not in ("v", "name", "ns", "background")}


@command("createIndexes")
async def cmd_create_indexes(ctx: Context) -> Document:
    name = ctx.collection_name()
    specs = _field(ctx, "indexes", list)
    if not specs:
        raise CommandError(2, "Must specify at least one index to create")
    specs = [_validate_index_spec(s) for s in specs]
    created_collection = ctx.get(name) is None
    coll = crud.ensure_collection(ctx.scope, ctx.db, name)
    before = len(coll.indexes)
    to_build: list[IndexSpec] = []
    for spec in specs:
        wanted = IndexSpec.from_spec(spec)
        same_name = coll.indexes.get(wanted.name)
        if same_name is not None:
            if _comparable(same_name.spec) == _comparable(wanted.spec):
                continue
            raise CommandError(
                86,
                "An existing index has the same name as the requested index. When index names are not "
                "specified, they are auto generated and can cause conflicts. Please refer to our "
                f"documentation. Requested index: {wanted.spec}, existing index: {same_name.spec}",
                code_name="IndexKeySpecsConflict",
            )
        for existing in coll.indexes.values():
            if (
                existing.key == wanted.key
                and (existing.spec.get("collation") == wanted.spec.get("collation"))
                and existing.spec.get("partialFilterExpression") == wanted.spec.get("partialFilterExpression")
            ):
                if _comparable(existing.spec) == _comparable(wanted.spec):
                    raise CommandError(
                        85,
                        f"Index already exists with a different name: {existing.name}",
                        code_name="IndexOptionsConflict",
                    )
                raise CommandError(
                    85,
                    f"An equivalent index already exists with a different name and options. Requested index: "
                    f"{wanted.spec}, existing index: {existing.spec}",
                    code_name="IndexOptionsConflict",
                )
        to_build.append(wanted)
    for index in to_build:
        try:
            coll.add_index(index)
        except DuplicateKey as dup:
            raise CommandError(
                11000,
                f"Index build failed: {coll.uuid.as_uuid()}: Collection {coll.ns} ( {coll.uuid.as_uuid()} ) "
                f":: caused by :: {dup.errmsg}",
                extra={"keyPattern": dup.key_pattern, "keyValue": dup.key_value},
            ) from None
        ctx.scope.emit(OplogOp("createIndexes", ctx.db, name, description={"indexes": [dict(index.spec)]}))
    reply: Document = {
        "numIndexesBefore": before,
        "numIndexesAfter": len(coll.indexes),
        "createdCollectionAutomatically": created_collection,
    }
    if not to_build:
        reply["note"] = "all indexes already exist"
    reply["ok"] = 1.0
    return reply


@command("listIndexes")
async def cmd_list_indexes(ctx: Context) -> Document:
    name = ctx.collection_name()
    coll = ctx.get(name)
    if coll is None:
        raise CommandError(26, f"ns does not exist: {ctx.db}.{name}")
    specs = [dict(index.spec) for index in coll.indexes.values()]
    cursor = ListCursor(f"{ctx.db}.{name}", specs)
    return await _cursor_reply(ctx, cursor, _batch_size(ctx, _field(ctx, "cursor", dict)))


@command("dropIndexes", "deleteIndexes")
async def cmd_drop_indexes(ctx: Context) -> Document:
    name = ctx.collection_name()
    coll = ctx.get(name)
    if coll is None:
        raise CommandError(26, f"ns not found {ctx.db}.{name}")
    which = ctx.cmd.get("index")
    before = len(coll.indexes)
    if which == "*":
        doomed = [n for n in coll.indexes if n != "_id_"]
    elif isinstance(which, list):
        doomed = [_find_index(coll, n).name for n in which]
    else:
        doomed = [_find_index(coll, which).name]
    if "_id_" in doomed:
        raise CommandError(72, "cannot drop _id index", code_name="InvalidOptions")
    for index_name in doomed:
        index = coll.indexes.pop(index_name)
        ctx.scope.emit(OplogOp("dropIndexes", ctx.db, name, description={"indexes": [dict(index.spec)]}))
    return {"nIndexesWas": before, "ok": 1.0}


# ---------------------------------------------------------------------------------------------
# TTL monitor


def expire_ttl_documents(host: ReplicaSetHost) -> int:
    """Delete documents past their TTL index's expiry, logged as deletes like MongoDB's TTL monitor."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    removed = 0
    catalog = host.catalog
    for db in catalog.databases():
        for coll in catalog.collections(db):
            for index in list(coll.indexes.values()):
                seconds = index.spec.get("expireAfterSeconds")
                if seconds is None or len(index.key) != 1:
                    continue
                (path,) = index.key
                cutoff = now - datetime.timedelta(seconds=float(seconds))
                for doc in list(coll.docs.values()):
                    if _expired(doc.get(path) if "." not in path else None, cutoff):
                        removed += len(
                            crud.delete_statement(
                                Scope(catalog, host._emit), db, coll.name, {"_id": doc["_id"]}, limit=1
                            )
                        )
    return removed


def _expired(value: Any, cutoff: datetime.datetime) -> bool:
    values = value if isinstance(value, list) else [value]
    dates = [v.replace(tzinfo=None) if v.tzinfo else v for v in values if isinstance(v, datetime.datetime)]
    return bool(dates) and min(dates) <= cutoff
