"""The base of every option model, and how a rejected value becomes a ConfigurationError.

Every model is validated once, when a decorator is applied; nothing here runs per event. A bad
value never escapes as a pydantic error: :func:`validate_options` turns it into a
:class:`~flowwarden.errors.ConfigurationError` naming the class, the option, the value and what
is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from flowwarden.errors import ConfigurationError


class OptionProblem(ValueError):
    """A rejected option value, raised inside validators and turned into a ConfigurationError.

    Carries the option, the value and the allowed values so the error names them precisely even
    when the check spans several fields.
    """

    def __init__(self, message: str, *, option: str, value: Any, allowed: str) -> None:
        super().__init__(message)
        self.message = message
        self.option = option
        self.value = value
        self.allowed = allowed


class Options(BaseModel):
    """Base of every option model: frozen, strict (no silent coercion), unknown options rejected."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True)

    decorator: ClassVar[str] = ""
    allowed: ClassVar[Mapping[str, str]] = {}


OptionsT = TypeVar("OptionsT", bound=Options)


def validate_options(model: type[OptionsT], owner: str, values: Mapping[str, Any]) -> OptionsT:
    """Build ``model`` from ``values``, or raise a ConfigurationError naming ``owner``.

    The error names the option, the value given and the allowed values; a pydantic
    ValidationError never escapes.
    """
    try:
        return model(**values)
    except ValidationError as exc:
        raise _configuration_error(model, owner, values, exc) from None


def _configuration_error(
    model: type[Options], owner: str, values: Mapping[str, Any], exc: ValidationError
) -> ConfigurationError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    more = f" ({len(errors) - 1} more problem(s) after this one)" if len(errors) > 1 else ""
    context = first.get("ctx") or {}
    cause = context.get("error")
    decorator = f"@{model.decorator}" if model.decorator else model.__name__
    if isinstance(cause, OptionProblem):
        return ConfigurationError(
            f"{decorator}: {cause.message}{more}",
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
        known = [name for name in model.allowed]
        return ConfigurationError(
            f"{decorator} has no option {option!r}{more}",
            owner=owner,
            option=option,
            value=value,
            allowed="options " + ", ".join(known),
        )
    return ConfigurationError(
        f"{decorator}({option}={value!r}) is not accepted: {first.get('msg', 'invalid value')}{more}",
        owner=owner,
        option=option,
        value=value,
        allowed=model.allowed.get(option, "see the docstring of " + decorator),
    )
