"""Namespace commands: ``listCollections``, ``listDatabases``, ``create``, ``drop``,
``dropDatabase``, ``renameCollection`` and ``collMod``.

Every change to the catalog is logged to the oplog as MongoDB logs it (``create``, ``drop``,
``rename`` with ``dropTarget``, ``modify`` with ``stateBeforeChange``), so change streams see
the same DDL events as on a real server. Views are namespaces too: ``create`` with ``viewOn``
defines one, ``collMod`` changes it, ``drop`` drops it and ``listCollections`` lists it, all
through :mod:`~flowwarden_embedded.views`, which logs them as mongod does.
"""

from __future__ import annotations

from typing import Any

from bson import Int64

from flowwarden_embedded import crud, engine, views
from flowwarden_embedded.commands.arguments import GENERIC_FIELDS, batch_size_of, typed_field
from flowwarden_embedded.commands.indexes import modify_index
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.commands.replies import first_batch_reply
from flowwarden_embedded.cursors import ListCursor
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.limits import MAX_MESSAGE_SIZE
from flowwarden_embedded.oplog import OplogOp
from flowwarden_embedded.storage import Collection, Document

# The _id index every collection has, as listCollections and the oplog entry of a create show it.
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


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
    query = typed_field(ctx, "filter", dict) or {}
    catalog = ctx.scope.catalog
    # As mongod lists them: the collections, then the views.
    entries = [_collection_entry(c, name_only) for c in catalog.collections(ctx.db)]
    entries.extend(views.listing(stored, name_only) for stored in views.definitions(catalog, ctx.db))
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
            raise engine.command_error(exc) from None
    cursor = ListCursor(f"{ctx.db}.$cmd.listCollections", entries)
    return await first_batch_reply(ctx, cursor, batch_size_of(typed_field(ctx, "cursor", dict)))


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
    query = typed_field(ctx, "filter", dict)
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


_VIEW_OPTIONS = ("viewOn", "pipeline")


@command("create")
async def cmd_create(ctx: Context) -> Document:
    name = ctx.collection_name()
    if "timeseries" in ctx.cmd:
        raise CommandError(2, "'timeseries' collections are not supported by the embedded replica set")
    unknown = [
        k
        for k in ctx.cmd
        if k != "create"
        and k not in GENERIC_FIELDS
        and k not in _CREATE_OPTIONS
        and k not in _VIEW_OPTIONS
        and k not in ("idIndex", "autoIndexId")
    ]
    if unknown:
        raise CommandError(
            40415, f"BSON field 'create.{unknown[0]}' is an unknown field.", code_name="Location40415"
        )
    if any(k in ctx.cmd for k in _VIEW_OPTIONS):
        return _create_view(ctx, name)
    if views.is_view(ctx.scope.catalog, ctx.db, name):
        raise CommandError(48, f"A view already exists. NS: {ctx.db}.{name}")
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


def _create_view(ctx: Context, name: str) -> Document:
    if "viewOn" not in ctx.cmd:
        raise CommandError(
            72, "'pipeline' requires 'viewOn' to also be specified", code_name="InvalidOptions"
        )
    if ctx.in_transaction:
        raise CommandError(263, "Cannot create a view in a multi-document transaction.")
    not_for_views = [k for k in ctx.cmd if k in _CREATE_OPTIONS and k != "collation"]
    not_for_views += [k for k in ("idIndex", "autoIndexId") if k in ctx.cmd]
    if not_for_views:
        raise CommandError(
            72, f"option not supported on a view: {not_for_views[0]}", code_name="InvalidOptions"
        )
    view_on, pipeline = _view_definition(ctx)
    assert view_on is not None and pipeline is not None
    crud.validate_collection_name(ctx.db, name)
    if name.startswith("system."):
        raise CommandError(73, f"Cannot create a view called '{name}'", code_name="InvalidNamespace")
    catalog = ctx.scope.catalog
    collation = ctx.cmd.get("collation")
    existing = views.definition(catalog, ctx.db, name)
    if existing is not None:
        same = (existing["viewOn"], existing["pipeline"], existing.get("collation"))
        if same == (view_on, pipeline, collation):
            return {"ok": 1.0}
        raise CommandError(48, f"namespace {ctx.db}.{name} already exists, but with different options")
    if ctx.get(name) is not None:
        raise CommandError(48, f"Collection {ctx.db}.{name} already exists.")
    views.define(ctx.scope, ctx.db, name, view_on, pipeline, collation)
    return {"ok": 1.0}


def _view_definition(ctx: Context) -> tuple[str | None, list[Any] | None]:
    """The command's ``viewOn`` and ``pipeline`` (None when absent; ``create`` defaults the
    pipeline to empty), checked as mongod checks them."""
    view_on = typed_field(ctx, "viewOn", str)
    if view_on == "":
        raise CommandError(2, "'viewOn' cannot be empty")
    pipeline = typed_field(ctx, "pipeline", list)
    if pipeline is None and ctx.name == "create":
        pipeline = []
    for stage in pipeline or []:
        if not isinstance(stage, dict):
            raise CommandError(14, "Each element of the 'pipeline' array must be an object")
        for writing in ("$out", "$merge"):
            if writing in stage:
                raise CommandError(
                    167,
                    f"{writing} cannot be used in a view definition",
                    code_name="OptionNotSupportedOnView",
                )
    return view_on, pipeline


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
        if views.undefine(ctx.scope, ctx.db, name):
            return {"ns": f"{ctx.db}.{name}", "ok": 1.0}
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
        if views.is_view(catalog, src_db, src_name):
            raise CommandError(
                166, f"cannot rename view: {src_db}.{src_name}", code_name="CommandNotSupportedOnView"
            )
        raise CommandError(26, f"Source collection {src_db}.{src_name} does not exist")
    if views.is_view(catalog, dst_db, dst_name):
        raise CommandError(48, f"a view already exists with that name: {dst_db}.{dst_name}")
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
        if views.is_view(ctx.scope.catalog, ctx.db, name):
            return _modify_view(ctx, name)
        raise CommandError(26, f"ns does not exist: {ctx.db}.{name}")
    changes: Document = {}
    reply: Document = {}
    for key, value in ctx.cmd.items():
        if key == "collMod" or key in GENERIC_FIELDS:
            continue
        if key == "changeStreamPreAndPostImages":
            _validate_pre_post_images(value, "collMod")
            changes[key] = value
        elif key in ("validator", "validationLevel", "validationAction", "expireAfterSeconds"):
            changes[key] = value
        elif key == "index":
            reply.update(modify_index(coll, value))
            changes[key] = value
        elif key in _VIEW_OPTIONS:
            raise CommandError(72, f"option only supported on a view: {key}", code_name="InvalidOptions")
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
    # mongod logs every collMod, one that changes nothing included: a modify event either way.
    ctx.scope.emit(
        OplogOp("modify", ctx.db, name, description={**changes, "stateBeforeChange": state_before})
    )
    reply["ok"] = 1.0
    return reply


def _modify_view(ctx: Context, name: str) -> Document:
    """``collMod`` of a view: only its ``viewOn`` and ``pipeline`` can change."""
    for key in ctx.cmd:
        if key != "collMod" and key not in GENERIC_FIELDS and key not in _VIEW_OPTIONS:
            raise CommandError(72, f"option not supported on a view: {key}", code_name="InvalidOptions")
    view_on, pipeline = _view_definition(ctx)
    if view_on is not None or pipeline is not None:
        views.redefine(ctx.scope, ctx.db, name, view_on, pipeline)
    return {"ok": 1.0}
