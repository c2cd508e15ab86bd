"""``$match`` on change events: the stage every filtered change stream runs on every event.

The common shapes (equality, ``$in``/``$nin``, ``$ne``, ``$exists``, comparisons on scalars,
``$and``/``$or``/``$nor``) are compiled once, when the stream opens, into Python predicates; a
shape outside that subset, or a value the predicates cannot judge (an array or a sub-document in
the way, a type they do not order), falls back to the query engine for that event.

Hard rule: a compiled predicate gives MongoDB's answer or declines (raises :class:`_Unsupported`)
and lets the engine answer; it never guesses. Where the engine departs from MongoDB on a shape the
predicates handle (it takes ``true`` for ``1``), the predicate keeps MongoDB's rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bson import ObjectId

from flowwarden_embedded import engine
from flowwarden_embedded.errors import CommandError

Event = dict[str, Any]
"""A change event as the user stages see it."""

_MISSING: Any = object()
_UNSURE: Any = object()

_Predicate = Callable[[Event], bool]

_NUMBER = (int, float)


def _scalar_class(value: Any) -> type | None:
    """The comparison class of a value the compiled $match handles, or None (use the fallback)."""
    if value is None:
        return type(None)
    if isinstance(value, bool):
        return bool
    if isinstance(value, _NUMBER):
        return float
    if isinstance(value, str):
        return str
    if isinstance(value, ObjectId):
        return ObjectId
    return None


def _resolve(doc: Any, parts: tuple[str, ...]) -> Any:
    """Value at a path, ``_MISSING`` when absent, ``_UNSURE`` when an array or document is in the
    way (array-matching and document-equality semantics are left to the fallback engine)."""
    current = doc
    for part in parts:
        if isinstance(current, dict):
            current = current.get(part, _MISSING)
            if current is _MISSING:
                return _MISSING
        elif isinstance(current, list):
            return _UNSURE
        else:
            return _MISSING
    if isinstance(current, (list, dict)):
        return _UNSURE
    return current


class _Unsupported(Exception):
    """The query shape is outside the compiled subset; use the fallback engine."""


def _eq(value: Any, target: Any, target_class: type) -> bool:
    cls = _scalar_class(value)
    if cls is None:
        raise _Unsupported
    return cls is target_class and value == target


def _compile_field(parts: tuple[str, ...], condition: Any) -> _Predicate:
    if isinstance(condition, Mapping):
        if not condition or not all(isinstance(k, str) and k.startswith("$") for k in condition):
            raise _Unsupported
        checks = [_compile_operator(parts, op, arg) for op, arg in condition.items()]
        if len(checks) == 1:
            return checks[0]
        return lambda doc: all(check(doc) for check in checks)
    return _compile_operator(parts, "$eq", condition)


def _compile_operator(parts: tuple[str, ...], op: str, arg: Any) -> _Predicate:
    if op in ("$eq", "$ne"):
        found_class = _scalar_class(arg)
        if found_class is None:
            raise _Unsupported
        target_class: type = found_class
        negate = op == "$ne"

        def eq(doc: Event) -> bool:
            value = _resolve(doc, parts)
            if value is _UNSURE:
                raise _Unsupported
            if value is _MISSING:
                hit = arg is None
            else:
                hit = _eq(value, arg, target_class)
            return hit != negate

        return eq
    if op in ("$in", "$nin"):
        if not isinstance(arg, list):
            raise _Unsupported
        targets: list[tuple[Any, type]] = []
        for target in arg:
            cls = _scalar_class(target)
            if cls is None:
                raise _Unsupported
            targets.append((target, cls))
        accepts_missing = any(t is None for t, _ in targets)
        negate = op == "$nin"

        def member(doc: Event) -> bool:
            value = _resolve(doc, parts)
            if value is _UNSURE:
                raise _Unsupported
            if value is _MISSING:
                hit = accepts_missing
            else:
                hit = any(_eq(value, t, cls) for t, cls in targets)
            return hit != negate

        return member
    if op == "$exists":
        wanted = bool(arg)

        def exists(doc: Event) -> bool:
            value = _resolve(doc, parts)
            if value is _UNSURE:
                raise _Unsupported
            return (value is not _MISSING) == wanted

        return exists
    if op in ("$gt", "$gte", "$lt", "$lte"):
        order_class = _scalar_class(arg)
        if order_class not in (float, str):
            raise _Unsupported
        compare: Callable[[Any, Any], bool] = {
            "$gt": lambda a, b: a > b,
            "$gte": lambda a, b: a >= b,
            "$lt": lambda a, b: a < b,
            "$lte": lambda a, b: a <= b,
        }[op]

        def ordered(doc: Event) -> bool:
            value = _resolve(doc, parts)
            if value is _UNSURE:
                raise _Unsupported
            if value is _MISSING or _scalar_class(value) is not order_class:
                return False
            return compare(value, arg)

        return ordered
    raise _Unsupported


def _combine(operator: str, subs: list[_Predicate]) -> _Predicate:
    if operator == "$and":
        return lambda doc: all(s(doc) for s in subs)
    if operator == "$or":
        return lambda doc: any(s(doc) for s in subs)
    return lambda doc: not any(s(doc) for s in subs)


def _compile_query(query: Mapping[str, Any]) -> _Predicate:
    checks: list[_Predicate] = []
    for key, value in query.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(value, list) or not value:
                raise _Unsupported
            subs = [_compile_query(sub) for sub in value if isinstance(sub, Mapping)]
            if len(subs) != len(value):
                raise _Unsupported
            checks.append(_combine(key, subs))
        elif key.startswith("$"):
            raise _Unsupported
        else:
            checks.append(_compile_field(tuple(key.split(".")), value))
    if len(checks) == 1:
        return checks[0]
    return lambda doc: all(check(doc) for check in checks)


def _fallback_match(query: Mapping[str, Any], doc: Event) -> bool:
    try:
        return engine.matches(query, doc)
    except NotImplementedError as exc:
        raise CommandError(2, f"the embedded server cannot evaluate $match {dict(query)!r}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CommandError(2, f"bad $match {dict(query)!r}: {exc}") from None


def compile_match(query: Any) -> Callable[[Event], Event | None]:
    """The ``$match`` stage for ``query``: the event itself when it matches, None when dropped."""
    if not isinstance(query, Mapping):
        raise CommandError(15959, "the match filter must be an expression in an object")
    fast: _Predicate | None
    try:
        fast = _compile_query(query) if query else (lambda doc: True)
    except _Unsupported:
        fast = None

    def match(doc: Event) -> Event | None:
        if fast is not None:
            try:
                return doc if fast(doc) else None
            except _Unsupported:
                pass
        return doc if _fallback_match(query, doc) else None

    return match
