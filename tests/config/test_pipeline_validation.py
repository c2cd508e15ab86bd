"""@pipeline: only change-stream stages, and never one that removes or rewrites the resume token."""

from __future__ import annotations

from typing import Any

import pytest

from flowwarden.config import ALLOWED_PIPELINE_STAGES, KEEP_ID_HINT, PipelineOptions, new_root_fate
from flowwarden.decorators import change_stream, on_change, on_insert, pipeline, stream_spec
from flowwarden.errors import ConfigurationError


def decorate(stages: Any) -> type:
    @change_stream(collection="orders", database="shop")
    @pipeline(stages)
    class Orders:
        @on_change
        def handle(self, event: object) -> None: ...

    return Orders


def rejection(stages: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        decorate(stages)
    error = info.value
    assert "Orders" in str(error)
    assert error.option == "stages"
    assert f"(allowed: {error.allowed})" in str(error)
    return error


ACCEPTED: list[list[dict[str, Any]]] = [
    [],
    [{"$match": {"operationType": {"$in": ["insert", "update"]}}}],
    [{"$match": {"fullDocument.status": "paid", "_id": {"$exists": True}}}],
    [{"$project": {"fullDocument": 0, "fullDocumentBeforeChange": 0}}],
    [{"$project": {"operationType": 1, "documentKey": 1}}],
    [{"$project": {"_id": 1, "operationType": 1, "fullDocument.sku": 1}}],
    [{"$project": {"_id": True, "ns": True}}],
    [{"$project": {"_id": 1.0, "total": {"$add": ["$fullDocument.a", 1]}}}],
    [{"$addFields": {"fullDocument.seen": True}}],
    [{"$set": {"tenant": "$fullDocument.tenant", "id_copy": "$_id"}}],
    [{"$unset": "fullDocument.secret"}],
    [{"$unset": ["fullDocument.secret", "updateDescription"]}],
    [{"$unset": "_idx"}],
    [{"$replaceRoot": {"newRoot": "$$ROOT"}}],
    [{"$replaceWith": {"_id": "$_id", "operationType": "$operationType", "doc": "$fullDocument"}}],
    [{"$replaceRoot": {"newRoot": {"$mergeObjects": ["$fullDocument", {"_id": "$_id"}]}}}],
    [{"$replaceWith": {"$mergeObjects": [{"_id": "$_id"}, {"operationType": "$operationType", "x": 1}]}}],
    [{"$replaceWith": {"$mergeObjects": ["$$ROOT", {"extra": 1}]}}],
    [{"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$$ROOT._id"}, None]}}],
    [{"$replaceWith": {"_id": "$$CURRENT._id", "operationType": "$operationType"}}],
    [{"$redact": {"$cond": [{"$eq": ["$fullDocument.hidden", True]}, "$$PRUNE", "$$KEEP"]}}],
    [{"$changeStreamSplitLargeEvent": {}}],
    [{"$match": {"operationType": "insert"}}, {"$changeStreamSplitLargeEvent": {}}],
    [
        {"$match": {"operationType": "update"}},
        {"$project": {"updateDescription": 0}},
        {"$set": {"fullDocument.flag": 1}},
        {"$unset": "fullDocument.big"},
    ],
]


@pytest.mark.parametrize("stages", ACCEPTED, ids=[str(i) for i in range(len(ACCEPTED))])
def test_accepted_pipelines(stages: list[dict[str, Any]]) -> None:
    spec = stream_spec(decorate(stages))
    assert list(spec.pipeline) == stages


def test_tuple_of_stages_is_accepted() -> None:
    stages = ({"$match": {"operationType": "insert"}},)
    assert stream_spec(decorate(stages)).pipeline == stages


@pytest.mark.parametrize(
    "stage",
    [
        "$out",
        "$merge",
        "$lookup",
        "$facet",
        "$group",
        "$sort",
        "$limit",
        "$skip",
        "$unwind",
        "$count",
        "$graphLookup",
        "$bucket",
        "$sample",
        "$densify",
        "$unionWith",
        "$setWindowFields",
    ],
)
def test_stages_not_allowed_in_a_change_stream_are_named(stage: str) -> None:
    error = rejection([{"$match": {}}, {stage: {}}])
    message = str(error)
    assert f"stage 1 {stage} is not allowed in a change stream" in message
    for allowed in ALLOWED_PIPELINE_STAGES:
        assert allowed in message


def test_change_stream_stage_itself_is_refused() -> None:
    assert "flowwarden adds itself" in str(rejection([{"$changeStream": {}}]))


@pytest.mark.parametrize(
    ("stages", "fragment"),
    [
        ({"$match": {}}, "must be a list"),
        ("$match", "must be a list"),
        (None, "must be a list"),
        ([{"$match": {}, "$project": {"a": 1}}], "exactly one key"),
        ([{}], "exactly one key"),
        (["$match"], "exactly one key"),
        ([{"match": {}}], "is not a stage name"),
        ([{"$match": "insert"}], "$match takes a query document"),
        ([{"$project": {}}], "non-empty document"),
        ([{"$project": "fullDocument"}], "non-empty document"),
        ([{"$set": ["a"]}], "document of new fields"),
        ([{"$addFields": "x"}], "document of new fields"),
        ([{"$unset": []}], "field path"),
        ([{"$unset": 5}], "field path"),
        ([{"$unset": ["a", 1]}], "field path"),
        ([{"$replaceRoot": "$$ROOT"}], "{'newRoot': <expression>}"),
        ([{"$replaceRoot": {"root": "$$ROOT"}}], "{'newRoot': <expression>}"),
        ([{"$changeStreamSplitLargeEvent": {"size": 1}}], "empty document"),
        ([{"$changeStreamSplitLargeEvent": {}}, {"$match": {}}], "must be the last stage"),
    ],
)
def test_malformed_stages(stages: Any, fragment: str) -> None:
    assert fragment in str(rejection(stages))


@pytest.mark.parametrize(
    ("stage", "verb"),
    [
        ({"$project": {"_id": 0}}, "removes"),
        ({"$project": {"_id": False, "fullDocument": 1}}, "removes"),
        ({"$project": {"_id": 0.0}}, "removes"),
        ({"$project": {"_id": "$fullDocument._id"}}, "rewrites"),
        ({"$project": {"_id": "$_id"}}, "rewrites"),
        ({"$project": {"_id": {"$literal": 1}}}, "rewrites"),
        ({"$project": {"_id": {"_data": 1}}}, "rewrites"),
        ({"$project": {"_id._data": 0}}, "rewrites"),
        ({"$project": {"_id._data": 1, "fullDocument": 1}}, "rewrites"),
        ({"$unset": "_id"}, "removes"),
        ({"$unset": ["fullDocument", "_id"]}, "removes"),
        ({"$unset": "_id._data"}, "rewrites"),
        ({"$addFields": {"_id": "$fullDocument._id"}}, "rewrites"),
        ({"$addFields": {"_id._data": "x"}}, "rewrites"),
        ({"$set": {"_id": 1}}, "rewrites"),
        ({"$set": {"_id.extra": 1}}, "rewrites"),
        ({"$replaceRoot": {"newRoot": "$fullDocument"}}, "may remove or rewrite"),
        ({"$replaceWith": "$fullDocument"}, "may remove or rewrite"),
        ({"$replaceWith": {"doc": "$fullDocument"}}, "removes"),
        ({"$replaceWith": {"_id": "$documentKey._id", "doc": "$fullDocument"}}, "rewrites"),
        ({"$replaceRoot": {"newRoot": {"$mergeObjects": [{"_id": "$_id"}, "$fullDocument"]}}}, "may remove"),
        ({"$replaceWith": {"$mergeObjects": [{"_id": "$_id"}, {"_id": 1}]}}, "rewrites"),
        ({"$replaceWith": {"$mergeObjects": ["$fullDocument", {"a": 1}]}}, "may remove"),
        ({"$replaceWith": {"$mergeObjects": [{"a": 1}]}}, "removes"),
        ({"$replaceWith": {"$mergeObjects": []}}, "removes"),
        ({"$replaceWith": {"$mergeObjects": ["$$ROOT", {"$literal": {"_id": 1}}]}}, "may remove"),
        ({"$replaceWith": {"$cond": [True, "$$ROOT", "$$ROOT"]}}, "may remove"),
        ({"$replaceWith": {"$mergeObjects": ["$$ROOT"], "_id": "$_id"}}, "may remove"),
        ({"$replaceWith": 5}, "may remove"),
    ],
)
def test_stages_that_touch_the_resume_token_are_refused(stage: dict[str, Any], verb: str) -> None:
    error = rejection([{"$match": {}}, stage])
    message = str(error)
    assert "stage 1" in message
    assert f"{verb}" in message
    assert "_id, the resume token" in message
    assert error.allowed == KEEP_ID_HINT
    assert '"_id": "$_id"' in message
    assert error.value == stage


def test_stages_are_copied_at_decoration_time() -> None:
    stages: list[dict[str, Any]] = [{"$match": {"operationType": "insert"}}]
    handler = decorate(stages)
    stages[0]["$match"]["operationType"] = "delete"
    stages.append({"$project": {"_id": 0}})
    assert stream_spec(handler).pipeline == ({"$match": {"operationType": "insert"}},)


def test_operation_types_match_comes_before_user_stages() -> None:
    @change_stream(collection="orders", database="shop", operation_types=["insert"])
    @pipeline([{"$project": {"fullDocumentBeforeChange": 0}}])
    class Orders:
        @on_insert
        def created(self, event: object) -> None: ...

    assert stream_spec(Orders).pipeline == (
        {"$match": {"operationType": {"$in": ["insert", "invalidate"]}}},
        {"$project": {"fullDocumentBeforeChange": 0}},
    )


@pytest.mark.parametrize(
    "stage",
    [
        {"$project": {"fullDocument": 1}},
        {"$project": {"operationType": 0}},
        {"$unset": "operationType"},
        {"$replaceWith": {"_id": "$_id", "doc": "$fullDocument"}},
    ],
)
def test_removing_operation_type_is_refused_when_methods_dispatch_on_it(stage: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="removes operationType") as info:

        @change_stream(collection="orders", database="shop")
        @pipeline([stage])
        class Orders:
            @on_insert
            def created(self, event: object) -> None: ...

    assert info.value.option == "stages"
    assert "'created'" in str(info.value)


def test_removing_operation_type_is_fine_for_on_change() -> None:
    handler = decorate([{"$project": {"fullDocument": 1}}])
    assert stream_spec(handler).fallback is not None


@pytest.mark.parametrize(
    ("stages", "fate"),
    [
        ([], "keeps"),
        ([{"$match": {"operationType": "insert"}}], "keeps"),
        ([{"$project": {"fullDocument": 0}}], "keeps"),
        ([{"$project": {"operationType": 1}}], "keeps"),
        ([{"$project": {"fullDocument": 1}}], "removes"),
        ([{"$project": {"operationType": 0}}], "removes"),
        ([{"$unset": "operationType"}], "removes"),
        ([{"$unset": "operationType.x"}], "rewrites"),
        ([{"$set": {"operationType": "x"}}], "rewrites"),
        ([{"$unset": "operationType"}, {"$set": {"operationType": "insert"}}], "rewrites"),
        ([{"$set": {"operationType": "x"}}, {"$unset": "operationType"}], "removes"),
        ([{"$replaceWith": "$$ROOT"}], "keeps"),
        ([{"$replaceWith": {"_id": "$_id", "operationType": "$operationType"}}], "keeps"),
        ([{"$replaceWith": {"_id": "$_id"}}], "removes"),
        ([{"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id"}]}}], "unknown"),
        ([{"$redact": "$$KEEP"}], "unknown"),
    ],
)
def test_field_fate(stages: list[dict[str, Any]], fate: str) -> None:
    assert PipelineOptions(stages=stages).field_fate("operationType") == fate


def test_new_root_fate_reads_merge_objects_last_writer_wins() -> None:
    assert new_root_fate({"$mergeObjects": [{"_id": 1}, {"_id": "$_id"}]}, "_id") == "keeps"
    assert new_root_fate({"$mergeObjects": [{"_id": "$_id"}, {"_id": 1}]}, "_id") == "rewrites"
    assert new_root_fate({"$mergeObjects": [{"_id": "$_id"}, {"other": 1}]}, "_id") == "keeps"
    assert new_root_fate({"$mergeObjects": {"_id": "$_id"}}, "_id") == "keeps"
    assert new_root_fate({"$mergeObjects": ["$$ROOT", "$fullDocument"]}, "_id") == "unknown"
    assert new_root_fate({"$mergeObjects": ["$fullDocument", "$$ROOT"]}, "_id") == "keeps"
