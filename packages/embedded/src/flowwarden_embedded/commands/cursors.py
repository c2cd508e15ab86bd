"""Cursor commands: ``getMore`` and ``killCursors``.

A cursor is used by one ``getMore`` at a time; a ``getMore`` that fails, or whose client goes
away while it waits, kills its cursor, as MongoDB does.
"""

from __future__ import annotations

from bson import Int64

from flowwarden_embedded.changestream import ChangeStreamCursor
from flowwarden_embedded.commands.arguments import batch_size_of, bson_type_name, max_time_ms
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.storage import Document


@command("getMore", counter="getmore")
async def cmd_get_more(ctx: Context) -> Document:
    cursor_id = ctx.cmd.get("getMore")
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        raise CommandError(
            14,
            f"BSON field 'getMore.getMore' is the wrong type '{bson_type_name(cursor_id)}', "
            "expected type 'long'",
        )
    collection = ctx.cmd.get("collection")
    if not isinstance(collection, str):
        raise CommandError(40414, "BSON field 'getMore.collection' is missing but a required field")
    batch_size = batch_size_of(ctx.cmd)
    max_time = max_time_ms(ctx)
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
    ctx.describe_cursor(cursor_id)
    fault = ctx.conn.process.failpoints.get_more_fault(isinstance(cursor, ChangeStreamCursor))
    if fault is not None:
        registry.kill(cursor_id)  # a getMore that fails kills its cursor
        raise fault
    try:
        batch, extra = await cursor.fetch(batch_size, max_time, first=False)
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
    registry.returned(cursor_id, len(batch))
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
