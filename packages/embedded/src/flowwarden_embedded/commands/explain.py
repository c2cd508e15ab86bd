"""``explain`` of ``find``, ``aggregate``, ``count``, ``distinct``, ``update``, ``delete`` and
``findAndModify``, at the verbosities ``queryPlanner``, ``executionStats`` and
``allPlansExecution`` (the default), in the shape mongod 7.0's classic engine answers; and the
``explain: true`` flag of ``aggregate``, which answers at ``queryPlanner``.

The plans and their counts come from :mod:`~flowwarden_embedded.plans`: the plan mongod would
choose among the collection's indexes, run over the documents stored now. Explaining never
changes anything: an explained update or delete counts what it would match, modify, upsert or
delete (``nWouldModify``, ``nWouldDelete``, ...) and writes nothing.

An aggregation whose pipeline is only a ``$match``, a ``$sort`` and a ``$limit`` explains as the
query they make; another has ``stages``: the query as a ``$cursor`` stage, then each further
stage with what it passed on (its ``nReturned``, from running the pipeline). A pipeline that
starts with ``$collStats`` or ``$currentOp`` lists its stages alone; a ``$changeStream`` cannot
be explained here.

Through a mongos the plans are the shards': ``SINGLE_SHARD`` (the collection's primary shard) or
``SHARD_MERGE`` (each shard of a collection sharded by ``{_id: "hashed"}``, with its own
documents), the shard's plan under ``shards``, as mongos reports them.
"""

from __future__ import annotations

import copy
import socket
import time
from collections.abc import Callable
from typing import Any

from bson import Int64

from flowwarden_embedded import crud, engine, plans, views
from flowwarden_embedded.commands import current_op, stats
from flowwarden_embedded.commands.handshake import SERVER_VERSION
from flowwarden_embedded.commands.registry import Context, command, lookup
from flowwarden_embedded.document_updates import apply_update
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.plans import Access, Measured, Query
from flowwarden_embedded.storage import Collection, Document
from flowwarden_embedded.topology import Process

VERBOSITIES = ("queryPlanner", "executionStats", "allPlansExecution")
SERVER_PARAMETERS: Document = {
    "internalQueryFacetBufferSizeBytes": 104857600,
    "internalQueryFacetMaxOutputDocSizeBytes": 104857600,
    "internalLookupStageIntermediateDocumentMaxSizeBytes": 104857600,
    "internalDocumentSourceGroupMaxMemoryBytes": 104857600,
    "internalQueryMaxBlockingSortMemoryUsageBytes": 104857600,
    "internalQueryProhibitBlockingMergeOnMongoS": 0,
    "internalQueryMaxAddToSetBytes": 104857600,
    "internalDocumentSourceSetWindowFieldsMaxMemoryBytes": 104857600,
    "internalQueryFrameworkControl": "trySbeRestricted",
}
# Wraps a query's plan for the command explained (COUNT, UPDATE, DELETE ...): given the plan (with
# counts when measured) and the measurement, the plan under the command's own stage.
Wrap = Callable[[Document, Measured | None], Document]


def server_info(process: Process) -> Document:
    return {
        "host": socket.gethostname(),
        "port": process.port,
        "version": SERVER_VERSION,
        "gitVersion": "0000000000000000000000000000000000000000",
    }


def _unwrapped(plan: Document, measured: Measured | None) -> Document:
    return plan


class _Explained:
    """One process's explain of one query: its ``queryPlanner`` and ``executionStats``."""

    def __init__(
        self,
        ns: str,
        coll: Collection | None,
        docs: list[Document],
        query: Query,
        verbosity: str,
        *,
        wrap: Wrap = _unwrapped,
        returns: Callable[[Measured], int] | None = None,
        measure_as: Query | None = None,
    ) -> None:
        winner, rejected = plans.choose(coll, docs, query)
        self.planner: Document = {
            "namespace": ns,
            "indexFilterSet": False,
            "parsedQuery": plans.parsed_query(query.filter),
            "queryHash": plans.query_hash(query.filter, query.sort, query.projection),
            "planCacheKey": plans.query_hash({"": query.filter}, query.sort, query.projection),
            "maxIndexedOrSolutionsReached": False,
            "maxIndexedAndSolutionsReached": False,
            "maxScansToExplodeReached": False,
            "winningPlan": wrap(plans.describe(coll, winner, query), None),
            "rejectedPlans": [wrap(plans.describe(coll, a, query), None) for a in rejected],
        }
        self.execution: Document | None = None
        self.returned = 0
        if verbosity == "queryPlanner":
            return
        measured_query = measure_as or query
        started = time.perf_counter()
        measured = self._measure(winner, docs, measured_query)
        millis = int((time.perf_counter() - started) * 1000)
        self.returned = measured.returned if returns is None else returns(measured)
        self.execution = {
            "executionSuccess": True,
            "nReturned": self.returned,
            "executionTimeMillis": millis,
            "totalKeysExamined": measured.keys_examined,
            "totalDocsExamined": measured.docs_examined,
            "executionStages": wrap(plans.describe(coll, winner, query, measured), measured),
        }
        if verbosity == "allPlansExecution":
            every: list[Document] = []
            if rejected:
                for access in [winner, *rejected]:
                    m = self._measure(access, docs, measured_query)
                    every.append(
                        {
                            "nReturned": m.returned if returns is None else returns(m),
                            "executionTimeMillisEstimate": 0,
                            "totalKeysExamined": m.keys_examined,
                            "totalDocsExamined": m.docs_examined,
                            "executionStages": wrap(plans.describe(coll, access, query, m), m),
                        }
                    )
            self.execution["allPlansExecution"] = every

    @staticmethod
    def _measure(access: Access, docs: list[Document], query: Query) -> Measured:
        if access.stage == "EOF":
            return Measured()
        try:
            return plans.measure(access, docs, query)
        except engine.ENGINE_ERRORS as exc:
            raise engine.command_error(exc) from None


def _reply(ctx: Context, inner: Document, planner: Document, execution: Document | None) -> Document:
    reply: Document = {"explainVersion": "1", "queryPlanner": planner}
    if execution is not None:
        reply["executionStats"] = execution
    reply["command"] = {**inner, "$db": ctx.db}
    reply["serverInfo"] = server_info(ctx.conn.process)
    reply["serverParameters"] = dict(SERVER_PARAMETERS)
    reply["ok"] = 1.0
    return reply


def _explain_query(
    ctx: Context,
    inner: Document,
    name: str,
    query: Query,
    verbosity: str,
    **options: Any,
) -> Document:
    """The reply explaining ``query`` on collection ``name``: the member's own plan, or through a
    mongos each shard's under SINGLE_SHARD or SHARD_MERGE."""
    ns = f"{ctx.db}.{name}"
    coll = ctx.scope.catalog.get(ctx.db, name)
    parts = stats.shard_documents(ctx, coll, name)
    if not ctx.conn.process.is_mongos:
        explained = _Explained(ns, coll, parts[0][1], query, verbosity, **options)
        return _reply(ctx, inner, explained.planner, explained.execution)
    stage = "SINGLE_SHARD" if len(parts) == 1 else "SHARD_MERGE"
    shard_plans: list[Document] = []
    shard_runs: list[Document] = []
    returned = keys = docs_examined = millis = 0
    for process, docs in parts:
        explained = _Explained(ns, coll, docs, query, verbosity, **options)
        identity = {
            "shardName": process.set_name,
            "connectionString": f"{process.set_name}/{process.address}",
        }
        shard_plans.append({**identity, "serverInfo": server_info(process), **explained.planner})
        if explained.execution is not None:
            run = explained.execution
            returned += run["nReturned"]
            keys += run["totalKeysExamined"]
            docs_examined += run["totalDocsExamined"]
            millis += run["executionTimeMillis"]
            shard_runs.append({"shardName": process.set_name, **run})
    planner: Document = {"mongosPlannerVersion": 1, "winningPlan": {"stage": stage, "shards": shard_plans}}
    execution: Document | None = None
    if verbosity != "queryPlanner":
        if query.limit:
            returned = min(returned, query.limit)
        totals = {
            "nReturned": returned,
            "executionTimeMillis": millis,
            "totalKeysExamined": keys,
            "totalDocsExamined": docs_examined,
        }
        execution = {
            **totals,
            "executionStages": {
                "stage": stage,
                **totals,
                "totalChildMillis": Int64(millis),
                "shards": shard_runs,
            },
        }
    return _reply(ctx, inner, planner, execution)


def _number(value: Any) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return abs(int(value))
    return 0


def _document(value: Any, field_name: str) -> Document:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CommandError(14, f"BSON field '{field_name}' is the wrong type, expected type 'object'")
    return value


def _collection(ctx: Context, inner: Document, name: str) -> str:
    value = inner.get(name)
    if not isinstance(value, str) or not value:
        raise CommandError(
            73, f"Invalid namespace specified '{ctx.db}.{value}'", code_name="InvalidNamespace"
        )
    return value


def _on_view(ctx: Context, name: str) -> bool:
    return views.is_view(ctx.scope.catalog, ctx.db, name)


# ---------------------------------------------------------------------------------------------
# the explained commands


def _explain_find(ctx: Context, inner: Document, verbosity: str) -> Document:
    name = _collection(ctx, inner, "find")
    query = Query(
        filter=_document(inner.get("filter"), "find.filter"),
        sort=_document(inner.get("sort"), "find.sort") or None,
        skip=_number(inner.get("skip")),
        limit=_number(inner.get("limit")),
        projection=_document(inner.get("projection"), "find.projection") or None,
    )
    if _on_view(ctx, name):
        # mongod explains a read of a view as the aggregation it runs.
        pipeline: list[Document] = []
        if query.filter:
            pipeline.append({"$match": query.filter})
        if query.sort:
            pipeline.append({"$sort": query.sort})
        if query.skip:
            pipeline.append({"$skip": query.skip})
        if query.limit:
            pipeline.append({"$limit": query.limit})
        if query.projection:
            pipeline.append({"$project": query.projection})
        return _explain_pipeline(ctx, inner, name, pipeline, verbosity)
    return _explain_query(ctx, inner, name, query, verbosity)


def _explain_count(ctx: Context, inner: Document, verbosity: str) -> Document:
    name = _collection(ctx, inner, "count")
    query = Query(
        filter=_document(inner.get("query"), "count.query"),
        skip=_number(inner.get("skip")),
        limit=_number(inner.get("limit")),
    )

    if not query.filter:
        # Counting a whole collection reads its record count, not its documents.
        def fast(plan: Document, m: Measured | None) -> Document:
            count: Document = {"stage": "RECORD_STORE_FAST_COUNT"}
            if m is None:
                return count
            return {
                **count,
                **_counts(0, 1),
                "nCounted": m.returned,
                "nSkipped": min(query.skip, m.fetched),
            }

        return _explain_query(ctx, inner, name, query, verbosity, wrap=fast, returns=lambda m: 0)

    def counted(plan: Document, m: Measured | None) -> Document:
        if m is None:
            return {"stage": "COUNT", "inputStage": plan}
        return {
            "stage": "COUNT",
            **_counts(0, m.returned + 1),
            "nCounted": m.returned,
            "nSkipped": min(query.skip, m.fetched),
            "inputStage": plan,
        }

    return _explain_query(ctx, inner, name, query, verbosity, wrap=counted, returns=lambda m: 0)


def _counts(returned: int, works: int) -> Document:
    return {
        "nReturned": returned,
        "executionTimeMillisEstimate": 0,
        "works": works,
        "advanced": returned,
        "needTime": max(0, works - returned - 1),
        "needYield": 0,
        "saveState": 0,
        "restoreState": 0,
        "isEOF": 1,
    }


def _explain_distinct(ctx: Context, inner: Document, verbosity: str) -> Document:
    name = _collection(ctx, inner, "distinct")
    key = inner.get("key")
    if not isinstance(key, str):
        raise CommandError(40414, "BSON field 'distinct.key' is missing but a required field")
    filter_ = _document(inner.get("query"), "distinct.query")
    coll = ctx.scope.catalog.get(ctx.db, name)
    index = None
    if coll is not None and set(filter_) <= {key}:
        index = next(
            (
                i
                for i in coll.indexes.values()
                if next(iter(i.key)) == key and next(iter(i.key.values())) in (1, -1) and not i.partial
            ),
            None,
        )
    if index is None:
        return _explain_query(ctx, inner, name, Query(filter=filter_), verbosity)
    values = crud.distinct(ctx.scope.catalog, ctx.db, name, key, filter_)
    predicate = plans.candidates(coll, filter_)
    bounds = (
        plans.describe(coll, predicate[0], Query(filter=filter_))["inputStage"]["indexBounds"]
        if predicate
        else {path: ["[MinKey, MaxKey]"] for path in index.key}
    )
    scan: Document = {
        "stage": "DISTINCT_SCAN",
        "keyPattern": dict(index.key),
        "indexName": index.name,
        "isMultiKey": False,
        "multiKeyPaths": {path: [] for path in index.key},
        "isUnique": bool(index.spec.get("unique", False)),
        "isSparse": index.sparse,
        "isPartial": False,
        "indexVersion": 2,
        "direction": "forward",
        "indexBounds": bounds,
    }
    plan: Document = {"stage": "PROJECTION_COVERED", "transformBy": {key: 1, "_id": 0}, "inputStage": scan}
    planner: Document = {
        "namespace": f"{ctx.db}.{name}",
        "indexFilterSet": False,
        "parsedQuery": plans.parsed_query(filter_),
        "queryHash": plans.query_hash(filter_, None, {key: 1}),
        "planCacheKey": plans.query_hash({"": filter_}, None, {key: 1}),
        "maxIndexedOrSolutionsReached": False,
        "maxIndexedAndSolutionsReached": False,
        "maxScansToExplodeReached": False,
        "winningPlan": plan,
        "rejectedPlans": [],
    }
    execution: Document | None = None
    if verbosity != "queryPlanner":
        n = len(values)
        stages = copy.deepcopy(plan)
        stages["inputStage"] = {
            "stage": "DISTINCT_SCAN",
            **_counts(n, n + 1),
            **{k: v for k, v in scan.items() if k != "stage"},
            "keysExamined": n,
        }
        stages = {
            "stage": "PROJECTION_COVERED",
            **_counts(n, n + 1),
            **{k: v for k, v in stages.items() if k != "stage"},
        }
        execution = {
            "executionSuccess": True,
            "nReturned": n,
            "executionTimeMillis": 0,
            "totalKeysExamined": n,
            "totalDocsExamined": 0,
            "executionStages": stages,
        }
        if verbosity == "allPlansExecution":
            execution["allPlansExecution"] = []
    return _reply(ctx, inner, planner, execution)


def _single_statement(inner: Document, field_name: str) -> Document:
    statements = inner.get(field_name)
    if not isinstance(statements, list) or not statements:
        raise CommandError(
            40414, f"BSON field '{next(iter(inner))}.{field_name}' is missing but a required field"
        )
    if len(statements) != 1:
        raise CommandError(16, "explained write batches must be of size 1", code_name="InvalidLength")
    statement = statements[0]
    if not isinstance(statement, dict):
        raise CommandError(14, f"BSON field '{field_name}' must hold documents", code_name="TypeMismatch")
    return statement


def _would_modify(
    ctx: Context, name: str, query: Query, update: Any, array_filters: Any, limit: int
) -> tuple[int, int]:
    """How many documents an update would match and change (none is written)."""
    matched = crud.select_in(ctx.scope.catalog, ctx.db, name, query.filter, sort=query.sort, limit=limit)
    tools = ctx.scope.catalog.engine[ctx.db][name]
    modified = 0
    for doc in matched:
        new = apply_update(
            tools,
            doc,
            query.filter,
            update,
            inserting=False,
            array_filters=array_filters if isinstance(array_filters, list) else None,
        )
        if new != doc:
            modified += 1
    return len(matched), modified


def _update_wrap(matched: int, modified: int, upsert: bool) -> Wrap:
    def wrap(plan: Document, m: Measured | None) -> Document:
        if m is None:
            return {"stage": "UPDATE", "inputStage": plan}
        return {
            "stage": "UPDATE",
            **_counts(0, m.fetched + 1),
            "nMatched": matched,
            "nWouldModify": modified,
            "nWouldUpsert": 1 if upsert and not matched else 0,
            "inputStage": plan,
        }

    return wrap


def _delete_wrap(plan: Document, m: Measured | None) -> Document:
    if m is None:
        return {"stage": "DELETE", "inputStage": plan}
    return {"stage": "DELETE", **_counts(0, m.fetched + 1), "nWouldDelete": m.fetched, "inputStage": plan}


def _explain_update(ctx: Context, inner: Document, verbosity: str) -> Document:
    name = _collection(ctx, inner, "update")
    statement = _single_statement(inner, "updates")
    query = Query(filter=_document(statement.get("q"), "update.updates.q"))
    limit = 0 if statement.get("multi") else 1
    matched, modified = _would_modify(
        ctx, name, query, statement.get("u"), statement.get("arrayFilters"), limit
    )
    wrap = _update_wrap(matched, modified, bool(statement.get("upsert")))
    return _explain_query(
        ctx,
        inner,
        name,
        query,
        verbosity,
        wrap=wrap,
        returns=lambda m: 0,
        measure_as=Query(query.filter, limit=limit),
    )


def _explain_delete(ctx: Context, inner: Document, verbosity: str) -> Document:
    name = _collection(ctx, inner, "delete")
    statement = _single_statement(inner, "deletes")
    query = Query(filter=_document(statement.get("q"), "delete.deletes.q"))
    limit = 1 if _number(statement.get("limit")) == 1 else 0
    return _explain_query(
        ctx,
        inner,
        name,
        query,
        verbosity,
        wrap=_delete_wrap,
        returns=lambda m: 0,
        measure_as=Query(query.filter, limit=limit),
    )


def _explain_find_and_modify(ctx: Context, inner: Document, verbosity: str) -> Document:
    name = inner.get("findAndModify", inner.get("findandmodify"))
    if not isinstance(name, str) or not name:
        raise CommandError(73, f"Invalid namespace specified '{ctx.db}.{name}'", code_name="InvalidNamespace")
    query = Query(
        filter=_document(inner.get("query"), "findAndModify.query"),
        sort=_document(inner.get("sort"), "findAndModify.sort") or None,
    )
    measure_as = Query(query.filter, sort=query.sort, limit=1)
    if inner.get("remove"):
        return _explain_query(
            ctx, inner, name, query, verbosity, wrap=_delete_wrap, returns=lambda m: 0, measure_as=measure_as
        )
    matched, modified = _would_modify(ctx, name, query, inner.get("update"), inner.get("arrayFilters"), 1)
    wrap = _update_wrap(matched, modified, bool(inner.get("upsert")))
    return _explain_query(
        ctx, inner, name, query, verbosity, wrap=wrap, returns=lambda m: 0, measure_as=measure_as
    )


def _explain_aggregate(ctx: Context, inner: Document, verbosity: str) -> Document:
    return explain_aggregate(ctx, inner, verbosity)


def explain_aggregate(ctx: Context, inner: Document, verbosity: str) -> Document:
    """The explain of aggregation ``inner`` (an ``aggregate`` command) at ``verbosity``."""
    target = inner.get("aggregate")
    pipeline = inner.get("pipeline")
    if not isinstance(pipeline, list):
        raise CommandError(40414, "BSON field 'aggregate.pipeline' is missing but a required field")
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            raise CommandError(40323, "A pipeline stage specification object must contain exactly one field.")
    first = next(iter(pipeline[0]), "") if pipeline else ""
    if first == "$changeStream":
        raise CommandError(
            2, "explain of a $changeStream is not supported by the embedded replica set; open the stream"
        )
    coll_name = None if target == 1 else _collection(ctx, inner, "aggregate")
    if first in ("$collStats", "$currentOp"):
        spec = pipeline[0][first]
        if first == "$currentOp":
            made = current_op.current_op_stage(ctx, coll_name, spec)
        else:
            if coll_name is None:
                raise CommandError(
                    73,
                    "{aggregate: 1} is not valid for '$collStats'; a collection is required.",
                    code_name="InvalidNamespace",
                )
            made = stats.coll_stats_documents(ctx, coll_name, spec)
        return _stages_reply(ctx, inner, _stages(ctx, [{first: spec}], made, pipeline[1:], verbosity))
    if coll_name is None:
        raise CommandError(
            73,
            f"{{aggregate: 1}} is not valid for '{first}'; a collection is required.",
            code_name="InvalidNamespace",
        )
    return _explain_pipeline(ctx, inner, coll_name, pipeline, verbosity)


def _explain_pipeline(
    ctx: Context, inner: Document, name: str, pipeline: list[Document], verbosity: str
) -> Document:
    resolved = views.resolve(ctx.scope.catalog, ctx.db, name)
    if resolved is not None:
        name, view_stages = resolved
        pipeline = view_stages + pipeline
    for stage in pipeline:
        (stage_name,) = stage
        if stage_name in crud.FIRST_STAGES:
            raise CommandError(40602, f"{stage_name} is only valid as the first stage in a pipeline.")
    # The leading $match (all of them), $sort and $limit become the query the $cursor stage runs.
    filters: list[Document] = []
    position = 0
    while position < len(pipeline) and "$match" in pipeline[position]:
        filters.append(pipeline[position]["$match"])
        position += 1
    query_filter: Document = filters[0] if len(filters) == 1 else ({"$and": filters} if filters else {})
    sort = None
    limit = 0
    if position < len(pipeline) and "$sort" in pipeline[position]:
        sort = pipeline[position]["$sort"]
        position += 1
    if position < len(pipeline) and "$limit" in pipeline[position]:
        limit = _number(pipeline[position]["$limit"])
        position += 1
    query = Query(filter=query_filter, sort=sort, limit=limit)
    rest = pipeline[position:]
    if not rest:
        return _explain_query(ctx, inner, name, query, verbosity)
    ns = f"{ctx.db}.{name}"
    coll = ctx.scope.catalog.get(ctx.db, name)
    parts = stats.shard_documents(ctx, coll, name)
    per_part: list[tuple[Process, list[Document]]] = []
    for process, docs in parts:
        explained = _Explained(ns, coll, docs, query, verbosity)
        cursor_stage: Document = {"queryPlanner": explained.planner}
        if explained.execution is not None:
            cursor_stage["executionStats"] = explained.execution
        selected = (
            crud.select_from(docs, query.filter, query.sort, 0, query.limit) if coll is not None else []
        )
        made = [copy.deepcopy(d) for d in selected]
        per_part.append((process, _stages(ctx, [{"$cursor": cursor_stage}], made, rest, verbosity)))
    if not ctx.conn.process.is_mongos:
        return _stages_reply(ctx, inner, per_part[0][1])
    # mongos sends the pipeline to the shards that hold the collection and merges what they return.
    reply: Document = {
        "explainVersion": "1",
        "mergeType": "mongos",
        "splitPipeline": None,
        "shards": {
            process.set_name: {"host": process.address, "stages": staged} for process, staged in per_part
        },
    }
    reply.update(_reply(ctx, inner, {}, None))
    del reply["queryPlanner"]
    return reply


def _stages(
    ctx: Context, leading: list[Document], docs: list[Document], rest: list[Document], verbosity: str
) -> list[Document]:
    """``leading`` (the stages that made ``docs``), then ``rest``, each with what it passed on
    when the verbosity asks for counts."""
    counting = verbosity != "queryPlanner"
    out: list[Document] = []
    for stage in leading:
        entry = dict(stage)
        if counting:
            entry.update({"nReturned": Int64(len(docs)), "executionTimeMillisEstimate": Int64(0)})
        out.append(entry)
    for stage in rest:
        entry = dict(stage)
        if counting:
            docs = crud.run_pipeline_over(ctx.scope.catalog, ctx.db, docs, [stage])
            entry.update({"nReturned": Int64(len(docs)), "executionTimeMillisEstimate": Int64(0)})
        out.append(entry)
    return out


def _stages_reply(ctx: Context, inner: Document, stages_: list[Document]) -> Document:
    """An aggregation's explain as its ``stages``."""
    return {
        "explainVersion": "1",
        "stages": stages_,
        "command": {**inner, "$db": ctx.db},
        "serverInfo": server_info(ctx.conn.process),
        "serverParameters": dict(SERVER_PARAMETERS),
        "ok": 1.0,
    }


_EXPLAINERS: dict[str, Callable[[Context, Document, str], Document]] = {
    "find": _explain_find,
    "aggregate": _explain_aggregate,
    "count": _explain_count,
    "distinct": _explain_distinct,
    "update": _explain_update,
    "delete": _explain_delete,
    "findAndModify": _explain_find_and_modify,
    "findandmodify": _explain_find_and_modify,
}


@command("explain", counter="command")
async def cmd_explain(ctx: Context) -> Document:
    inner = ctx.cmd.get("explain")
    if not isinstance(inner, dict) or not inner:
        raise CommandError(
            14,
            "BSON field 'explain.explain' is the wrong type, expected type 'object'",
            code_name="TypeMismatch",
        )
    verbosity = ctx.cmd.get("verbosity", "allPlansExecution")
    if verbosity not in VERBOSITIES:
        raise CommandError(
            2, "verbosity string must be one of {'queryPlanner', 'executionStats', 'allPlansExecution'}"
        )
    name = next(iter(inner))
    explainer = _EXPLAINERS.get(name)
    if explainer is None:
        try:
            lookup(name, ctx.conn.process.role)
        except CommandError:
            raise CommandError(59, f"Explain failed due to unknown command: {name}") from None
        raise CommandError(20, f"Cannot explain cmd: {name}", code_name="IllegalOperation")
    inner = {k: v for k, v in inner.items() if k != "$db"}
    return explainer(ctx, inner, verbosity)
