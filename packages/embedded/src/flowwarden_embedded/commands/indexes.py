"""Index commands: ``createIndexes``, ``listIndexes``, ``dropIndexes``, and the index options
``collMod`` changes.

An index spec is checked as MongoDB checks it before anything is built; a build that meets a
duplicate key fails whole, and every index created or dropped is logged to the oplog.
"""

from __future__ import annotations

from typing import Any

from flowwarden_embedded import crud, views
from flowwarden_embedded.commands.arguments import batch_size_of, typed_field
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.commands.replies import first_batch_reply
from flowwarden_embedded.cursors import ListCursor
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.oplog import OplogOp
from flowwarden_embedded.storage import Collection, Document, DuplicateKey, IndexSpec


def modify_index(coll: Collection, spec: Any) -> Document:
    """Apply ``collMod``'s ``index`` option; returns the ``*_old``/``*_new`` fields of its reply."""
    if not isinstance(spec, dict):
        raise CommandError(14, "BSON field 'collMod.index' is the wrong type, expected type 'object'")
    index = find_index(coll, spec.get("name", spec.get("keyPattern")))
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


def find_index(coll: Collection, which: Any) -> IndexSpec:
    """The index named ``which``, or with key pattern ``which``; IndexNotFound (27) otherwise."""
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
    specs = typed_field(ctx, "indexes", list)
    if not specs:
        raise CommandError(2, "Must specify at least one index to create")
    specs = [_validate_index_spec(s) for s in specs]
    if views.is_view(ctx.scope.catalog, ctx.db, name):
        raise CommandError(
            166, f"Cannot create indexes on a view: {ctx.db}.{name}", code_name="CommandNotSupportedOnView"
        )
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
        if views.is_view(ctx.scope.catalog, ctx.db, name):
            raise views.not_a_collection(ctx.db, name)
        raise CommandError(26, f"ns does not exist: {ctx.db}.{name}")
    specs = [dict(index.spec) for index in coll.indexes.values()]
    cursor = ListCursor(f"{ctx.db}.{name}", specs)
    return await first_batch_reply(ctx, cursor, batch_size_of(typed_field(ctx, "cursor", dict)))


@command("dropIndexes", "deleteIndexes")
async def cmd_drop_indexes(ctx: Context) -> Document:
    name = ctx.collection_name()
    coll = ctx.get(name)
    if coll is None:
        if views.is_view(ctx.scope.catalog, ctx.db, name):
            raise views.not_a_collection(ctx.db, name)
        raise CommandError(26, f"ns not found {ctx.db}.{name}")
    which = ctx.cmd.get("index")
    before = len(coll.indexes)
    if which == "*":
        doomed = [n for n in coll.indexes if n != "_id_"]
    elif isinstance(which, list):
        doomed = [find_index(coll, n).name for n in which]
    else:
        doomed = [find_index(coll, which).name]
    if "_id_" in doomed:
        raise CommandError(72, "cannot drop _id index", code_name="InvalidOptions")
    for index_name in doomed:
        index = coll.indexes.pop(index_name)
        ctx.scope.emit(OplogOp("dropIndexes", ctx.db, name, description={"indexes": [dict(index.spec)]}))
    return {"nIndexesWas": before, "ok": 1.0}
