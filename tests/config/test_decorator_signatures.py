"""Each decorator's written signature is its option model's: the same options in the same order,
the same defaults and types, keyword-only but for the ones DESIGN.md gives by position, and a
docstring describing each as the model does. The two cannot drift apart unnoticed."""

from __future__ import annotations

import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from flowwarden import decorators
from flowwarden.checkpoints.store import AsyncCheckpointStore, CheckpointStore
from flowwarden.config import (
    BatchOptions,
    ChangeStreamOptions,
    CheckpointOptions,
    DataFrameOptions,
    DeadLetterOptions,
    OperationType,
    Options,
    PipelineOptions,
    RetryPolicy,
)


class StructType:
    """Stands in for pyspark's StructType, which the decorators name only for type checkers."""


# decorator, its model, the options it also takes by position (in this order)
DECORATORS: list[tuple[Callable[..., Any], type[Options], tuple[str, ...]]] = [
    (decorators.change_stream, ChangeStreamOptions, ("collection", "database")),
    (decorators.checkpoint, CheckpointOptions, ()),
    (decorators.pipeline, PipelineOptions, ("stages",)),
    (decorators.retry_policy, RetryPolicy, ()),
    (decorators.dead_letter_queue, DeadLetterOptions, ()),
    (decorators.on_batch, BatchOptions, ()),
    (decorators.on_dataframe, DataFrameOptions, ()),
]
IDS = [model.decorator for _, model, _ in DECORATORS]

# @pipeline is nothing without its stages: the one option a decorator requires.
REQUIRED = {("pipeline", "stages")}

# A field is typed for what the model stores; where its validator accepts more (any iterable, a
# single class) or checks what its type cannot say (Any), the decorator declares what a caller
# may pass. Both sides are pinned here, so a change to either fails until this table says so.
DECLARED: dict[tuple[str, str], tuple[Any, Any]] = {
    ("change_stream", "operation_types"): (tuple[str, ...] | None, Iterable[OperationType] | None),
    ("change_stream", "collections"): (tuple[str, ...] | None, Iterable[str] | None),
    ("change_stream", "exclude_collections"): (tuple[str, ...], Iterable[str]),
    ("change_stream", "exclude_fields"): (tuple[str, ...], Iterable[str]),
    ("change_stream", "hash_fields"): (tuple[str, ...], Iterable[str]),
    ("checkpoint", "store"): (Any, CheckpointStore | AsyncCheckpointStore | None),
    ("pipeline", "stages"): (
        tuple[dict[str, Any], ...],
        list[dict[str, Any]] | tuple[dict[str, Any], ...],
    ),
    ("retry_policy", "retry_on"): (
        tuple[type[Exception], ...],
        type[Exception] | Iterable[type[Exception]],
    ),
    ("retry_policy", "no_retry_on"): (
        tuple[type[Exception], ...],
        type[Exception] | Iterable[type[Exception]],
    ),
    ("on_dataframe", "schema"): (Any, type[BaseModel] | StructType | Literal["infer"] | None),
    ("on_dataframe", "schema_hints"): (Any, str | StructType | None),
}


def parameters(decorator: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(decorator).parameters)


def hints(decorator: Callable[..., Any]) -> dict[str, Any]:
    names = {
        "StructType": StructType,
        "CheckpointStore": CheckpointStore,
        "AsyncCheckpointStore": AsyncCheckpointStore,
    }
    return typing.get_type_hints(inspect.unwrap(decorator), localns=names)


def members(annotation: Any) -> frozenset[Any]:
    """An annotation as the set of what it accepts: unions flattened, one entry per literal."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return frozenset().union(*(members(member) for member in typing.get_args(annotation)))
    if typing.get_origin(annotation) is Literal:
        return frozenset(("literal", value) for value in typing.get_args(annotation))
    return frozenset({annotation})


def model_accepts(annotation: Any) -> frozenset[Any]:
    """What a model field's annotation accepts: a choice enum also by its values, as the models'
    validators take them."""
    accepted = set(members(annotation))
    for member in list(accepted):
        if isinstance(member, type) and issubclass(member, enum.Enum):
            accepted |= {("literal", choice.value) for choice in member}
    return frozenset(accepted)


@pytest.mark.parametrize(("decorator", "model", "positional"), DECORATORS, ids=IDS)
def test_the_signature_has_the_models_options_in_order(
    decorator: Callable[..., Any], model: type[Options], positional: tuple[str, ...]
) -> None:
    assert list(parameters(decorator)) == model.option_names()


@pytest.mark.parametrize(("decorator", "model", "positional"), DECORATORS, ids=IDS)
def test_options_are_keyword_only_but_the_documented_positional_ones(
    decorator: Callable[..., Any], model: type[Options], positional: tuple[str, ...]
) -> None:
    kinds = {name: parameter.kind for name, parameter in parameters(decorator).items()}
    by_name, by_either = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    expected = {name: by_either if name in positional else by_name for name in model.option_names()}
    assert kinds == expected
    assert list(kinds)[: len(positional)] == list(positional)


@pytest.mark.parametrize(("decorator", "model", "positional"), DECORATORS, ids=IDS)
def test_defaults_are_the_models(
    decorator: Callable[..., Any], model: type[Options], positional: tuple[str, ...]
) -> None:
    for name, parameter in parameters(decorator).items():
        if (model.decorator, name) in REQUIRED:
            assert parameter.default is inspect.Parameter.empty, name
            continue
        default = model.option_field(name).default
        assert parameter.default == default, f"@{model.decorator}({name}=...)"
        assert type(parameter.default) is type(default), f"@{model.decorator}({name}=...)"


@pytest.mark.parametrize(("decorator", "model", "positional"), DECORATORS, ids=IDS)
def test_types_are_the_models(
    decorator: Callable[..., Any], model: type[Options], positional: tuple[str, ...]
) -> None:
    declared = hints(decorator)
    for name in model.option_names():
        field_type = model.option_field(name).annotation
        where = f"@{model.decorator}({name}=...)"
        if (model.decorator, name) in DECLARED:
            stored, taken = DECLARED[model.decorator, name]
            assert members(field_type) == members(stored), f"{where}: the model's type changed"
            assert members(declared[name]) == members(taken), f"{where}: the decorator's type changed"
        else:
            assert members(declared[name]) == model_accepts(field_type), where


@pytest.mark.parametrize(("decorator", "model", "positional"), DECORATORS, ids=IDS)
def test_the_docstring_describes_each_option_as_the_model_does(
    decorator: Callable[..., Any], model: type[Options], positional: tuple[str, ...]
) -> None:
    doc = inspect.getdoc(decorator) or ""
    described = {
        name: " ".join(text.split())
        for name, text in re.findall(r"^:param (\w+): (.*?)(?=^:|\Z)", doc, flags=re.M | re.S)
    }
    expected = {name: model.option_field(name).description for name in model.option_names()}
    assert described == expected


OVERLOADED = [entry for entry in DECORATORS if entry[1] is not PipelineOptions]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.get_overloads is new in 3.11")
@pytest.mark.parametrize(
    ("decorator", "model", "positional"), OVERLOADED, ids=[model.decorator for _, model, _ in OVERLOADED]
)
def test_type_checkers_see_the_bare_form_and_the_written_signature(
    decorator: Callable[..., Any], model: type[Options], positional: tuple[str, ...]
) -> None:
    bare, called = typing.get_overloads(inspect.unwrap(decorator))
    (target,) = inspect.signature(bare).parameters.values()
    assert target.kind is inspect.Parameter.POSITIONAL_ONLY
    assert inspect.signature(called) == inspect.signature(decorator)


def test_every_decorator_with_options_is_checked() -> None:
    checked = {model.decorator for _, model, _ in DECORATORS}
    from flowwarden.config.reference import DECORATOR_MODELS

    assert checked == {model.decorator for model in DECORATOR_MODELS}
