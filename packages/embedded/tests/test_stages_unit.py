"""User stages after $changeStream: the compiled $match agrees with the query engine it shortcuts."""

from __future__ import annotations

from typing import Any

import pytest
from bson import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from flowwarden_embedded import engine
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.eventmatch import compile_match
from flowwarden_embedded.stages import compile_pipeline, run_pipeline

EVENT = {
    "_id": {"_data": "82"},
    "operationType": "update",
    "ns": {"db": "shop", "coll": "orders"},
    "documentKey": {"_id": 7},
    "fullDocument": {"_id": 7, "qty": 3, "status": "paid", "tags": ["a", "b"], "note": None},
}

# Booleans are left out: the reference engine compares them with Python's ``==`` (True == 1),
# MongoDB does not; that rule has its own test below.
_scalars = st.one_of(
    st.integers(-3, 3),
    st.floats(-3, 3, allow_nan=False),
    st.sampled_from(["paid", "open", "a", ""]),
    st.none(),
    st.just(ObjectId("6692b4a31ede014d28852865")),
)
_paths = st.sampled_from(
    [
        "operationType",
        "ns.coll",
        "documentKey._id",
        "fullDocument.qty",
        "fullDocument.status",
        "fullDocument.note",
        "fullDocument.missing",
        "fullDocument.tags",
        "nope.deeper",
    ]
)


def _condition() -> st.SearchStrategy[Any]:
    return st.one_of(
        _scalars,
        st.builds(lambda v: {"$eq": v}, _scalars),
        st.builds(lambda v: {"$ne": v}, _scalars),
        st.builds(lambda v: {"$in": v}, st.lists(_scalars, max_size=3)),
        st.builds(lambda v: {"$nin": v}, st.lists(_scalars, max_size=3)),
        st.builds(lambda v: {"$exists": v}, st.booleans()),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), _scalars),
    )


_queries = st.recursive(
    st.dictionaries(_paths, _condition(), min_size=1, max_size=2),
    lambda inner: st.builds(
        lambda op, subs: {op: subs},
        st.sampled_from(["$and", "$or", "$nor"]),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


def _doc(qty: Any, status: Any) -> dict[str, Any]:
    full = {**EVENT["fullDocument"], "qty": qty, "status": status}
    return {**EVENT, "fullDocument": full}


@settings(max_examples=400, deadline=None)
@given(_queries, _scalars, _scalars)
def test_compiled_match_agrees_with_the_query_engine(query: dict[str, Any], qty: Any, status: Any) -> None:
    doc = _doc(qty, status)
    expected = engine.matches(query, doc)
    assert (compile_match(query)(doc) is not None) == expected


def test_booleans_never_equal_numbers() -> None:
    doc = _doc(1, True)
    assert compile_match({"fullDocument.qty": True})(doc) is None
    assert compile_match({"fullDocument.status": 1})(doc) is None
    assert compile_match({"fullDocument.status": True})(doc) is doc
    assert compile_match({"fullDocument.qty": 1.0})(doc) is doc


def test_match_falls_back_for_operators_it_does_not_compile() -> None:
    assert compile_match({"fullDocument.status": {"$regex": "^pa"}})(EVENT) is EVENT
    assert compile_match({"fullDocument.tags": "b"})(EVENT) is EVENT
    assert compile_match({"fullDocument.tags": {"$size": 3}})(EVENT) is None
    assert compile_match({"ns": {"db": "shop", "coll": "orders"}})(EVENT) is EVENT


def test_stages_never_mutate_their_input() -> None:
    import copy

    original = copy.deepcopy(EVENT)
    stages = compile_pipeline(
        [
            {"$addFields": {"fullDocument.qty": 99, "x.y": 1}},
            {"$set": {"ns.coll": "other"}},
            {"$unset": ["fullDocument.tags"]},
            {"$project": {"fullDocument": 1, "x": 1}},
        ]
    )
    out = run_pipeline(stages, EVENT)
    assert EVENT == original
    assert out == {
        "_id": {"_data": "82"},
        "fullDocument": {"_id": 7, "qty": 99, "status": "paid", "note": None},
        "x": {"y": 1},
    }


def test_project_exclusion_and_nested_specs() -> None:
    (exclude,) = compile_pipeline([{"$project": {"fullDocument": {"tags": 0, "note": 0}, "ns": 0}}])
    out = exclude(EVENT)
    assert (
        out is not None and "ns" not in out and out["fullDocument"] == {"_id": 7, "qty": 3, "status": "paid"}
    )
    (include,) = compile_pipeline([{"$project": {"fullDocument.qty": True, "_id": False}}])
    assert include(EVENT) == {"fullDocument": {"qty": 3}}
    (only_id,) = compile_pipeline([{"$project": {"_id": 1}}])
    assert only_id(EVENT) == {"_id": {"_data": "82"}}


def test_add_fields_remove_with_variable() -> None:
    (stage,) = compile_pipeline([{"$set": {"fullDocument.note": "$$REMOVE", "k": "$$ROOT.ns.db"}}])
    out = stage(EVENT)
    assert out is not None and "note" not in out["fullDocument"] and out["k"] == "shop"


def test_replace_root_must_give_a_document() -> None:
    (stage,) = compile_pipeline([{"$replaceWith": "$fullDocument.qty"}])
    with pytest.raises(CommandError) as info:
        stage(EVENT)
    assert info.value.code == 40228


def test_redact_keep_and_bad_verdicts() -> None:
    (keep,) = compile_pipeline([{"$redact": "$$KEEP"}])
    assert keep(EVENT) is EVENT
    (bad,) = compile_pipeline([{"$redact": {"$literal": "yes"}}])
    with pytest.raises(CommandError) as info:
        bad(EVENT)
    assert info.value.code == 17053


def test_unset_needs_field_names() -> None:
    with pytest.raises(CommandError) as info:
        compile_pipeline([{"$unset": []}])
    assert info.value.code == 31002


def test_type_names_every_value_and_missing_fields() -> None:
    (stage,) = compile_pipeline(
        [
            {
                "$set": {
                    "types": {
                        "number": {"$type": "$fullDocument.qty"},
                        "text": {"$type": "$fullDocument.status"},
                        "list": {"$type": "$fullDocument.tags"},
                        "null": {"$type": "$fullDocument.note"},
                        "document": {"$type": ["$ns"]},
                        "flag": {"$type": True},
                        "missing": {"$type": "$fullDocument.nope"},
                    }
                }
            }
        ]
    )
    out = stage(EVENT)
    assert out is not None and out["types"] == {
        "number": "int",
        "text": "string",
        "list": "array",
        "null": "null",
        "document": "object",
        "flag": "bool",
        "missing": "missing",
    }


def test_merge_objects_merges_left_to_right_skipping_null_and_missing() -> None:
    merge = {"$mergeObjects": ["$ns", None, "$nope", {"coll": "other", "extra": 1}]}
    (stage,) = compile_pipeline([{"$set": {"merged": merge}}])
    out = stage(EVENT)
    assert out is not None and out["merged"] == {"db": "shop", "coll": "other", "extra": 1}
    (bad,) = compile_pipeline([{"$set": {"merged": {"$mergeObjects": ["$ns", "$fullDocument.qty"]}}}])
    with pytest.raises(CommandError) as info:
        bad(EVENT)
    assert info.value.code == 40400


def test_not_of_a_one_element_list_negates_the_element() -> None:
    (stage,) = compile_pipeline(
        [
            {
                "$set": {
                    "notPaid": {"$not": [{"$eq": ["$fullDocument.status", "paid"]}]},
                    "notZero": {"$not": [0]},
                    "notMissing": {"$not": ["$fullDocument.nope"]},
                    "notText": {"$not": [""]},
                }
            }
        ]
    )
    out = stage(EVENT)
    assert out is not None
    assert (out["notPaid"], out["notZero"], out["notMissing"], out["notText"]) == (False, True, True, False)


def test_regex_match_of_null_or_missing_input_is_false() -> None:
    (stage,) = compile_pipeline(
        [
            {
                "$set": {
                    "null": {"$regexMatch": {"input": "$fullDocument.note", "regex": ".*"}},
                    "missing": {"$regexMatch": {"input": "$fullDocument.nope", "regex": ".*"}},
                    "text": {"$regexMatch": {"input": "$fullDocument.status", "regex": "^pa"}},
                }
            }
        ]
    )
    out = stage(EVENT)
    assert out is not None and (out["null"], out["missing"], out["text"]) == (False, False, True)
