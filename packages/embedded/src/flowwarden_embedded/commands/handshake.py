"""The handshake: ``hello``/``isMaster`` and ``ping``, and the identity a handshake advertises.

The version, wire version and limits here are what every client learns about the server before
it sends anything else; ``buildInfo`` and ``serverStatus`` report the same values, so the
constants live here once.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import TYPE_CHECKING

from bson import Int64, Timestamp

from flowwarden_embedded import wire
from flowwarden_embedded.commands.arguments import bson_type_name
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.limits import MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE
from flowwarden_embedded.storage import Document

if TYPE_CHECKING:
    from flowwarden_embedded.host import ConnectionInfo, ReplicaSetHost

# MongoDB 7.0 speaks wire version 21; buildInfo must report a matching version.
MAX_WIRE_VERSION = 21
SERVER_VERSION = "7.0.14"
FEATURE_COMPATIBILITY_VERSION = "7.0"
MAX_WRITE_BATCH_SIZE = 100_000
LOGICAL_SESSION_TIMEOUT_MINUTES = 30


def utcnow() -> datetime.datetime:
    """Now, in UTC: the ``localTime`` and other dates that replies carry."""
    return datetime.datetime.now(datetime.timezone.utc)


def hello_reply(host: ReplicaSetHost, conn: ConnectionInfo, *, legacy: bool, hello_ok: bool) -> Document:
    """The reply to hello (``legacy``: to isMaster, which says ``ismaster``) on connection ``conn``,
    as the process it reached answers: a replica set primary, or a mongos."""
    process = conn.process
    writable = "ismaster" if legacy else "isWritablePrimary"
    version = {"processId": process.process_id, "counter": Int64(0)}
    reply: Document = {}
    if process.is_mongos:
        # A mongos belongs to no replica set: no setName, hosts, primary or lastWrite, and
        # ``msg: "isdbgrid"`` is how drivers tell it apart (the SDAM spec's server type Mongos).
        reply.update({writable: True, "msg": "isdbgrid", "topologyVersion": version})
        if hello_ok:
            reply["helloOk"] = True
    else:
        if hello_ok:
            reply["helloOk"] = True
        ts: Timestamp = host.oplog_of(process).cluster_time
        written = ts.as_datetime() if ts.time else utcnow()
        reply.update(
            {
                "topologyVersion": version,
                "hosts": [process.address],
                "setName": process.set_name,
                "setVersion": 1,
                writable: True,
                "secondary": False,
                "primary": process.address,
                "me": process.address,
                "electionId": host.election_id,
                "lastWrite": {
                    "opTime": {"ts": ts, "t": Int64(1)},
                    "lastWriteDate": written,
                    "majorityOpTime": {"ts": ts, "t": Int64(1)},
                    "majorityWriteDate": written,
                },
            }
        )
    reply.update(
        {
            "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
            "maxMessageSizeBytes": MAX_MESSAGE_SIZE,
            "maxWriteBatchSize": MAX_WRITE_BATCH_SIZE,
            "localTime": utcnow(),
            "logicalSessionTimeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES,
            "connectionId": conn.id,
            "minWireVersion": 0,
            "maxWireVersion": MAX_WIRE_VERSION,
        }
    )
    if not process.is_mongos:
        reply["readOnly"] = False
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
        if version.get("processId") == ctx.conn.process.process_id and version.get("counter") == 0:
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
            f"BSON field '{ctx.name}.compression' is the wrong type '{bson_type_name(offered)}', "
            "expected type 'array'",
        )
    for position, name in enumerate(offered):
        if not isinstance(name, str):
            raise CommandError(
                14,
                f"BSON field '{ctx.name}.compression.{position}' is the wrong type "
                f"'{bson_type_name(name)}', expected type 'string'",
            )
    return offered


@command("ping", sessions=False)
async def cmd_ping(ctx: Context) -> Document:
    return {"ok": 1.0}
