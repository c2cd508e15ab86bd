"""Write commands: ``insert``, ``update``, ``delete`` and ``findAndModify``.

A statement that fails goes into ``writeErrors`` with its index, as MongoDB reports it; an
ordered batch stops there, an unordered one goes on. A WriteConflict (112) inside a transaction
fails the whole command instead, so the transaction aborts. Every reply carries ``opTime``,
``electionId`` and, for a write concern this single node cannot satisfy, ``writeConcernError``.
"""

from __future__ import annotations

from flowwarden.testing.embedded import crud
from flowwarden.testing.embedded.commands.arguments import typed_field
from flowwarden.testing.embedded.commands.registry import Context, command
from flowwarden.testing.embedded.commands.replies import write_reply
from flowwarden.testing.embedded.errors import CommandError
from flowwarden.testing.embedded.storage import Document, DuplicateKey


@command("insert", counter="insert", retryable=True)
async def cmd_insert(ctx: Context) -> Document:
    name = ctx.collection_name()
    documents = typed_field(ctx, "documents", list)
    if documents is None:
        raise CommandError(40414, "BSON field 'insert.documents' is missing but a required field")
    if not documents:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    n, errors = crud.insert_documents(ctx.scope, ctx.db, name, documents, ordered=ordered)
    reply: Document = {"n": n}
    if errors:
        reply["writeErrors"] = errors
    return write_reply(ctx, reply)


def _statement_error(position: int, exc: Exception) -> Document:
    if isinstance(exc, DuplicateKey):
        return exc.write_error(position)
    assert isinstance(exc, CommandError)
    return {"index": position, "code": exc.code, "errmsg": exc.errmsg}


@command("update", counter="update", retryable=True)
async def cmd_update(ctx: Context) -> Document:
    name = ctx.collection_name()
    statements = typed_field(ctx, "updates", list)
    if not statements:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    matched = modified = 0
    upserted: list[Document] = []
    errors: list[Document] = []
    for position, statement in enumerate(statements):
        try:
            if not isinstance(statement, dict) or "q" not in statement or "u" not in statement:
                raise CommandError(40414, "BSON field 'update.updates.q' is missing but a required field")
            query = statement["q"]
            if not isinstance(query, dict):
                raise CommandError(
                    14, "BSON field 'update.updates.q' is the wrong type, expected type 'object'"
                )
            result = crud.update_one_statement(
                ctx.scope,
                ctx.db,
                name,
                query,
                statement["u"],
                multi=bool(statement.get("multi", False)),
                upsert=bool(statement.get("upsert", False)),
                array_filters=statement.get("arrayFilters"),
                sort=statement.get("sort"),
            )
        except (CommandError, DuplicateKey) as exc:
            if isinstance(exc, CommandError) and exc.code == 112:
                raise
            errors.append(_statement_error(position, exc))
            if ordered:
                break
            continue
        if result.upserted:
            matched += 1
            upserted.append({"index": position, "_id": result.upserted_id})
        else:
            matched += result.matched
            modified += result.modified
    reply: Document = {"n": matched, "nModified": modified}
    if upserted:
        reply["upserted"] = upserted
    if errors:
        reply["writeErrors"] = errors
    return write_reply(ctx, reply)


@command("delete", counter="delete", retryable=True)
async def cmd_delete(ctx: Context) -> Document:
    name = ctx.collection_name()
    statements = typed_field(ctx, "deletes", list)
    if not statements:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    deleted = 0
    errors: list[Document] = []
    for position, statement in enumerate(statements):
        try:
            if not isinstance(statement, dict) or "q" not in statement or "limit" not in statement:
                raise CommandError(40414, "BSON field 'delete.deletes.limit' is missing but a required field")
            limit = statement["limit"]
            if limit not in (0, 1):
                raise CommandError(9, f"The limit field in delete objects must be 0 or 1. Got {limit}")
            deleted += len(crud.delete_statement(ctx.scope, ctx.db, name, statement["q"], limit=int(limit)))
        except CommandError as exc:
            if exc.code == 112:
                raise
            errors.append(_statement_error(position, exc))
            if ordered:
                break
    reply: Document = {"n": deleted}
    if errors:
        reply["writeErrors"] = errors
    return write_reply(ctx, reply)


@command("findAndModify", "findandmodify", counter="command", retryable=True)
async def cmd_find_and_modify(ctx: Context) -> Document:
    name = ctx.collection_name()
    cmd = ctx.cmd
    query = typed_field(ctx, "query", dict) or {}
    sort = typed_field(ctx, "sort", dict)
    fields = typed_field(ctx, "fields", dict)
    remove = bool(cmd.get("remove", False))
    update = cmd.get("update")
    new = bool(cmd.get("new", False))
    upsert = bool(cmd.get("upsert", False))
    if remove and update is not None:
        raise CommandError(9, "Cannot specify both an update and remove=true")
    if not remove and update is None:
        raise CommandError(9, "Either an update or remove=true must be specified")
    if remove and new:
        raise CommandError(
            9, "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document"
        )
    if remove and upsert:
        raise CommandError(9, "Cannot specify both upsert=true and remove=true ")
    tools = ctx.scope.catalog.engine[ctx.db][name]
    try:
        if remove:
            deleted = crud.delete_statement(ctx.scope, ctx.db, name, query, limit=1, sort=sort)
            value = crud.project(tools, deleted, fields)[0] if deleted else None
            return write_reply(ctx, {"lastErrorObject": {"n": len(deleted)}, "value": value})
        result = crud.update_one_statement(
            ctx.scope,
            ctx.db,
            name,
            query,
            update,
            multi=False,
            upsert=upsert,
            array_filters=cmd.get("arrayFilters"),
            sort=sort,
        )
    except DuplicateKey as dup:
        raise dup.command_error() from None
    last_error: Document = {
        "n": 1 if (result.matched or result.upserted) else 0,
        "updatedExisting": bool(result.matched),
    }
    if result.upserted:
        last_error["upserted"] = result.upserted_id
    chosen = result.after if new else (None if result.upserted else result.before)
    value = crud.project(tools, [chosen], fields)[0] if chosen is not None else None
    return write_reply(ctx, {"lastErrorObject": last_error, "value": value})
