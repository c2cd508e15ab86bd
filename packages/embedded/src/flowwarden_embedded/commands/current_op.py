"""What a server is doing: the ``$currentOp`` stage, the ``currentOp`` command and ``killOp``,
all against the ``admin`` database, as mongod answers them.

Each operation in progress (:mod:`~flowwarden_embedded.operations`) is one document with
mongod's fields: ``type``, ``host``, ``desc``, ``connectionId``, ``client``, ``appName`` and
``clientMetadata`` (what the connection's handshake said), ``active``, ``currentOpTime``,
``opid``, ``lsid``, ``secs_running``, ``microsecs_running``, ``op``, ``ns``, ``command``, a
``getMore``'s ``originatingCommand`` and ``cursor``, ``numYields`` and the lock fields (no
operation here ever waits for a lock). The listing includes the ``currentOp`` that asks.
``idleConnections`` adds the connections running nothing, ``idleCursors`` the cursors no
``getMore`` is using. ``truncateOps`` (the ``currentOp`` command's default) shows a command of
more than 1 KB as ``{$truncated: <its start>}``.

A process lists the operations it received: a replica set member those sent to it, a mongos
those sent to the mongos (what mongos lists with ``localOps: true``; MongoDB's default shows the
shards' parts of them instead).
"""

from __future__ import annotations

import datetime
import socket
import time
from typing import Any

from bson import Int64, json_util

from flowwarden_embedded import engine
from flowwarden_embedded.commands.arguments import GENERIC_FIELDS, bson_type_name
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import format_value
from flowwarden_embedded.operations import Operation, iso_time
from flowwarden_embedded.rawstrings import encode
from flowwarden_embedded.storage import Document

_STAGE_OPTIONS = (
    "allUsers",
    "idleConnections",
    "idleCursors",
    "idleSessions",
    "localOps",
    "truncateOps",
    "backtrace",
    "targetAllNodes",
)
_TRUNCATE_BYTES = 1024


def _admin_only(ctx: Context, what: str) -> None:
    if ctx.db != "admin":
        raise CommandError(
            13, f"{what} may only be run against the admin database.", code_name="Unauthorized"
        )


def _host(ctx: Context) -> str:
    return f"{socket.gethostname()}:{ctx.conn.process.port}"


def _shown(cmd: Document, truncate: bool) -> Document:
    """The command as currentOp shows it: whole, or cut to its first kilobyte when truncating."""
    if not truncate:
        return cmd
    try:
        size = len(encode(cmd))
    except Exception:
        size = _TRUNCATE_BYTES + 1
    if size <= _TRUNCATE_BYTES:
        return cmd
    try:
        text = json_util.dumps(cmd)
    except Exception:
        text = repr(cmd)
    shown: Document = {"$truncated": text[:_TRUNCATE_BYTES]}
    if "comment" in cmd:
        shown["comment"] = cmd["comment"]
    return shown


def operation_document(ctx: Context, op: Operation, now: datetime.datetime, truncate: bool) -> Document:
    """One operation in progress as ``currentOp`` lists it."""
    conn = op.conn
    doc: Document = {
        "type": "op",
        "host": _host(ctx),
        "desc": f"conn{conn.id}",
        "connectionId": conn.id,
        "client": conn.peer,
    }
    if conn.app_name is not None:
        doc["appName"] = conn.app_name
    if conn.metadata is not None:
        doc["clientMetadata"] = conn.metadata
    elapsed = max(0.0, time.monotonic() - op.started)
    doc.update(
        {
            "active": True,
            "currentOpTime": iso_time(now),
            "threaded": True,
            "opid": op.opid,
        }
    )
    lsid = op.command.get("lsid")
    if lsid is not None:
        doc["lsid"] = lsid
    doc.update(
        {
            "secs_running": Int64(int(elapsed)),
            "microsecs_running": Int64(int(elapsed * 1_000_000)),
            "op": op.op,
            "ns": op.ns,
            "redacted": False,
            "command": _shown(op.command, truncate),
        }
    )
    if op.originating_command is not None:
        doc["originatingCommand"] = _shown(op.originating_command, truncate)
    if op.cursor is not None:
        cursor = dict(op.cursor)
        if "originatingCommand" in cursor:
            cursor["originatingCommand"] = _shown(cursor["originatingCommand"], truncate)
        doc["cursor"] = cursor
    if op.killed:
        doc["killPending"] = True
    doc.update(
        {
            "numYields": 0,
            "locks": {},
            "waitingForLock": False,
            "lockStats": {},
            "waitingForFlowControl": False,
            "flowControlStats": {},
        }
    )
    return doc


def in_progress(
    ctx: Context, *, idle_connections: bool, idle_cursors: bool, truncate: bool
) -> list[Document]:
    """Every operation the process that ``ctx`` reached is running, then what the flags add."""
    now = datetime.datetime.now(datetime.timezone.utc)
    process = ctx.conn.process
    busy: set[int] = set()
    out: list[Document] = []
    for op in ctx.host.operations.running():
        if op.conn.process is not process:
            continue
        busy.add(op.conn.id)
        out.append(operation_document(ctx, op, now, truncate))
    if idle_connections:
        for conn in list(ctx.host.connections.values()):
            if conn.process is not process or conn.id in busy:
                continue
            doc: Document = {
                "type": "op",
                "host": _host(ctx),
                "desc": f"conn{conn.id}",
                "connectionId": conn.id,
                "client": conn.peer,
            }
            if conn.app_name is not None:
                doc["appName"] = conn.app_name
            if conn.metadata is not None:
                doc["clientMetadata"] = conn.metadata
            doc["active"] = False
            doc["currentOpTime"] = iso_time(now)
            out.append(doc)
    if idle_cursors:
        for ns, _, cursor in ctx.host.cursors.idle():
            entry: Document = {"type": "idleCursor", "host": _host(ctx), "ns": ns}
            if "originatingCommand" in cursor:
                cursor["originatingCommand"] = _shown(cursor["originatingCommand"], truncate)
            entry["cursor"] = cursor
            out.append(entry)
    return out


def current_op_stage(ctx: Context, coll_name: str | None, spec: Any) -> list[Document]:
    """What a ``$currentOp`` stage with ``spec`` outputs."""
    if ctx.db != "admin" or coll_name is not None:
        raise CommandError(
            73,
            "$currentOp must be run against the 'admin' database with {aggregate: 1}",
            code_name="InvalidNamespace",
        )
    if not isinstance(spec, dict):
        raise CommandError(
            9, f"$currentOp options must be specified in an object, but found: {format_value(spec)}"
        )
    flags: dict[str, bool] = {}
    for key, value in spec.items():
        if key not in _STAGE_OPTIONS:
            raise CommandError(9, f"Unrecognized option '{key}' in $currentOp stage.")
        if not isinstance(value, bool):
            raise CommandError(
                9,
                f"The '{key}' parameter of the $currentOp stage must be a boolean value, but found: "
                f"{bson_type_name(value)}",
            )
        flags[key] = value
    return in_progress(
        ctx,
        idle_connections=flags.get("idleConnections", False),
        idle_cursors=flags.get("idleCursors", False),
        truncate=flags.get("truncateOps", False),
    )


@command("currentOp", sessions=False)
async def cmd_current_op(ctx: Context) -> Document:
    _admin_only(ctx, "currentOp")
    everything = bool(ctx.cmd.get("$all", False))
    ops = in_progress(ctx, idle_connections=everything, idle_cursors=False, truncate=True)
    query = {
        k: v
        for k, v in ctx.cmd.items()
        if k not in ("currentOp", "$all", "$ownOps", "$truncateOps") and k not in GENERIC_FIELDS
    }
    if query and not everything:
        try:
            ops = [op for op in ops if engine.matches(query, op)]
        except engine.ENGINE_ERRORS as exc:
            raise engine.command_error(exc) from None
    return {"inprog": ops, "ok": 1.0}


@command("killOp", sessions=False)
async def cmd_kill_op(ctx: Context) -> Document:
    _admin_only(ctx, "killOp")
    opid = ctx.cmd.get("op")
    if opid is None:
        raise CommandError(4, 'Did not provide "op" field', code_name="NoSuchKey")
    if isinstance(opid, bool) or not isinstance(opid, (int, float)):
        raise CommandError(
            14, f"BSON field 'killOp.op' is the wrong type '{bson_type_name(opid)}', expected type 'int'"
        )
    ctx.host.operations.kill(int(opid))
    return {"info": "attempting to kill op", "ok": 1.0}
