"""What the server reports about itself: ``buildInfo``, ``serverStatus``, ``replSetGetStatus``,
``replSetGetConfig``, ``connectionStatus``, ``whatsmyuri`` and ``hostInfo``.

Every reply here is read-only: these commands look at the host's state and never change it. They
answer for the process the client reached: a mongos reports no replication, refuses
``replSetGetStatus`` as mongos does, and has no ``replSetGetConfig`` (CommandNotFound). A
member's configuration is that of a replica set of one: itself, ``_id`` 0, priority 1, one vote,
configuration version 1 and term 1, as ``hello`` and ``replSetGetStatus`` report them.
"""

from __future__ import annotations

import platform
import socket
import time

from bson import Int64, Timestamp

from flowwarden_embedded.commands.handshake import SERVER_VERSION, hello_reply, utcnow
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.limits import MAX_BSON_OBJECT_SIZE
from flowwarden_embedded.storage import Document
from flowwarden_embedded.topology import Role


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


@command("serverStatus", sessions=False)
async def cmd_server_status(ctx: Context) -> Document:
    host = ctx.host
    process = ctx.conn.process
    elapsed = max(0.0, time.monotonic() - host.started)
    status: Document = {
        "host": socket.gethostname(),
        "version": SERVER_VERSION,
        "process": process.role.value,
        "pid": Int64(host.pid()),
        "uptime": float(int(elapsed)),
        "uptimeMillis": Int64(int(elapsed * 1000)),
        "uptimeEstimate": Int64(int(elapsed)),
        "localTime": utcnow(),
        "connections": {
            "current": host.connections_current,
            "available": 1_000_000 - host.connections_current,
            "totalCreated": host.connections_total,
            "active": host.connections_current,
        },
        "opcounters": {k: Int64(v) for k, v in host.opcounters.items()},
        "metrics": {"cursor": {"open": {"total": Int64(len(host.cursors))}}},
        "logicalSessionRecordCache": {"activeSessionsCount": len(host.sessions)},
    }
    if not process.is_mongos:
        hello = hello_reply(host, ctx.conn, legacy=False, hello_ok=False)
        status["repl"] = {k: hello[k] for k in _REPL_FIELDS}
        status["storageEngine"] = {"name": "embedded", "supportsCommittedReads": True, "persistent": False}
    status["ok"] = 1.0
    return status


_REPL_FIELDS = (
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


@command("replSetGetStatus", sessions=False)
async def cmd_repl_set_get_status(ctx: Context) -> Document:
    if ctx.conn.process.is_mongos:
        # mongos has the command only to say this (with no code: clients read it as UnknownError).
        raise CommandError(8, "replSetGetStatus is not supported through mongos", extra={"info": "mongos"})
    host = ctx.host
    ts: Timestamp = host.oplog_of(ctx.conn.process).cluster_time
    optime = {"ts": ts, "t": Int64(1)}
    return {
        "set": ctx.conn.process.set_name,
        "date": utcnow(),
        "myState": 1,
        "term": Int64(1),
        "heartbeatIntervalMillis": Int64(2000),
        "optimes": {"lastCommittedOpTime": optime, "appliedOpTime": optime, "durableOpTime": optime},
        "members": [
            {
                "_id": 0,
                "name": ctx.conn.process.address,
                "health": 1.0,
                "state": 1,
                "stateStr": "PRIMARY",
                "uptime": int(time.monotonic() - host.started),
                "optime": optime,
                "optimeDate": ts.as_datetime() if ts.time else utcnow(),
                "electionId": host.election_id,
                "configVersion": 1,
                "self": True,
            }
        ],
        "ok": 1.0,
    }


@command("replSetGetConfig", sessions=False, roles=frozenset({Role.MEMBER}))
async def cmd_repl_set_get_config(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "replSetGetConfig may only be run against the admin database.", code_name="Unauthorized"
        )
    process = ctx.conn.process
    config: Document = {
        "_id": process.set_name,
        "version": 1,
        "term": 1,
        "members": [
            {
                "_id": 0,
                "host": process.address,
                "arbiterOnly": False,
                "buildIndexes": True,
                "hidden": False,
                "priority": 1.0,
                "tags": {},
                "secondaryDelaySecs": Int64(0),
                "votes": 1,
            }
        ],
        "protocolVersion": Int64(1),
        "writeConcernMajorityJournalDefault": True,
        "settings": {
            "chainingAllowed": True,
            "heartbeatIntervalMillis": 2000,
            "heartbeatTimeoutSecs": 10,
            "electionTimeoutMillis": 10000,
            "catchUpTimeoutMillis": -1,
            "catchUpTakeoverDelayMillis": 30000,
            "getLastErrorModes": {},
            "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
            "replicaSetId": process.replica_set_id,
        },
    }
    reply: Document = {"config": config}
    if ctx.cmd.get("commitmentStatus"):
        # The configuration of a set of one is committed as soon as it is installed.
        reply["commitmentStatus"] = True
    reply["ok"] = 1.0
    return reply


@command("connectionStatus", sessions=False)
async def cmd_connection_status(ctx: Context) -> Document:
    return {"authInfo": {"authenticatedUsers": [], "authenticatedUserRoles": []}, "ok": 1.0}


@command("whatsmyuri", sessions=False)
async def cmd_whatsmyuri(ctx: Context) -> Document:
    return {"you": ctx.conn.peer, "ok": 1.0}


@command("hostInfo", sessions=False)
async def cmd_host_info(ctx: Context) -> Document:
    return {
        "system": {"currentTime": utcnow(), "hostname": socket.gethostname(), "cpuArch": platform.machine()},
        "os": {"type": platform.system(), "name": platform.platform()},
        "extra": {},
        "ok": 1.0,
    }
