"""Commands only a mongos has: ``listShards``.

A sharded deployment's shards are what ``config.shards`` holds (one here, see
:mod:`~flowwarden.testing.embedded.topology`); ``listShards`` answers with the same documents.
"""

from __future__ import annotations

from flowwarden.testing.embedded.commands.registry import Context, command
from flowwarden.testing.embedded.errors import CommandError
from flowwarden.testing.embedded.storage import Document
from flowwarden.testing.embedded.topology import Role


@command("listShards", sessions=False, roles=frozenset({Role.MONGOS}))
async def cmd_list_shards(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "listShards may only be run against the admin database.", code_name="Unauthorized"
        )
    return {"shards": ctx.host.shards(), "ok": 1.0}
