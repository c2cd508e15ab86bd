"""Reply shapes more than one command group answers with: a cursor's first batch and a write.

A cursor-returning command answers ``{cursor: {firstBatch, id, ns}}`` and registers the cursor
only if it has more to give; a write answers with ``opTime`` and ``electionId`` (a replica set
member's; a mongos's write replies carry neither) and, for a write concern a single node cannot
satisfy, ``writeConcernError`` beside an ``ok: 1``.
"""

from __future__ import annotations

from bson import Int64, Timestamp

from flowwarden_embedded.commands.registry import Context
from flowwarden_embedded.cursors import ServerCursor
from flowwarden_embedded.storage import Document


async def first_batch_reply(
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
        cursor_id = ctx.host.cursors.register(
            cursor, owner, no_timeout=no_timeout, originating=ctx.cmd, first_batch=len(batch)
        )
    return {"cursor": {"firstBatch": batch, "id": cursor_id, "ns": cursor.ns, **extra}, "ok": 1.0}


def write_concern_error(ctx: Context) -> Document | None:
    """The ``writeConcernError`` MongoDB reports for the command's write concern on one node, if any."""
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


def write_reply(ctx: Context, reply: Document) -> Document:
    """``reply`` completed as a write command's reply (opTime, electionId, writeConcernError, ok)."""
    if not ctx.conn.process.is_mongos:
        ts: Timestamp = ctx.host.oplog_of(ctx.conn.process).cluster_time
        reply["opTime"] = {"ts": ts, "t": Int64(1)}
        reply["electionId"] = ctx.host.election_id
    wce = write_concern_error(ctx)
    if wce is not None:
        reply["writeConcernError"] = wce
    reply["ok"] = 1.0
    return reply
