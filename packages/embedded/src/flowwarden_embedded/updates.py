"""``updateDescription`` of update events, computed from the documents before and after a write.

MongoDB 7/8 log an update as a delta (``$v: 2``) and change streams turn that delta into
``updatedFields`` / ``removedFields`` / ``truncatedArrays`` (and ``disambiguatedPaths`` with
``showExpandedEvents``). The embedded server has only the whole documents before and after the
write, so the delta is computed the way MongoDB computes it when it diffs two documents itself
(pipeline-style updates): field by field in document order, recursing into sub-documents and
arrays of the same type, arrays diffed by index with a truncation when they shrink.

Hard rule: values are compared as BSON compares bytes (``1``, ``1.0`` and ``True`` differ; so does
the field order of a sub-document), never with Python's ``==``.

Fidelity note: an operator update such as ``{$set: {a: {b: 1, c: 2}}}`` is reported by MongoDB as
replacing the whole field ``a``; from the two documents alone it reads as ``a.b`` changing. Both
describe the same post-image.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import Int64

_PACK_D = struct.Struct("<d")
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def _bson_kind(value: Any) -> object:
    """What BSON type a Python value encodes as (ints pick int32 or int64 by magnitude)."""
    kind = type(value)
    if kind is int:
        return "int" if _INT32_MIN <= value <= _INT32_MAX else Int64
    if kind is Int64:
        return Int64
    return kind


def bson_equal(a: Any, b: Any) -> bool:
    """Whether two values encode to the same BSON bytes (same types, same order, same values)."""
    if a is b:
        return True
    if _bson_kind(a) is not _bson_kind(b):
        # dict subclasses (SON, OrderedDict) encode like dicts; lists like tuples.
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return _mapping_equal(a, b)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return _sequence_equal(a, b)
        return False
    if isinstance(a, Mapping):
        return _mapping_equal(a, b)
    if isinstance(a, (list, tuple)):
        return _sequence_equal(a, b)
    if isinstance(a, float):
        return _PACK_D.pack(a) == _PACK_D.pack(b)
    return bool(a == b)


def _mapping_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if len(a) != len(b):
        return False
    for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
        if ka != kb or not bson_equal(va, vb):
            return False
    return True


def _sequence_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(bson_equal(x, y) for x, y in zip(a, b, strict=True))


def _is_object(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple))


@dataclass(slots=True)
class DocDiff:
    """The delta of one (sub-)document, in the sections MongoDB's delta format has."""

    updates: list[tuple[str, Any]] = field(default_factory=list)
    inserts: list[tuple[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    children: list[tuple[str, Diff]] = field(default_factory=list)


@dataclass(slots=True)
class ArrayDiff:
    """The delta of an array: per-index updates or sub-deltas, and a new size when it shrank."""

    entries: list[tuple[int, Any, bool]] = field(default_factory=list)  # (index, value|Diff, is_sub)
    new_size: int | None = None


Diff = DocDiff | ArrayDiff


def compute_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> DocDiff:
    """The delta that turns ``before`` into ``after``."""
    diff = DocDiff()
    pre = list(before.items())
    post = list(after.items())
    i = j = 0
    pending_deletes: set[str] = set()
    while i < len(pre) and j < len(post):
        pre_name, pre_value = pre[i]
        post_name, post_value = post[j]
        if pre_name == post_name:
            if not bson_equal(pre_value, post_value):
                _diff_values(diff, pre_name, pre_value, post_value)
            i += 1
            j += 1
        else:
            # Maybe it reappears later in 'after' (then it is an insert there); else it is deleted.
            pending_deletes.add(pre_name)
            i += 1
    while i < len(pre):
        diff.deletes.append(pre[i][0])
        i += 1
    while j < len(post):
        name, value = post[j]
        diff.inserts.append((name, value))
        pending_deletes.discard(name)
        j += 1
    diff.deletes.extend(sorted(pending_deletes))
    return diff


def _diff_values(parent: DocDiff, name: str, pre_value: Any, post_value: Any) -> None:
    if _is_object(pre_value) and _is_object(post_value):
        parent.children.append((name, compute_diff(pre_value, post_value)))
    elif _is_array(pre_value) and _is_array(post_value):
        parent.children.append((name, _array_diff(pre_value, post_value)))
    else:
        parent.updates.append((name, post_value))


def _array_diff(before: Sequence[Any], after: Sequence[Any]) -> ArrayDiff:
    diff = ArrayDiff()
    common = min(len(before), len(after))
    for index in range(common):
        pre_value, post_value = before[index], after[index]
        if bson_equal(pre_value, post_value):
            continue
        if _is_object(pre_value) and _is_object(post_value):
            diff.entries.append((index, compute_diff(pre_value, post_value), True))
        elif _is_array(pre_value) and _is_array(post_value):
            diff.entries.append((index, _array_diff(pre_value, post_value), True))
        else:
            diff.entries.append((index, post_value, False))
    for index in range(common, len(after)):
        diff.entries.append((index, after[index], False))
    if len(before) > len(after):
        diff.new_size = len(after)
    return diff


def _is_numeric_component(name: str) -> bool:
    """MongoDB's strict numeric path component: ASCII digits, no leading zero (except "0")."""
    return name.isascii() and name.isdigit() and (name == "0" or name[0] != "0")


class _DescriptionBuilder:
    """Walks a delta the way MongoDB's change-stream diff parser does, tracking path ambiguity."""

    __slots__ = ("ambiguous", "disambiguated", "parts", "removed", "truncated", "updated")

    def __init__(self) -> None:
        self.parts: list[str | int] = []
        self.ambiguous: list[bool] = []
        self.updated: dict[str, Any] = {}
        self.removed: list[str] = []
        self.truncated: list[dict[str, Any]] = []
        self.disambiguated: dict[str, list[str | int]] = {}

    def push(self, part: str | int) -> None:
        if self.ambiguous and self.ambiguous[-1]:
            is_ambiguous = True
        elif isinstance(part, int):
            is_ambiguous = False
        else:
            # A numeric field name after the first component reads like an array index, and an
            # embedded dot reads like a path separator: both make the dotted path ambiguous.
            numeric = len(self.parts) >= 1 and _is_numeric_component(part)
            is_ambiguous = numeric or "." in part
        self.parts.append(part)
        self.ambiguous.append(is_ambiguous)

    def pop(self) -> None:
        self.parts.pop()
        self.ambiguous.pop()

    def dotted(self) -> str:
        return ".".join(str(p) for p in self.parts)

    def _note(self) -> None:
        if self.ambiguous and self.ambiguous[-1]:
            self.disambiguated[self.dotted()] = list(self.parts)

    def add_updated(self, part: str | int, value: Any) -> None:
        self.push(part)
        self.updated[self.dotted()] = value
        self._note()
        self.pop()

    def add_removed(self, name: str) -> None:
        self.push(name)
        self.removed.append(self.dotted())
        self._note()
        self.pop()

    def add_truncated(self, new_size: int) -> None:
        self.truncated.append({"field": self.dotted(), "newSize": new_size})
        self._note()

    def walk(self, diff: Diff) -> None:
        if isinstance(diff, DocDiff):
            for name, value in diff.updates:
                self.add_updated(name, value)
            for name, value in diff.inserts:
                self.add_updated(name, value)
            for name in diff.deletes:
                self.add_removed(name)
            for name, child in diff.children:
                self.push(name)
                self.walk(child)
                self.pop()
            return
        if diff.new_size is not None:
            self.add_truncated(diff.new_size)
        for index, value, is_sub in diff.entries:
            if is_sub:
                self.push(index)
                self.walk(value)
                self.pop()
            else:
                self.add_updated(index, value)


def update_description(diff: DocDiff, *, expanded: bool = False) -> dict[str, Any]:
    """The event's ``updateDescription``; ``disambiguatedPaths`` only with ``showExpandedEvents``."""
    builder = _DescriptionBuilder()
    builder.walk(diff)
    description: dict[str, Any] = {
        "updatedFields": builder.updated,
        "removedFields": builder.removed,
        "truncatedArrays": builder.truncated,
    }
    if expanded:
        description["disambiguatedPaths"] = builder.disambiguated
    return description


def describe_update(
    before: Mapping[str, Any], after: Mapping[str, Any], *, expanded: bool = False
) -> dict[str, Any]:
    """Shortcut: ``update_description(compute_diff(before, after))``."""
    return update_description(compute_diff(before, after), expanded=expanded)


def oplog_diff(diff: Diff) -> dict[str, Any]:
    """The delta in the oplog's ``$v: 2`` wire format (``o.diff`` of an update entry)."""
    if isinstance(diff, ArrayDiff):
        out: dict[str, Any] = {"a": True}
        if diff.new_size is not None:
            out["l"] = diff.new_size
        for index, value, is_sub in diff.entries:
            if is_sub:
                out[f"s{index}"] = oplog_diff(value)
            else:
                out[f"u{index}"] = value
        return out
    doc: dict[str, Any] = {}
    if diff.deletes:
        doc["d"] = {name: False for name in diff.deletes}
    if diff.updates:
        doc["u"] = dict(diff.updates)
    if diff.inserts:
        doc["i"] = dict(diff.inserts)
    for name, child in diff.children:
        doc[f"s{name}"] = oplog_diff(child)
    return doc


__all__ = [
    "ArrayDiff",
    "DocDiff",
    "bson_equal",
    "compute_diff",
    "describe_update",
    "oplog_diff",
    "update_description",
]
