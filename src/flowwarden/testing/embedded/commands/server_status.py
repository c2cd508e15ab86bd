"""What the server reports about itself: ``buildInfo``, ``serverStatus``, ``replSetGetStatus``,
``connectionStatus``, ``whatsmyuri`` and ``hostInfo``.

Every reply here is read-only: these commands look at the host's state and never change it.
"""

from __future__ import annotations

import platform
import socket
import time

from bson import Int64, Timestamp

from flowwarden.testing.embedded.commands.handshake import SERVER_VERSION, hello_reply, utcnow
from flowwarden.testing.embedded.commands.registry import Context, command
from flowwarden.testing.embedded.limits import MAX_BSON_OBJECT_SIZE
from flowwarden.testing.embedded.storage import Document


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
        "localTime": utcnow(),
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
        "date": utcnow(),
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
                "optimeDate": ts.as_datetime() if ts.time else utcnow(),
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
        "system": {"currentTime": utcnow(), "hostname": socket.gethostname(), "cpuArch": platform.machine()},
        "os": {"type": platform.system(), "name": platform.platform()},
        "extra": {},
        "ok": 1.0,
    }
