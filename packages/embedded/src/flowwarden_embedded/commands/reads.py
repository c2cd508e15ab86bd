"""Read commands: ``find`` (a member's ``local.oplog.rs`` included, and ``config.shards``,
``config.databases`` and ``config.collections`` through a mongos), ``count``, ``distinct`` and
``aggregate``.

A read that returns documents answers with a cursor's first batch; what is left is served by
``getMore`` (:mod:`flowwarden_embedded.commands.cursors`). An ``aggregate`` whose first
stage is ``$changeStream`` opens a change stream instead of running a pipeline; one whose first
stage is ``$collStats`` or ``$currentOp`` runs the rest of its pipeline over what that stage
reports (:mod:`~flowwarden_embedded.commands.stats`,
:mod:`~flowwarden_embedded.commands.current_op`).

Every read works on a view as on a collection: it sees what the view's pipeline outputs, and its
own filter, sort, skip, limit and projection apply after that pipeline. A change stream cannot be
opened on a view.
"""

from __future__ import annotations

from flowwarden_embedded import crud, engine, views
from flowwarden_embedded.commands import current_op, explain, stats
from flowwarden_embedded.commands.arguments import (
    GENERIC_FIELDS,
    batch_size_of,
    bson_type_name,
    non_negative,
    typed_field,
)
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.commands.replies import first_batch_reply
from flowwarden_embedded.cursors import ListCursor
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.storage import Document

# The find command's own fields (MongoDB 7.0's find command); with the generic ones, any other
# field is refused as MongoDB refuses it (40415), not ignored.
_FIND_FIELDS = frozenset(
    {
        "find", "filter", "projection", "sort", "hint", "collation", "skip", "limit", "batchSize",
        "singleBatch", "max", "min", "returnKey", "showRecordId", "tailable", "oplogReplay",
        "noCursorTimeout", "awaitData", "allowPartialResults", "let", "allowDiskUse", "readOnce",
        "allowSpeculativeMajorityRead", "term", "$_requestResumeToken", "$_resumeAfter",
        "$_startAt", "includeQueryStatsMetrics", "encryptionInformation",
    }
)  # fmt: skip


@command("find", counter="query")
async def cmd_find(ctx: Context) -> Document:
    name = ctx.collection_name()
    cmd = ctx.cmd
    unknown = [field for field in cmd if field not in _FIND_FIELDS and field not in GENERIC_FIELDS]
    if unknown:
        raise CommandError(
            40415, f"BSON field 'find.{unknown[0]}' is an unknown field.", code_name="Location40415"
        )
    query = typed_field(ctx, "filter", dict) or {}
    sort = typed_field(ctx, "sort", dict)
    projection = typed_field(ctx, "projection", dict)
    skip = non_negative(ctx, "skip", cmd.get("skip"))
    limit = non_negative(ctx, "limit", cmd.get("limit"))
    batch_size = batch_size_of(cmd)
    single_batch = bool(cmd.get("singleBatch", False))
    ns = f"{ctx.db}.{name}"
    # The config servers' catalog of the cluster, which a mongos reads through to.
    held = ctx.host.config_documents(name) if ctx.db == "config" and ctx.conn.process.is_mongos else None
    if ctx.db == "local" and name == "oplog.rs":
        docs = _oplog_rs(ctx, query, sort, skip, limit)
    elif held is not None:
        docs = crud.select_from(held, query, sort, skip, limit)
    else:
        docs = crud.select_in(ctx.scope.catalog, ctx.db, name, query, sort=sort, skip=skip, limit=limit)
    if projection:
        docs = crud.project(ctx.scope.catalog.engine[ctx.db][name], docs, projection)
    if limit and batch_size is None and limit <= len(docs):
        # A limit that fits one batch comes back whole, as MongoDB closes such cursors at once.
        batch_size = limit
    cursor = ListCursor(ns, docs, single_batch=single_batch)
    no_timeout = bool(cmd.get("noCursorTimeout", False))
    return await first_batch_reply(ctx, cursor, batch_size, no_timeout=no_timeout)


def _oplog_rs(ctx: Context, query: Document, sort: Document | None, skip: int, limit: int) -> list[Document]:
    natural = 1
    if sort:
        if set(sort) != {"$natural"}:
            raise CommandError(2, "local.oplog.rs can only be sorted by $natural on the embedded replica set")
        natural = crud.natural_direction(sort["$natural"])
    plain = not query and not skip
    docs = ctx.host.oplog_of(ctx.conn.process).oplog_rs_find(natural, limit if (plain and limit) else None)
    if query:
        try:
            docs = [d for d in docs if engine.matches(query, d)]
        except Exception as exc:
            raise engine.command_error(exc) from None
    if skip:
        docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    return docs


@command("count", counter="command")
async def cmd_count(ctx: Context) -> Document:
    name = ctx.collection_name()
    query = typed_field(ctx, "query", dict) or {}
    skip = non_negative(ctx, "skip", ctx.cmd.get("skip"))
    limit_value = ctx.cmd.get("limit")
    limit = (
        abs(int(limit_value))
        if isinstance(limit_value, (int, float)) and not isinstance(limit_value, bool)
        else 0
    )
    docs = crud.select_in(ctx.scope.catalog, ctx.db, name, query, skip=skip, limit=limit)
    return {"n": len(docs), "ok": 1.0}


@command("distinct", counter="command")
async def cmd_distinct(ctx: Context) -> Document:
    name = ctx.collection_name()
    key = ctx.cmd.get("key")
    if not isinstance(key, str):
        raise CommandError(40414, "BSON field 'distinct.key' is missing but a required field")
    query = typed_field(ctx, "query", dict) or {}
    return {"values": crud.distinct(ctx.scope.catalog, ctx.db, name, key, query), "ok": 1.0}


@command("aggregate", counter="command")
async def cmd_aggregate(ctx: Context) -> Document:
    cmd = ctx.cmd
    target = cmd.get("aggregate")
    coll_name: str | None
    if target == 1 or (isinstance(target, float) and target == 1.0):
        coll_name = None
    else:
        coll_name = ctx.collection_name()
    pipeline = typed_field(ctx, "pipeline", list)
    if pipeline is None:
        raise CommandError(40414, "BSON field 'aggregate.pipeline' is missing but a required field")
    explain_flag = cmd.get("explain", False)
    if not isinstance(explain_flag, bool):
        raise CommandError(
            14,
            f"BSON field 'aggregate.explain' is the wrong type '{bson_type_name(explain_flag)}', "
            "expected type 'bool'",
            code_name="TypeMismatch",
        )
    if explain_flag:
        # The aggregate's own explain flag: the plan, at queryPlanner verbosity, and no cursor.
        return explain.explain_aggregate(ctx, cmd, "queryPlanner")
    cursor_opts = typed_field(ctx, "cursor", dict)
    if cursor_opts is None:
        raise CommandError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    batch_size = batch_size_of(cursor_opts)
    first = pipeline[0] if pipeline else None
    if isinstance(first, dict) and "$changeStream" in first:
        if ctx.in_transaction:
            raise CommandError(
                263, "Cannot run aggregate with $changeStream in a multi-document transaction."
            )
        if coll_name is not None and views.is_view(ctx.scope.catalog, ctx.db, coll_name):
            raise views.not_a_collection(ctx.db, coll_name)
        # Imported here so the rest of the server never depends on the change-stream engine.
        from flowwarden_embedded.changestream import open_change_stream

        source = ctx.host.change_source(ctx.conn.process)
        stream = await open_change_stream(ctx.host, ctx.db, coll_name, pipeline, cmd, source=source)
        return await first_batch_reply(ctx, stream, batch_size)
    if isinstance(first, dict) and "$currentOp" in first:
        docs = current_op.current_op_stage(ctx, coll_name, first["$currentOp"])
        docs = crud.run_pipeline_over(ctx.scope.catalog, ctx.db, docs, pipeline[1:])
        return await first_batch_reply(ctx, ListCursor(f"{ctx.db}.$cmd.aggregate", docs), batch_size)
    if coll_name is None:
        stage = next(iter(first), "") if isinstance(first, dict) else ""
        raise CommandError(
            73,
            f"{{aggregate: 1}} is not valid for '{stage}'; a collection is required.",
            code_name="InvalidNamespace",
        )
    if ctx.in_transaction:
        # Stages that read other collections must see the transaction's snapshot of them too.
        ctx.scope.catalog.collections(ctx.db)
    if isinstance(first, dict) and "$collStats" in first:
        docs = stats.coll_stats_documents(ctx, coll_name, first["$collStats"])
        docs = crud.run_pipeline_over(ctx.scope.catalog, ctx.db, docs, pipeline[1:])
    else:
        docs = crud.run_pipeline(ctx.scope.catalog, ctx.db, coll_name, pipeline)
    return await first_batch_reply(ctx, ListCursor(f"{ctx.db}.{coll_name}", docs), batch_size)
