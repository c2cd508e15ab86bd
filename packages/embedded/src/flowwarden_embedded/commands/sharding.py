"""Commands only a mongos has: ``listShards``, ``enableSharding`` and ``shardCollection``.

A sharded deployment's shards are what ``config.shards`` holds; ``listShards`` answers with the
same documents. ``enableSharding`` gives a database its primary shard (the one named by
``primaryShard``, else the next in turn); ``shardCollection`` spreads a collection's documents
over the shards by the hash of ``_id``, the one shard key the embedded cluster models
(:mod:`~flowwarden_embedded.topology` says where each write is then logged). Like every
sharding command, they run only against the ``admin`` database.
"""

from __future__ import annotations

from flowwarden_embedded import crud, views
from flowwarden_embedded.commands.arguments import bson_type_name
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.oplog import OplogOp
from flowwarden_embedded.storage import Document, IndexSpec
from flowwarden_embedded.topology import HASHED_ID, Placement, Role

_MONGOS = frozenset({Role.MONGOS})
_HASHED_ID_INDEX = "_id_hashed"


def _admin_only(ctx: Context) -> Placement:
    if ctx.db != "admin":
        raise CommandError(
            13, f"{ctx.name} may only be run against the admin database.", code_name="Unauthorized"
        )
    placement = ctx.host.placement
    assert placement is not None  # only a mongos has these commands, and only a cluster has a mongos
    return placement


def _name_field(ctx: Context) -> str:
    value = ctx.cmd[ctx.name]
    if not isinstance(value, str):
        raise CommandError(
            14,
            f"BSON field '{ctx.name}.{ctx.name}' is the wrong type '{bson_type_name(value)}', "
            "expected type 'string'",
            code_name="TypeMismatch",
        )
    return value


@command("listShards", sessions=False, roles=_MONGOS)
async def cmd_list_shards(ctx: Context) -> Document:
    _admin_only(ctx)
    return {"shards": ctx.host.shards(), "ok": 1.0}


@command("enableSharding", "enablesharding", roles=_MONGOS)
async def cmd_enable_sharding(ctx: Context) -> Document:
    placement = _admin_only(ctx)
    db = _name_field(ctx)
    if not db or "." in db or db in ("local", "admin", "config"):
        raise CommandError(73, f"Invalid db name specified: {db}", code_name="InvalidNamespace")
    primary = ctx.cmd.get("primaryShard")
    if primary is not None and not isinstance(primary, str):
        raise CommandError(
            14,
            f"BSON field 'enableSharding.primaryShard' is the wrong type '{bson_type_name(primary)}', "
            "expected type 'string'",
            code_name="TypeMismatch",
        )
    placement.enable_sharding(db, primary)
    return {"ok": 1.0}


@command("shardCollection", "shardcollection", roles=_MONGOS)
async def cmd_shard_collection(ctx: Context) -> Document:
    placement = _admin_only(ctx)
    ns = _name_field(ctx)
    db, dot, name = ns.partition(".")
    if not dot or not db or not name:
        raise CommandError(73, f"Invalid namespace specified '{ns}'", code_name="InvalidNamespace")
    key = ctx.cmd.get("key")
    if not isinstance(key, dict):
        raise CommandError(40414, "BSON field 'shardCollection.key' is missing but a required field")
    if views.is_view(ctx.scope.catalog, db, name):
        raise CommandError(
            166, f"Namespace {ns} is a view, not a collection", code_name="CommandNotSupportedOnView"
        )
    crud.validate_collection_name(db, name)
    if not placement.shard_collection(db, name, key):
        return {"collectionsharded": ns, "ok": 1.0}
    # As MongoDB does for an empty or a missing collection: the collection, then the index of its
    # shard key (logged on the primary shard, as every DDL of the database).
    coll = crud.ensure_collection(ctx.scope, db, name)
    if not any(index.key == HASHED_ID for index in coll.indexes.values()):
        index = IndexSpec.from_spec({"key": dict(HASHED_ID), "name": _HASHED_ID_INDEX})
        coll.add_index(index)
        ctx.scope.emit(OplogOp("createIndexes", db, name, description={"indexes": [dict(index.spec)]}))
    return {"collectionsharded": ns, "collectionUUID": coll.uuid, "ok": 1.0}
