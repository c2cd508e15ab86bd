"""Query plans as ``explain`` shows them: the plan mongod's classic planner would choose among a
collection's indexes, measured by running it over the collection's documents.

The embedded server answers every read by scanning (:mod:`~flowwarden_embedded.crud`); a plan
here says how mongod would have answered the same query, and its counts are real ones, those of
that plan over the documents stored now:

* a filter that is nothing but an equality on ``_id`` is an ``IDHACK``;
* otherwise every index whose first field the filter constrains at its top level, with operators
  an index answers (a value, ``$eq``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in``; a hashed
  index equality only), is a candidate ``IXSCAN`` under a ``FETCH`` that applies the rest of the
  filter. Sparse, partial, hidden, text, geo and wildcard indexes are never candidates;
* the candidate that examines the fewest index keys wins (mongod's trial run rewards the plan
  that produces results for the least work), the others are its ``rejectedPlans``; with no
  candidate the plan is a ``COLLSCAN``;
* a sort the winning index does not give is a ``SORT`` stage, a skip and a limit ``SKIP`` and
  ``LIMIT`` (a limit under a sort is the sort's ``limitAmount``), a projection
  ``PROJECTION_SIMPLE`` (only inclusions or only exclusions) or ``PROJECTION_DEFAULT``.

``keysExamined`` counts the index keys inside the bounds (one per array element of a multikey
field), ``docsExamined`` the documents fetched or scanned (a scan that a limit ends early stops
at the last document it needed), ``nReturned`` what each stage passes up; the root's is what the
query returns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flowwarden_embedded import engine
from flowwarden_embedded.hashing import hashed_index_key
from flowwarden_embedded.keys import format_value, value_key
from flowwarden_embedded.storage import Collection, Document, IndexSpec, path_values

# The operators an index scan answers; a hashed index answers equality only.
_RANGE_OPERATORS = frozenset({"$eq", "$gt", "$gte", "$lt", "$lte", "$in"})
_EQUALITY_OPERATORS = frozenset({"$eq", "$in"})
_SORT_MEMORY_LIMIT = 104_857_600
# Stages that make their own documents: a pipeline that starts with one reads no collection.
GENERATING_STAGES = frozenset({"$collStats", "$currentOp", "$changeStream", "$documents", "$indexStats"})


@dataclass(slots=True)
class Query:
    """What a plan answers: a filter and the find options around it."""

    filter: Document
    sort: Document | None = None
    skip: int = 0
    limit: int = 0
    projection: Document | None = None


@dataclass(slots=True)
class Access:
    """How a plan reaches documents: a collection scan, an index scan or the ``_id`` lookup."""

    stage: str  # COLLSCAN, IXSCAN or IDHACK
    index: IndexSpec | None = None
    # The indexed field's condition, and what of the filter the FETCH above the scan applies.
    predicate: Document | None = None
    rest: Document = field(default_factory=dict)


@dataclass(slots=True)
class Measured:
    """What running a plan over the documents counted."""

    keys_examined: int = 0
    docs_examined: int = 0
    # Documents the scan produced, then the FETCH (filter applied), then the sort, skip and limit.
    scanned: int = 0
    fetched: int = 0
    sorted: int = 0
    skipped: int = 0
    returned: int = 0
    multikey: bool = False
    dups_tested: int = 0
    dups_dropped: int = 0


def parsed_query(query: Document) -> Document:
    """The filter as mongod's parser normalises it: equalities as ``$eq``, each operator its own
    term, several terms under ``$and``."""
    terms: list[Document] = []
    for key, value in query.items():
        if key.startswith("$"):
            terms.append({key: value})
        elif _is_operator_document(value):
            terms.extend({key: {op: operand}} for op, operand in value.items())
        else:
            terms.append({key: {"$eq": value}})
    if not terms:
        return {}
    return terms[0] if len(terms) == 1 else {"$and": terms}


def _is_operator_document(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(str(k).startswith("$") for k in value)


def query_hash(query: Document, sort: Document | None, projection: Document | None) -> str:
    """An 8-hex-digit digest of the query's shape (fields and operators, not values), as mongod's
    ``queryHash`` and ``planCacheKey`` are."""

    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        if isinstance(value, list):
            return [shape(v) for v in value]
        return "?"

    text = json.dumps([shape(query), sort or {}, projection or {}], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8].upper()


# ---------------------------------------------------------------------------------------------
# choosing


def _usable(index: IndexSpec) -> bool:
    spec = index.spec
    if spec.get("hidden") or index.sparse or index.partial is not None:
        return False
    kinds = list(index.key.values())
    if any(isinstance(kind, str) and kind != "hashed" for kind in kinds):
        return False
    return not any("$**" in path for path in index.key)


def _predicate(query: Document, path: str, hashed: bool) -> Document | None:
    """The condition ``query`` puts on ``path`` at its top level, when an index can answer it."""
    if path not in query:
        return None
    value = query[path]
    if _is_operator_document(value):
        allowed = _EQUALITY_OPERATORS if hashed else _RANGE_OPERATORS
        if not set(value) <= allowed:
            return None
        if any(isinstance(v, dict) and _is_operator_document(v) for v in value.values()):
            return None
        return dict(value)
    if isinstance(value, dict) and any(str(k).startswith("$") for k in value):
        return None
    if hasattr(value, "pattern") and hasattr(value, "flags"):  # a regular expression
        return None
    return {"$eq": value}


def is_id_lookup(query: Document) -> bool:
    """True for a filter that is nothing but an equality on ``_id`` (an IDHACK)."""
    if set(query) != {"_id"}:
        return False
    value = query["_id"]
    if isinstance(value, dict):
        return set(value) == {"$eq"} and not isinstance(value["$eq"], (dict, list))
    return not isinstance(value, list) and not (hasattr(value, "pattern") and hasattr(value, "flags"))


def candidates(coll: Collection | None, query: Document) -> list[Access]:
    """The index scans that could answer ``query``, in the collection's index order."""
    if coll is None:
        return []
    found: list[Access] = []
    for index in coll.indexes.values():
        if not _usable(index):
            continue
        first, kind = next(iter(index.key.items()))
        hashed = kind == "hashed"
        predicate = _predicate(query, first, hashed)
        if predicate is None:
            continue
        rest = query if hashed else {k: v for k, v in query.items() if k != first}
        found.append(Access("IXSCAN", index, predicate, rest))
    return found


def collection_scans(name: str, cmd: Document, coll: Collection | None) -> int:
    """How many collection scans mongod would run for command ``name`` on ``coll``: one per
    filter that neither the ``_id`` lookup nor an index answers (a missing collection is none)."""
    if coll is None:
        return 0
    filters: Iterable[Any]
    if name == "find":
        filters = [cmd.get("filter") or {}]
    elif name == "count":
        query = cmd.get("query") or {}
        filters = [query] if query else []
    elif name == "distinct":
        key = cmd.get("key")
        query = cmd.get("query") or {}
        if (
            isinstance(key, str)
            and not query
            and any(
                _usable(i) and next(iter(i.key)) == key and next(iter(i.key.values())) != "hashed"
                for i in coll.indexes.values()
            )
        ):
            filters = []
        else:
            filters = [query]
    elif name == "aggregate":
        pipeline = cmd.get("pipeline")
        first = pipeline[0] if isinstance(pipeline, list) and pipeline else {}
        if isinstance(first, dict) and set(first) & GENERATING_STAGES:
            filters = []
        else:
            filters = [first.get("$match") or {}] if isinstance(first, dict) else [{}]
    elif name == "update":
        filters = [s.get("q") or {} for s in cmd.get("updates") or [] if isinstance(s, dict)]
    elif name == "delete":
        filters = [s.get("q") or {} for s in cmd.get("deletes") or [] if isinstance(s, dict)]
    elif name == "findAndModify":
        filters = [cmd.get("query") or {}]
    else:
        return 0
    scans = 0
    for query in filters:
        if isinstance(query, dict) and not is_id_lookup(query) and not candidates(coll, query):
            scans += 1
    return scans


# ---------------------------------------------------------------------------------------------
# measuring


def _key_in_bounds(predicate: Document, value: Any, hashed: bool) -> bool:
    if hashed:
        wanted = predicate["$in"] if "$in" in predicate else [predicate["$eq"]]
        return any(hashed_index_key(value) == hashed_index_key(w) for w in wanted)
    try:
        return engine.matches({"k": predicate}, {"k": value})
    except engine.ENGINE_ERRORS:
        return False


def _index_keys(doc: Document, path: str) -> list[Any]:
    values = path_values(doc, path)
    return values if values else [None]


def measure(access: Access, docs: list[Document], query: Query) -> Measured:
    """Run the plan over ``docs`` (the collection's documents in natural order) and count."""
    result = Measured()
    needed = query.skip + query.limit if query.limit and not query.sort else None
    produced: list[Document] = []
    if access.index is not None:
        result.multikey = _multikey_in(docs, next(iter(access.index.key)))
    for doc in docs:
        if needed is not None and len(produced) >= needed:
            break
        if access.stage == "COLLSCAN":
            result.docs_examined += 1
            result.scanned += 1
            if _matches(query.filter, doc):
                produced.append(doc)
            continue
        if access.stage == "IDHACK":
            if _matches(query.filter, doc):
                result.keys_examined += 1
                result.docs_examined += 1
                result.scanned += 1
                produced.append(doc)
                break
            continue
        assert access.index is not None and access.predicate is not None
        first, kind = next(iter(access.index.key.items()))
        keys = _index_keys(doc, first)
        hits = sum(1 for v in keys if _key_in_bounds(access.predicate, v, kind == "hashed"))
        if not hits:
            continue
        result.keys_examined += hits
        if result.multikey:
            result.dups_tested += hits
            result.dups_dropped += hits - 1
        result.scanned += 1
        result.docs_examined += 1
        if _matches(access.rest, doc):
            produced.append(doc)
    result.fetched = len(produced)
    if access.stage == "COLLSCAN":
        result.scanned = result.fetched
    result.sorted = result.fetched
    if query.sort and query.limit:
        result.sorted = min(result.fetched, query.skip + query.limit)
    result.skipped = max(0, result.sorted - query.skip)
    result.returned = min(result.skipped, query.limit) if query.limit else result.skipped
    return result


def _raw_value(doc: Document, path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _matches(query: Document, doc: Document) -> bool:
    if not query:
        return True
    return bool(engine.matches(query, doc))


def choose(coll: Collection | None, docs: list[Document], query: Query) -> tuple[Access, list[Access]]:
    """The winning access path and the rejected ones."""
    if coll is None:
        return Access("EOF"), []
    if is_id_lookup(query.filter) and "_id_" in coll.indexes:
        return Access("IDHACK"), []
    found = candidates(coll, query.filter)
    if not found:
        return Access("COLLSCAN", rest=query.filter), []
    if len(found) == 1:
        return found[0], []
    costs = [measure(a, docs, query).keys_examined for a in found]
    best = min(range(len(found)), key=lambda i: costs[i])
    return found[best], [a for i, a in enumerate(found) if i != best]


# ---------------------------------------------------------------------------------------------
# describing


def _interval_text(low: Any, low_in: bool, high: Any, high_in: bool) -> str:
    return f"{'[' if low_in else '('}{_bound(low)}, {_bound(high)}{']' if high_in else ')'}"


def _bound(value: Any) -> str:
    if isinstance(value, _Infinite):
        return value.text
    return format_value(value)


class _Infinite:
    def __init__(self, text: str) -> None:
        self.text = text


_MIN_KEY, _MAX_KEY = _Infinite("MinKey"), _Infinite("MaxKey")
_NEG_INF, _POS_INF = _Infinite("-inf.0"), _Infinite("inf.0")
_FULL = "[MinKey, MaxKey]"


def _intervals(predicate: Document, hashed: bool) -> list[str]:
    """The index bounds of one field's condition, ascending."""
    if "$eq" in predicate or "$in" in predicate:
        values = predicate["$in"] if "$in" in predicate else [predicate["$eq"]]
        if not isinstance(values, list):
            return [_FULL]
        if hashed:
            values = [hashed_index_key(v) for v in values]
        unique: dict[Any, Any] = {}
        for value in values:
            unique.setdefault(value_key(value), value)
        ordered = sorted(unique.values(), key=lambda v: engine.sort_key("v", {"v": v}))
        return [_interval_text(v, True, v, True) for v in ordered]
    low: Any = None
    high: Any = None
    low_in = high_in = True
    if "$gt" in predicate or "$gte" in predicate:
        low_in = "$gte" in predicate
        low = predicate["$gte"] if low_in else predicate["$gt"]
    if "$lt" in predicate or "$lte" in predicate:
        high_in = "$lte" in predicate
        high = predicate["$lte"] if high_in else predicate["$lt"]
    sample = low if low is not None else high
    bottom: Any
    top: Any
    if isinstance(sample, (int, float)) and not isinstance(sample, bool):
        bottom, top = _NEG_INF, _POS_INF
    elif isinstance(sample, str):
        bottom, top = "", {}
    else:
        bottom, top = _MIN_KEY, _MAX_KEY
    if low is None:
        low, low_in = bottom, True
    if high is None:
        high, high_in = top, not isinstance(sample, str)
    return [_interval_text(low, low_in, high, high_in)]


def _reversed(interval: str) -> str:
    opening, closing = interval[0], interval[-1]
    low, high = interval[1:-1].split(", ", 1) if ", " in interval else (interval[1:-1], "")
    return ("[" if closing == "]" else "(") + f"{high}, {low}" + ("]" if opening == "[" else ")")


def _direction(access: Access, sort: Document | None) -> str:
    if access.index is None or not sort:
        return "forward"
    first, kind = next(iter(access.index.key.items()))
    if len(sort) == 1 and first in sort and kind in (1, -1) and sort[first] == -kind:
        return "backward"
    return "forward"


def _index_gives_sort(access: Access, sort: Document | None) -> bool:
    if access.index is None or not sort or len(sort) != 1:
        return False
    first, kind = next(iter(access.index.key.items()))
    return first in sort and kind in (1, -1) and sort[first] in (1, -1)


def _stats(doc: Document, returned: int, works: int) -> Document:
    doc.update(
        {
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
    )
    return doc


def _with_stats(stage: Document, stats: Document | None) -> Document:
    """``stage`` as ``winningPlan`` shows it, or with ``stats`` as ``executionStages`` does:
    the counts come after ``stage``'s name and before its own fields."""
    if stats is None:
        return stage
    head: Document = {k: stage.pop(k) for k in ("stage", "filter") if k in stage}
    return {**head, **stats, **stage}


def describe(
    coll: Collection | None, access: Access, query: Query, measured: Measured | None = None
) -> Document:
    """The plan's stage tree, as ``winningPlan`` shows it; with ``measured``, as
    ``executionStages`` does, with each stage's counts."""
    m = measured

    def counts(returned: int, works: int) -> Document | None:
        return None if m is None else _stats({}, returned, works)

    parsed = parsed_query(query.filter)
    plan: Document
    if access.stage == "EOF":
        plan = {"stage": "EOF"}
        if m is not None:
            plan = _with_stats(plan, counts(0, 1))
    elif access.stage == "COLLSCAN":
        plan = {"stage": "COLLSCAN"}
        if parsed:
            plan["filter"] = parsed
        plan["direction"] = "forward"
        if m is not None:
            plan["docsExamined"] = m.docs_examined
            plan = _with_stats(plan, counts(m.fetched, m.docs_examined + 1))
    elif access.stage == "IDHACK":
        plan = {"stage": "IDHACK"}
        if m is not None:
            plan["keysExamined"] = m.keys_examined
            plan["docsExamined"] = m.docs_examined
            plan = _with_stats(plan, counts(m.fetched, m.keys_examined + 1))
    else:
        plan = _index_plan(coll, access, query, m)
    sort_stage = bool(query.sort) and not _index_gives_sort(access, query.sort)
    if sort_stage:
        plan = {
            "stage": "SORT",
            "sortPattern": dict(query.sort or {}),
            "memLimit": _SORT_MEMORY_LIMIT,
            **({"limitAmount": query.skip + query.limit} if query.limit else {}),
            "type": "simple",
            "inputStage": plan,
        }
        if m is not None:
            plan = _with_stats(plan, counts(m.sorted, m.fetched + m.sorted + 1))
    if query.skip:
        plan = {"stage": "SKIP", "skipAmount": query.skip, "inputStage": plan}
        if m is not None:
            plan = _with_stats(plan, counts(m.skipped, m.sorted + 1))
    if query.limit and not sort_stage:
        plan = {"stage": "LIMIT", "limitAmount": query.limit, "inputStage": plan}
        if m is not None:
            plan = _with_stats(plan, counts(m.returned, m.returned + 1))
    if query.projection:
        simple = all(
            isinstance(v, (bool, int, float)) and not isinstance(v, dict) for v in query.projection.values()
        )
        plan = {
            "stage": "PROJECTION_SIMPLE" if simple else "PROJECTION_DEFAULT",
            "transformBy": dict(query.projection),
            "inputStage": plan,
        }
        if m is not None:
            plan = _with_stats(plan, counts(m.returned, m.returned + 1))
    return plan


def _index_plan(coll: Collection | None, access: Access, query: Query, m: Measured | None) -> Document:
    index = access.index
    assert index is not None and access.predicate is not None
    direction = _direction(access, query.sort)
    bounds: Document = {}
    multikey_paths: Document = {}
    multikey = bool(m and m.multikey) or _is_multikey(coll, index)
    for position, (path, kind) in enumerate(index.key.items()):
        hashed = kind == "hashed"
        intervals = _intervals(access.predicate, hashed) if position == 0 else [_FULL]
        descending = (kind == -1) != (direction == "backward")
        if descending:
            intervals = [_reversed(i) for i in reversed(intervals)]
        bounds[path] = intervals
        multikey_paths[path] = [path] if multikey and position == 0 else []
    scan: Document = {
        "stage": "IXSCAN",
        "keyPattern": dict(index.key),
        "indexName": index.name,
        "isMultiKey": multikey,
        "multiKeyPaths": multikey_paths,
        "isUnique": bool(index.spec.get("unique", False)),
        "isSparse": index.sparse,
        "isPartial": index.partial is not None,
        "indexVersion": 2,
        "direction": direction,
        "indexBounds": bounds,
    }
    if m is not None:
        scan.update(
            {
                "keysExamined": m.keys_examined,
                "seeks": 1,
                "dupsTested": m.dups_tested,
                "dupsDropped": m.dups_dropped,
            }
        )
        scan = _with_stats(scan, _stats({}, m.scanned, m.keys_examined + 1))
    fetch: Document = {"stage": "FETCH"}
    rest = parsed_query(access.rest)
    if rest:
        fetch["filter"] = rest
    if m is not None:
        fetch["docsExamined"] = m.docs_examined
        fetch["alreadyHasObj"] = 0
    fetch["inputStage"] = scan
    if m is not None:
        fetch = _with_stats(fetch, _stats({}, m.fetched, m.scanned + 1))
    return fetch


def _is_multikey(coll: Collection | None, index: IndexSpec) -> bool:
    return coll is not None and _multikey_in(coll.docs.values(), next(iter(index.key)))


def _multikey_in(docs: Iterable[Document], path: str) -> bool:
    """True when some document has an array on ``path`` (an index on it is multikey)."""
    return any(len(path_values(doc, path)) > 1 or isinstance(_raw_value(doc, path), list) for doc in docs)
