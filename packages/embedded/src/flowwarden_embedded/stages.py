"""The user stages of a change-stream pipeline, applied to one event document at a time.

Only the stages MongoDB allows after ``$changeStream`` exist here: ``$match``, ``$project``,
``$addFields``/``$set``, ``$unset``, ``$replaceRoot``/``$replaceWith``, ``$redact``, and
``$changeStreamSplitLargeEvent``, which is checked here but not compiled: splitting is the
cursor's work (:mod:`~flowwarden_embedded.largeevents`). Any other stage is refused when
the stream opens, with MongoDB's error.

Hard rule: a stage never mutates its input document (events are shared between streams and
cached). ``$match`` is compiled in :mod:`~flowwarden_embedded.eventmatch`; expressions
the stages here do not evaluate themselves go to the query engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flowwarden_embedded import engine
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.eventmatch import Event, compile_match

Stage = Callable[[Event], "Event | None"]
"""One compiled stage: the transformed document, or None when a ``$match`` drops it."""

SPLIT_STAGE = "$changeStreamSplitLargeEvent"

ALLOWED_STAGES = frozenset(
    {
        "$match",
        "$project",
        "$addFields",
        "$set",
        "$unset",
        "$replaceRoot",
        "$replaceWith",
        "$redact",
        SPLIT_STAGE,
    }
)

# Every stage name MongoDB 8 knows, so an unknown name gets 40324 and a known-but-forbidden one 20.
KNOWN_STAGES = ALLOWED_STAGES | frozenset(
    {
        "$bucket",
        "$bucketAuto",
        "$changeStream",
        "$collStats",
        "$count",
        "$currentOp",
        "$densify",
        "$documents",
        "$facet",
        "$fill",
        "$geoNear",
        "$graphLookup",
        "$group",
        "$indexStats",
        "$limit",
        "$listLocalSessions",
        "$listSampledQueries",
        "$listSearchIndexes",
        "$listSessions",
        "$lookup",
        "$merge",
        "$out",
        "$planCacheStats",
        "$querySettings",
        "$rankFusion",
        "$sample",
        "$scoreFusion",
        "$search",
        "$searchMeta",
        "$setWindowFields",
        "$shardedDataDistribution",
        "$skip",
        "$sort",
        "$sortByCount",
        "$unionWith",
        "$unwind",
        "$vectorSearch",
    }
)

_MISSING: Any = object()


def compile_pipeline(stages: list[Any]) -> list[Stage]:
    """Validate the stages after ``$changeStream`` and compile them, raising MongoDB's errors.

    A ``$changeStreamSplitLargeEvent`` is left out of the result; like MongoDB, every stage is
    parsed before its place is checked, so a malformed stage anywhere is reported first.
    """
    compiled: list[Stage] = []
    split_at: list[int] = []
    for position, stage in enumerate(stages):
        if not isinstance(stage, Mapping) or len(stage) != 1:
            raise CommandError(40323, "A pipeline stage specification object must contain exactly one field.")
        ((name, spec),) = stage.items()
        if name not in KNOWN_STAGES:
            raise CommandError(40324, f"Unrecognized pipeline stage name: '{name}'")
        if name == "$changeStream":
            raise CommandError(40602, "$changeStream is only valid as the first stage in a pipeline.")
        if name not in ALLOWED_STAGES:
            raise CommandError(20, f"{name} is not permitted in a $changeStream pipeline")
        if name == SPLIT_STAGE:
            if not isinstance(spec, Mapping) or spec:
                raise CommandError(7182800, f"{SPLIT_STAGE} spec should be an empty object")
            split_at.append(position)
            continue
        compiled.append(_COMPILERS[name](spec))
    if split_at and split_at[0] != len(stages) - 1:
        raise CommandError(7182802, f"{SPLIT_STAGE} must be the last stage in the pipeline")
    return compiled


def ends_with_split(stages: list[Any]) -> bool:
    """Whether a pipeline :func:`compile_pipeline` accepted asks for large events to be split."""
    return bool(stages) and isinstance(stages[-1], Mapping) and SPLIT_STAGE in stages[-1]


def run_pipeline(stages: list[Stage], doc: Event) -> Event | None:
    for stage in stages:
        result = stage(doc)
        if result is None:
            return None
        doc = result
    return doc


def stage_touches(stage_spec: Mapping[str, Any], fields: tuple[str, ...]) -> bool:
    """Whether a ``$match`` spec may read one of ``fields`` (conservative: any mention counts)."""
    text = repr(stage_spec)
    return any(f"'{name}" in text or f"${name}" in text for name in fields)


# -- expressions -------------------------------------------------------------------------------


def _evaluate(expr: Any, doc: Event) -> Any:
    """An aggregation expression's value on ``doc`` (``_MISSING`` for a missing field)."""
    if isinstance(expr, str):
        if expr == "$$REMOVE":
            return _MISSING
        if expr.startswith("$$"):
            if expr in ("$$ROOT", "$$CURRENT"):
                return doc
            if expr.startswith(("$$ROOT.", "$$CURRENT.")):
                return _get_path(doc, expr.split(".", 1)[1])
        elif expr.startswith("$"):
            return _get_path(doc, expr[1:])
        else:
            return expr
    if not isinstance(expr, (Mapping, list)):
        return expr
    try:
        return engine.evaluate_expression(expr, doc)
    except KeyError:
        return _MISSING
    except NotImplementedError as exc:
        raise CommandError(168, f"the embedded server cannot evaluate expression {expr!r}: {exc}") from None
    except CommandError:
        raise  # already MongoDB's error for it, code included
    except Exception as exc:  # the engine's OperationFailure and friends: report as a bad expression
        raise CommandError(2, f"Invalid expression {expr!r}: {exc}") from None


def _get_path(doc: Any, path: str) -> Any:
    """The value at a dotted path, mapping over arrays as MongoDB field paths do."""
    current = doc
    parts = path.split(".")
    for i, part in enumerate(parts):
        if isinstance(current, Mapping):
            if part not in current:
                return _MISSING
            current = current[part]
        elif isinstance(current, list):
            rest = ".".join(parts[i:])
            values = [_get_path(item, rest) for item in current if isinstance(item, Mapping)]
            return [v for v in values if v is not _MISSING]
        else:
            return _MISSING
    return current


# -- $project / $unset -------------------------------------------------------------------------


def _flatten_projection(spec: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in spec.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not any(str(k).startswith("$") for k in value):
            out.extend(_flatten_projection(value, f"{path}."))
        else:
            out.append((path, value))
    return out


def _tree(paths: list[str]) -> dict[str, Any]:
    """Dotted paths as a nested dict of leaves (``True``)."""
    root: dict[str, Any] = {}
    for path in paths:
        node = root
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is True:
                break
            if child is None:
                child = node[part] = {}
            node = child
        else:
            node[parts[-1]] = True
    return root


def _include(doc: Mapping[str, Any], tree: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        sub = tree.get(key)
        if sub is None:
            continue
        if sub is True:
            out[key] = value
        elif isinstance(value, Mapping):
            out[key] = _include(value, sub)
        elif isinstance(value, list):
            out[key] = [_include(item, sub) for item in value if isinstance(item, Mapping)]
    return out


def _exclude(doc: Mapping[str, Any], tree: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        sub = tree.get(key)
        if sub is True:
            continue
        if sub is None:
            out[key] = value
        elif isinstance(value, Mapping):
            out[key] = _exclude(value, sub)
        elif isinstance(value, list):
            out[key] = [_exclude(item, sub) if isinstance(item, Mapping) else item for item in value]
        else:
            out[key] = value
    return out


def _set_path(doc: dict[str, Any], parts: list[str], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at the path (copy-on-write along the path only)."""
    out = dict(doc)
    head = parts[0]
    if len(parts) == 1:
        if value is _MISSING:
            out.pop(head, None)
        else:
            out[head] = value
        return out
    child = out.get(head)
    if isinstance(child, list):
        out[head] = [_set_path(item if isinstance(item, dict) else {}, parts[1:], value) for item in child]
    else:
        out[head] = _set_path(child if isinstance(child, dict) else {}, parts[1:], value)
    return out


def compile_project(spec: Any) -> Stage:
    if not isinstance(spec, Mapping):
        raise CommandError(15969, "$project specification must be an object")
    if not spec:
        raise CommandError(
            51272, "Invalid $project :: caused by :: projection specification must have at least one field"
        )
    items = _flatten_projection(spec)
    included: list[str] = []
    excluded: list[str] = []
    computed: list[tuple[str, Any]] = []
    id_choice: bool | None = None
    for path, value in items:
        if isinstance(value, bool) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            flag = bool(value)
            if path == "_id":
                id_choice = flag
            elif flag:
                included.append(path)
            else:
                excluded.append(path)
        else:
            computed.append((path, value))
    # {_id: 1} alone is an inclusion too: the document is reduced to its _id.
    inclusion = bool(included or computed) or id_choice is True
    if inclusion and excluded:
        raise CommandError(
            31254,
            "Invalid $project :: caused by :: Cannot do exclusion on field "
            f"{excluded[0]} in inclusion projection",
        )
    if inclusion:
        if id_choice is not False:
            included.insert(0, "_id")
        tree = _tree(included)

        def project_in(doc: Event) -> Event | None:
            out = _include(doc, tree)
            for path, expr in computed:
                out = _set_path(out, path.split("."), _evaluate(expr, doc))
            return out

        return project_in
    if id_choice is False:
        excluded.insert(0, "_id")
    tree = _tree(excluded)
    return lambda doc: _exclude(doc, tree)


def compile_unset(spec: Any) -> Stage:
    fields = [spec] if isinstance(spec, str) else spec
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields):
        raise CommandError(
            31002, "$unset specification must be a string or an array containing at least one field"
        )
    tree = _tree(list(fields))
    return lambda doc: _exclude(doc, tree)


# -- $addFields / $set ------------------------------------------------------------------------


def compile_add_fields(spec: Any) -> Stage:
    if not isinstance(spec, Mapping):
        raise CommandError(40272, "$addFields specification stage must be an object")
    items = _flatten_projection(spec)

    def add_fields(doc: Event) -> Event | None:
        out = doc
        for path, expr in items:
            out = _set_path(out, path.split("."), _evaluate(expr, doc))
        return out

    return add_fields


# -- $replaceRoot / $replaceWith ---------------------------------------------------------------


def _replacer(expr: Any) -> Stage:
    def replace(doc: Event) -> Event | None:
        value = _evaluate(expr, doc)
        if not isinstance(value, dict):
            shown = "missing" if value is _MISSING else repr(value)
            raise CommandError(
                40228,
                f"'newRoot' expression must evaluate to an object, but resulting value was: {shown}. "
                f"Type of resulting value: '{type(value).__name__ if value is not _MISSING else 'missing'}'.",
            )
        return value

    return replace


def compile_replace_root(spec: Any) -> Stage:
    if not isinstance(spec, Mapping) or "newRoot" not in spec:
        raise CommandError(40231, "no newRoot specified for the $replaceRoot stage")
    return _replacer(spec["newRoot"])


def compile_replace_with(spec: Any) -> Stage:
    return _replacer(spec)


# -- $redact -----------------------------------------------------------------------------------

_KEEP = "\x00fw:KEEP"
_PRUNE = "\x00fw:PRUNE"
_DESCEND = "\x00fw:DESCEND"
_REDACT_VARS = {"$$KEEP": _KEEP, "$$PRUNE": _PRUNE, "$$DESCEND": _DESCEND}


def _literalize(expr: Any) -> Any:
    if isinstance(expr, str) and expr in _REDACT_VARS:
        return {"$literal": _REDACT_VARS[expr]}
    if isinstance(expr, Mapping):
        return {k: _literalize(v) for k, v in expr.items()}
    if isinstance(expr, list):
        return [_literalize(v) for v in expr]
    return expr


def compile_redact(spec: Any) -> Stage:
    expr = _literalize(spec)

    def redact_level(doc: dict[str, Any]) -> dict[str, Any] | None:
        verdict = _evaluate(expr, doc) if not isinstance(expr, str) else expr
        if verdict == _KEEP:
            return doc
        if verdict == _PRUNE:
            return None
        if verdict != _DESCEND:
            raise CommandError(
                17053,
                "$redact's expression should not return anything aside from the variables $$KEEP, "
                f"$$DESCEND, and $$PRUNE, but returned {verdict!r}",
            )
        out: dict[str, Any] = {}
        for key, value in doc.items():
            if isinstance(value, dict):
                kept = redact_level(value)
                if kept is not None:
                    out[key] = kept
            elif isinstance(value, list):
                items = []
                for item in value:
                    if isinstance(item, dict):
                        kept = redact_level(item)
                        if kept is not None:
                            items.append(kept)
                    else:
                        items.append(item)
                out[key] = items
            else:
                out[key] = value
        return out

    return redact_level


_COMPILERS: dict[str, Callable[[Any], Stage]] = {
    "$match": compile_match,
    "$project": compile_project,
    "$addFields": compile_add_fields,
    "$set": compile_add_fields,
    "$unset": compile_unset,
    "$replaceRoot": compile_replace_root,
    "$replaceWith": compile_replace_with,
    "$redact": compile_redact,
}


__all__ = [
    "ALLOWED_STAGES",
    "KNOWN_STAGES",
    "SPLIT_STAGE",
    "Stage",
    "compile_pipeline",
    "ends_with_split",
    "run_pipeline",
    "stage_touches",
]
