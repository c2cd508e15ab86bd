"""updateDescription from the documents before and after a write, as MongoDB 7/8 compute it."""

from __future__ import annotations

import copy
from typing import Any

from bson import Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from flowwarden_embedded.updates import (
    bson_equal,
    compute_diff,
    describe_update,
    oplog_diff,
)


def test_set_new_and_changed_fields() -> None:
    before = {"_id": 1, "a": 1, "b": "x"}
    after = {"_id": 1, "a": 2, "b": "x", "c": True}
    assert describe_update(before, after) == {
        "updatedFields": {"a": 2, "c": True},
        "removedFields": [],
        "truncatedArrays": [],
    }


def test_unset_is_a_removed_field() -> None:
    assert describe_update({"_id": 1, "a": 1, "b": 2}, {"_id": 1, "b": 2})["removedFields"] == ["a"]


def test_nested_changes_use_dotted_paths() -> None:
    before = {"_id": 1, "a": {"b": 1, "c": {"d": 1}}}
    after = {"_id": 1, "a": {"b": 1, "c": {"d": 2, "e": 3}}}
    assert describe_update(before, after)["updatedFields"] == {"a.c.d": 2, "a.c.e": 3}
    removed = describe_update(after, before)
    assert removed["removedFields"] == ["a.c.e"] and removed["updatedFields"] == {"a.c.d": 1}


def test_array_push_updates_the_new_index() -> None:
    desc = describe_update({"_id": 1, "tags": ["a", "b"]}, {"_id": 1, "tags": ["a", "b", "c"]})
    assert desc == {"updatedFields": {"tags.2": "c"}, "removedFields": [], "truncatedArrays": []}


def test_shrinking_array_is_truncated() -> None:
    desc = describe_update({"_id": 1, "arr": [1, 2, 3, 4]}, {"_id": 1, "arr": [1, 9]})
    assert desc["truncatedArrays"] == [{"field": "arr", "newSize": 2}]
    assert desc["updatedFields"] == {"arr.1": 9}


def test_documents_inside_arrays_diff_by_index() -> None:
    before = {"_id": 1, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}]}
    after = {"_id": 1, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 5}]}
    assert describe_update(before, after)["updatedFields"] == {"items.1.qty": 5}


def test_type_changes_replace_the_whole_value() -> None:
    assert describe_update({"a": 1}, {"a": 1.0})["updatedFields"] == {"a": 1.0}
    assert describe_update({"a": 1}, {"a": True})["updatedFields"] == {"a": True}
    assert describe_update({"a": 1}, {"a": Int64(1)})["updatedFields"] == {"a": Int64(1)}
    assert describe_update({"a": {"x": 1}}, {"a": [1]})["updatedFields"] == {"a": [1]}
    # Python ints encode as int64 past 2**31, so the same value is not a change there.
    assert describe_update({"a": 2**40}, {"a": Int64(2**40)})["updatedFields"] == {}


def test_field_moved_to_the_end_is_reported_as_set() -> None:
    desc = describe_update({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert desc == {"updatedFields": {"a": 1}, "removedFields": [], "truncatedArrays": []}


def test_order_updates_then_inserts_then_nested_then_removals_by_level() -> None:
    before = {"z": 1, "n": {"k": 1}, "gone": 1, "m": 1}
    after = {"z": 2, "n": {"k": 2}, "m": 1, "new": 1}
    desc = describe_update(before, after)
    assert list(desc["updatedFields"]) == ["z", "new", "n.k"]
    assert desc["removedFields"] == ["gone"]


def test_disambiguated_paths_only_with_expanded_events() -> None:
    before = {"_id": 1, "a": {"0": 1}, "arr": [{"x.y": 1}], "plain": [1, 2]}
    after = {"_id": 1, "a": {"0": 2}, "arr": [{"x.y": 2}], "plain": [1, 3]}
    classic = describe_update(before, after)
    assert "disambiguatedPaths" not in classic
    expanded = describe_update(before, after, expanded=True)
    assert expanded["updatedFields"] == {"a.0": 2, "arr.0.x.y": 2, "plain.1": 3}
    # A numeric field name, or a dotted one, makes the dotted path ambiguous; an array index alone
    # does not (MongoDB's rule), so "plain.1" has no entry.
    assert expanded["disambiguatedPaths"] == {"a.0": ["a", "0"], "arr.0.x.y": ["arr", 0, "x.y"]}


def test_leading_numeric_field_is_not_ambiguous() -> None:
    desc = describe_update({"0": 1}, {"0": 2}, expanded=True)
    assert desc["updatedFields"] == {"0": 2} and desc["disambiguatedPaths"] == {}


def test_oplog_diff_format() -> None:
    before = {"_id": 1, "a": 1, "gone": 1, "n": {"k": 1}, "arr": [1, 2, 3]}
    after = {"_id": 1, "a": 2, "n": {"k": 2}, "arr": [1, 5], "new": 1}
    assert oplog_diff(compute_diff(before, after)) == {
        "d": {"gone": False},
        "u": {"a": 2},
        "i": {"new": 1},
        "sn": {"u": {"k": 2}},
        "sarr": {"a": True, "l": 2, "u1": 5},
    }


def test_bson_equality_is_strict() -> None:
    assert bson_equal({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2.0}]})
    assert not bson_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not bson_equal(1, 1.0) and not bson_equal(True, 1) and not bson_equal(0.0, -0.0)
    assert bson_equal(float("nan"), float("nan"))
    assert bson_equal([1, 2], (1, 2))


# -- property: applying the description to the old document gives the new one -----------------

_names = st.sampled_from(["a", "b", "c", "d"])
_scalars = st.one_of(st.integers(-5, 5), st.text(max_size=2), st.booleans(), st.none())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_names, inner, max_size=4),
    ),
    max_leaves=12,
)
_docs = st.dictionaries(_names, _values, max_size=4)


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _apply(before: dict[str, Any], desc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(before)
    for trunc in desc["truncatedArrays"]:
        parts = trunc["field"].split(".")
        del _walk(doc, parts)[trunc["newSize"] :]
    for path, value in desc["updatedFields"].items():
        *parent, last = path.split(".")
        container = _walk(doc, parent)
        if isinstance(container, list):
            index = int(last)
            if index == len(container):
                container.append(value)
            else:
                container[index] = value
        else:
            container[last] = value
    for path in desc["removedFields"]:
        *parent, last = path.split(".")
        del _walk(doc, parent)[last]
    return doc


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return sorted((k, _normalized(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return (type(value).__name__, value)


@settings(max_examples=300)
@given(_docs, _docs)
def test_description_reconstructs_the_new_document(before: dict[str, Any], after: dict[str, Any]) -> None:
    desc = describe_update(before, after)
    assert _normalized(_apply(before, desc)) == _normalized(after)
    if bson_equal(before, after):
        assert desc == {"updatedFields": {}, "removedFields": [], "truncatedArrays": []}
