"""Write commands: ``insert``, ``update``, ``delete`` and ``findAndModify``.

A statement that fails goes into ``writeErrors`` with its index, as MongoDB reports it; an
ordered batch stops there, an unordered one goes on. A WriteConflict (112) inside a transaction
fails the whole command instead, so the transaction aborts. Every reply of the replica set member
carries ``opTime`` and ``electionId`` (a mongos's carry neither) and, for a write concern this
single node cannot satisfy, ``writeConcernError``.

A statement outside any transaction that meets a document an open transaction has written waits
until that transaction ends and then runs, as mongod's does; with ``maxTimeMS`` the command fails
with MaxTimeMSExpired (50) once that time has passed. Every statement addressed to a view fails
with CommandNotSupportedOnView (166).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

from flowwarden_embedded import crud, views
from flowwarden_embedded.commands.arguments import max_time_ms, typed_field
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.commands.replies import write_reply
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.storage import Document, DuplicateKey

T = TypeVar("T")


def _deadline(ctx: Context) -> float | None:
    """When the command's ``maxTimeMS`` runs out, on the event loop's clock; None for no limit."""
    limit = max_time_ms(ctx)
    return None if not limit else asyncio.get_running_loop().time() + limit / 1000


async def _when_unlocked(ctx: Context, deadline: float | None, statement: Callable[[], T]) -> T:
    """Run ``statement``; each time it meets a document an open transaction holds, wait for a
    transaction to end and run it again (it changed nothing before raising)."""
    while True:
        try:
            return statement()
        except crud.TransactionLocked:
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                raise _time_limit_exceeded() from None
            if not await ctx.host.sessions.wait_for_transaction_end(remaining):
                raise _time_limit_exceeded() from None


def _time_limit_exceeded() -> CommandError:
    return CommandError(50, "operation exceeded time limit")


def _view_write_errors(ctx: Context, name: str, statements: int, ordered: bool) -> list[Document]:
    """The writeErrors of a batch addressed to a view: its first statement, or all when unordered."""
    error = views.not_a_collection(ctx.db, name)
    count = 1 if ordered else statements
    return [{"index": i, "code": error.code, "errmsg": error.errmsg} for i in range(count)]


@command("insert", counter="insert", retryable=True)
async def cmd_insert(ctx: Context) -> Document:
    name = ctx.collection_name()
    documents = typed_field(ctx, "documents", list)
    if documents is None:
        raise CommandError(40414, "BSON field 'insert.documents' is missing but a required field")
    if not documents:
        raise CommandError(2, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    ordered = bool(ctx.cmd.get("ordered", True))
    if views.is_view(ctx.scope.catalog, ctx.db, name):
        return write_reply(
            ctx, {"n": 0, "writeErrors": _view_write_errors(ctx, name, len(documents), ordered)}
        )
    insert = functools.partial(crud.insert_documents, ctx.scope, ctx.db, name, documents, ordered=ordered)
    n, errors = await _when_unlocked(ctx, _deadline(ctx), insert)
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
    if views.is_view(ctx.scope.catalog, ctx.db, name):
        errors = _view_write_errors(ctx, name, len(statements), ordered)
        return write_reply(ctx, {"n": 0, "nModified": 0, "writeErrors": errors})
    deadline = _deadline(ctx)
    matched = modified = 0
    upserted: list[Document] = []
    errors = []
    for position, statement in enumerate(statements):
        try:
            if not isinstance(statement, dict) or "q" not in statement or "u" not in statement:
                raise CommandError(40414, "BSON field 'update.updates.q' is missing but a required field")
            query = statement["q"]
            if not isinstance(query, dict):
                raise CommandError(
                    14, "BSON field 'update.updates.q' is the wrong type, expected type 'object'"
                )
            update = functools.partial(
                crud.update_one_statement,
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
            result = await _when_unlocked(ctx, deadline, update)
        except (CommandError, DuplicateKey) as exc:
            if isinstance(exc, CommandError) and exc.code in (50, 112):
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
    if views.is_view(ctx.scope.catalog, ctx.db, name):
        return write_reply(
            ctx, {"n": 0, "writeErrors": _view_write_errors(ctx, name, len(statements), ordered)}
        )
    deadline = _deadline(ctx)
    deleted = 0
    errors: list[Document] = []
    for position, statement in enumerate(statements):
        try:
            if not isinstance(statement, dict) or "q" not in statement or "limit" not in statement:
                raise CommandError(40414, "BSON field 'delete.deletes.limit' is missing but a required field")
            limit = statement["limit"]
            if limit not in (0, 1):
                raise CommandError(9, f"The limit field in delete objects must be 0 or 1. Got {limit}")
            delete = functools.partial(
                crud.delete_statement, ctx.scope, ctx.db, name, statement["q"], limit=int(limit)
            )
            deleted += len(await _when_unlocked(ctx, deadline, delete))
        except CommandError as exc:
            if exc.code in (50, 112):
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
    if views.is_view(ctx.scope.catalog, ctx.db, name):
        raise views.not_a_collection(ctx.db, name)
    tools = ctx.scope.catalog.engine[ctx.db][name]
    deadline = _deadline(ctx)
    try:
        if remove:
            delete = functools.partial(
                crud.delete_statement, ctx.scope, ctx.db, name, query, limit=1, sort=sort
            )
            deleted = await _when_unlocked(ctx, deadline, delete)
            value = crud.project(tools, deleted, fields)[0] if deleted else None
            return write_reply(ctx, {"lastErrorObject": {"n": len(deleted)}, "value": value})
        modify = functools.partial(
            crud.update_one_statement,
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
        result = await _when_unlocked(ctx, deadline, modify)
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
