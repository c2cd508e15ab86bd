"""``@pipeline`` options: the stages after ``$changeStream``, and what they do to an event's fields."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import field_validator

from flowwarden.config.base import Options, option
from flowwarden.config.problems import OptionProblem

# Stages MongoDB accepts after $changeStream; anything else fails when the stream opens.
ALLOWED_PIPELINE_STAGES: tuple[str, ...] = (
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
    "$changeStreamSplitLargeEvent",
)

KEEP_ID_HINT = 'keep the resume token: leave _id alone, or keep it as `"_id": "$_id"` in a new root'

FieldFate = Literal["keeps", "removes", "rewrites", "unknown"]

_ROOT_VARIABLES = ("$$ROOT", "$$CURRENT")


def _is_path(key: str, field: str) -> bool:
    return key == field or key.startswith(field + ".")


def _field_reference(value: Any, field: str) -> bool:
    return isinstance(value, str) and value in (
        f"${field}",
        f"$$ROOT.{field}",
        f"$$CURRENT.{field}",
    )


def _literal_fate(document: Mapping[str, Any], field: str) -> FieldFate:
    if field not in document:
        return "removes"
    return "keeps" if _field_reference(document[field], field) else "rewrites"


def new_root_fate(expression: Any, field: str) -> FieldFate:
    """What a ``$replaceRoot``/``$replaceWith`` expression does to a top-level ``field``.

    Proves "keeps" only for shapes it can read: ``$$ROOT``, a document literal holding
    ``field: "$field"``, or ``$mergeObjects`` whose last argument defining ``field`` does so and
    whose later arguments are literals without it. Anything else is "unknown".
    """
    if isinstance(expression, str):
        return "keeps" if expression in _ROOT_VARIABLES else "unknown"
    if not isinstance(expression, Mapping):
        return "unknown"
    operators = [key for key in expression if isinstance(key, str) and key.startswith("$")]
    if not operators:
        return _literal_fate(expression, field)
    if list(expression) != ["$mergeObjects"]:
        return "unknown"
    arguments = expression["$mergeObjects"]
    if not isinstance(arguments, list):
        arguments = [arguments]
    # $mergeObjects keeps the value from the last argument that defines the field.
    fate: FieldFate = "removes"
    for argument in arguments:
        if isinstance(argument, str) and argument in _ROOT_VARIABLES:
            fate = "keeps"
        elif isinstance(argument, Mapping) and not any(
            isinstance(key, str) and key.startswith("$") for key in argument
        ):
            argument_fate = _literal_fate(argument, field)
            if argument_fate != "removes":
                fate = argument_fate
        elif argument is None:
            continue
        else:
            fate = "unknown"
    return fate


def _is_exclusion(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not value


def _is_inclusion(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and bool(value)


def _stage_field_fate(name: str, spec: Any, field: str) -> FieldFate:
    """What one validated stage does to a top-level field of the change event."""
    if name == "$project":
        if field in spec:
            value = spec[field]
            if _is_exclusion(value):
                return "removes"
            return "keeps" if _is_inclusion(value) else "rewrites"
        if any(key.startswith(field + ".") for key in spec):
            return "rewrites"
        inclusion = any(not _is_exclusion(value) for key, value in spec.items() if key != "_id")
        # An inclusion projection keeps _id unless it says otherwise, and drops everything else.
        return "removes" if inclusion and field != "_id" else "keeps"
    if name == "$unset":
        paths = [spec] if isinstance(spec, str) else spec
        if field in paths:
            return "removes"
        return "rewrites" if any(_is_path(path, field) for path in paths) else "keeps"
    if name in ("$addFields", "$set"):
        return "rewrites" if any(_is_path(key, field) for key in spec) else "keeps"
    if name == "$replaceRoot":
        return new_root_fate(spec["newRoot"], field)
    if name == "$replaceWith":
        return new_root_fate(spec, field)
    if name == "$redact":
        return "unknown"
    return "keeps"


class PipelineOptions(Options):
    """Stages of ``@pipeline``, run by the server after ``$changeStream``.

    Hard rule: the event ``_id`` is the resume token, so no stage may remove or rewrite it; a
    pipeline that could is refused here rather than failing at the first event. ``$redact`` is
    accepted as MongoDB allows it, but it can prune ``_id``; the server then fails the stream.
    The stages are deep-copied: changing the list after decoration changes nothing.
    """

    decorator: ClassVar[str] = "pipeline"
    stages: tuple[dict[str, Any], ...] = option(
        (),
        "Stages the server runs after $changeStream, e.g. [{'$match': {...}}].",
        allowed="a list of one-key stage documents, each one of " + ", ".join(ALLOWED_PIPELINE_STAGES),
    )

    @field_validator("stages", mode="before")
    @classmethod
    def _stages(cls, value: Any) -> Any:
        allowed = cls.allowed["stages"]
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            raise OptionProblem(
                "stages must be a list of stage documents, e.g. [{'$match': {...}}]",
                option="stages",
                value=value,
                allowed=allowed,
            )
        stages = tuple(copy.deepcopy(dict(stage)) if isinstance(stage, Mapping) else stage for stage in value)
        for index, stage in enumerate(stages):
            cls._check_stage(index, stage, last=index == len(stages) - 1)
        return stages

    @classmethod
    def _check_stage(cls, index: int, stage: Any, *, last: bool) -> None:
        allowed = ", ".join(ALLOWED_PIPELINE_STAGES)

        def problem(message: str, hint: str = allowed) -> OptionProblem:
            return OptionProblem(f"stage {index} {message}", option="stages", value=stage, allowed=hint)

        if not isinstance(stage, dict) or len(stage) != 1:
            raise problem("must be a document with exactly one key naming the stage, e.g. {'$match': {...}}")
        ((name, spec),) = stage.items()
        if not isinstance(name, str) or not name.startswith("$"):
            raise problem(f"key {name!r} is not a stage name (stage names start with '$')")
        if name == "$changeStream":
            raise problem("is $changeStream, which flowwarden adds itself; list only the stages after it")
        if name not in ALLOWED_PIPELINE_STAGES:
            raise problem(f"{name} is not allowed in a change stream pipeline")
        if name == "$match" and not isinstance(spec, Mapping):
            raise problem("$match takes a query document")
        if name == "$project" and (
            not isinstance(spec, Mapping) or not spec or not all(isinstance(k, str) for k in spec)
        ):
            raise problem("$project takes a non-empty document of field specifications")
        if name in ("$addFields", "$set") and (
            not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec)
        ):
            raise problem(f"{name} takes a document of new fields")
        if name == "$unset" and not (
            isinstance(spec, str)
            or (isinstance(spec, list) and spec and all(isinstance(path, str) for path in spec))
        ):
            raise problem("$unset takes a field path or a non-empty list of field paths")
        if name == "$replaceRoot" and (not isinstance(spec, Mapping) or list(spec) != ["newRoot"]):
            raise problem("$replaceRoot takes {'newRoot': <expression>}")
        if name == "$changeStreamSplitLargeEvent":
            if spec != {}:
                raise problem("$changeStreamSplitLargeEvent takes an empty document: {}")
            if not last:
                raise problem("$changeStreamSplitLargeEvent must be the last stage")
        fate = _stage_field_fate(name, spec, "_id")
        if fate == "keeps" or (fate == "unknown" and name == "$redact"):
            return
        verb = {"removes": "removes", "rewrites": "rewrites", "unknown": "may remove or rewrite"}[fate]
        raise problem(f"({name}) {verb} _id, the resume token flowwarden checkpoints", KEEP_ID_HINT)

    def field_fate(self, field: str) -> FieldFate:
        """What the whole pipeline provably does to a top-level field of the change event.

        Stages compose in order: a stage that keeps the field leaves the previous verdict, any
        other verdict replaces it.
        """
        fate: FieldFate = "keeps"
        for stage in self.stages:
            ((name, spec),) = stage.items()
            stage_fate = _stage_field_fate(name, spec, field)
            if stage_fate != "keeps":
                fate = stage_fate
        return fate
