"""The exception option checks raise; kept apart from the pydantic models so that the choices
(enums) and name checks import without pydantic, as a Spark worker reading them does."""

from __future__ import annotations

from typing import Any


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


__all__ = ["OptionProblem"]
