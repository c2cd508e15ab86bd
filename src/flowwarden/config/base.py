"""The base of every option model, and how a rejected value becomes a ConfigurationError.

A model's fields are the one declaration of its options: name, type, default, limits and a
description. What a message says is allowed is derived from them (:func:`allowed_text`), unless
a field spells it out as ``Field(json_schema_extra={"allowed": ...})`` because its rule is more
than its type says. Every model is validated once, when a decorator is applied; nothing here
runs per event. A bad value never escapes as a pydantic error: :func:`validate_options` turns it
into a :class:`~flowwarden.errors.ConfigurationError` naming the class, the option, the value
and what is allowed.
"""

from __future__ import annotations

import difflib
import enum
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from flowwarden.config.problems import OptionProblem
from flowwarden.errors import ConfigurationError


class Options(BaseModel):
    """Base of every option model: frozen, strict (no silent coercion), unknown options rejected.

    ``allowed`` (option name -> what it accepts) is derived from the fields when a model class
    is created; ``option_names()`` lists the options as a decorator takes them.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True)

    decorator: ClassVar[str] = ""
    allowed: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = cls.model_fields.items()
        cls.allowed = {option_name(name, field): allowed_text(field) for name, field in fields}

    @classmethod
    def option_names(cls) -> list[str]:
        """The options in declaration order, as a decorator takes them (aliases applied)."""
        return [option_name(name, field) for name, field in cls.model_fields.items()]

    @classmethod
    def option_field(cls, option: str) -> FieldInfo:
        """The field declaring ``option`` (its alias, if it has one)."""
        for name, field in cls.model_fields.items():
            if option_name(name, field) == option:
                return field
        raise KeyError(option)


def option(default: Any, description: str, *, allowed: str | None = None, **limits: Any) -> Any:
    """Declare an option: its default, what it does, and, when its type and ``limits`` (pydantic
    ``Field`` constraints: ``ge``, ``gt``, ``le``, ``allow_inf_nan``, ``alias``) do not say it
    all, what it accepts in words."""
    extra: JsonDict | None = {"allowed": allowed} if allowed is not None else None
    return Field(default=default, description=description, json_schema_extra=extra, **limits)


def option_name(name: str, field: FieldInfo) -> str:
    return field.alias or name


def allowed_text(field: FieldInfo) -> str:
    """What ``field`` accepts, in words: its declared ``allowed`` text, or one derived from its
    type and limits ("None or an int >= 1", "'stop', 'restart'", "a finite number > 0")."""
    extra = field.json_schema_extra
    if isinstance(extra, Mapping) and isinstance(extra.get("allowed"), str):
        return str(extra["allowed"])
    annotation = field.annotation
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        optional = len(members) < len(typing.get_args(annotation))
        annotation = members[0] if len(members) == 1 else annotation
    text = _type_text(annotation, field)
    return f"None or {text}" if optional else text


def _type_text(annotation: Any, field: FieldInfo) -> str:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return ", ".join(repr(member.value) for member in annotation)
    if typing.get_origin(annotation) is Literal:
        return ", ".join(repr(value) for value in typing.get_args(annotation))
    if annotation is bool:
        return "True or False"
    if annotation is str:
        return "a string"
    if annotation in (int, float):
        return _number_text(annotation, field)
    return getattr(annotation, "__name__", str(annotation))


def _number_text(annotation: Any, field: FieldInfo) -> str:
    finite = any(getattr(item, "allow_inf_nan", None) is False for item in field.metadata)
    noun = "an int" if annotation is int else ("a finite number" if finite else "a number")
    low = high = None
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            low = f">= {item.ge}"
        elif isinstance(item, annotated_types.Gt):
            low = f"> {item.gt}"
        elif isinstance(item, annotated_types.Le):
            high = item.le
    ge = next((item.ge for item in field.metadata if isinstance(item, annotated_types.Ge)), None)
    if ge is not None and high is not None:
        return f"{noun} from {ge} to {high}"
    return f"{noun} {low}" if low else noun


OptionsT = TypeVar("OptionsT", bound=Options)


def validate_options(
    model: type[OptionsT], owner: str, values: Mapping[str, Any], *, label: str | None = None
) -> OptionsT:
    """Build ``model`` from ``values``, or raise a ConfigurationError naming ``owner``.

    The error names the option, the value given and the allowed values; a pydantic
    ValidationError never escapes. The message names the model's decorator (``@checkpoint``)
    unless ``label`` says otherwise; ``label=""`` names none (the owner says where the options
    were given).
    """
    try:
        return model(**values)
    except ValidationError as exc:
        raise _configuration_error(model, owner, values, exc, label) from None


def _configuration_error(
    model: type[Options], owner: str, values: Mapping[str, Any], exc: ValidationError, label: str | None
) -> ConfigurationError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    more = f" ({len(errors) - 1} more problem(s) after this one)" if len(errors) > 1 else ""
    context = first.get("ctx") or {}
    cause = context.get("error")
    decorator = label if label is not None else (f"@{model.decorator}" if model.decorator else model.__name__)
    said = f"{decorator}: " if decorator else ""
    if isinstance(cause, OptionProblem):
        return ConfigurationError(
            f"{said}{cause.message}{more}",
            owner=owner,
            option=cause.option,
            value=cause.value,
            allowed=cause.allowed,
        )
    location = first.get("loc") or ()
    option = str(location[0]) if location else "options"
    if option == "schema_":
        option = "schema"
    value = values.get(option, first.get("input"))
    if first.get("type") == "extra_forbidden":
        return unknown_option_error(model, owner, option, value, decorator=decorator, more=more)
    return ConfigurationError(
        f"{decorator}({option}={value!r}) is not accepted: {first.get('msg', 'invalid value')}{more}"
        if decorator
        else f"{option}={value!r} is not accepted: {first.get('msg', 'invalid value')}{more}",
        owner=owner,
        option=option,
        value=value,
        allowed=model.allowed.get(option, "see the docstring of " + decorator),
    )


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'collection'?"`` for the known name closest to the misspelt ``name``, or
    ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_option_error(
    model: type[Options],
    owner: str,
    option: str,
    value: Any,
    *,
    decorator: str | None = None,
    more: str = "",
) -> ConfigurationError:
    """The error for an option ``model`` does not have: it names the closest option there is and
    lists them all. ``decorator`` is how the message names the model (``@change_stream`` when
    None; ``""``: not at all)."""
    if decorator is None:
        decorator = f"@{model.decorator}" if model.decorator else model.__name__
    known = list(model.allowed)
    return ConfigurationError(
        f"{decorator + ' has' if decorator else 'there is'} no option {option!r}"
        f"{did_you_mean(option, known)}{more}",
        owner=owner,
        option=option,
        value=value,
        allowed="options " + ", ".join(known),
    )
