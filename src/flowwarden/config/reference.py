"""The options reference (docs/options.md), written from the option models.

    python -m flowwarden.config.reference > docs/options.md

The models are the one declaration of every option; this page is derived from them, and a test
checks that the page in the repository is what this module writes today.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from flowwarden.config.base import Options
from flowwarden.config.checkpoint import CheckpointOptions
from flowwarden.config.delivery import BatchOptions, DataFrameOptions, DeadLetterOptions, RetryPolicy
from flowwarden.config.pipeline import PipelineOptions
from flowwarden.config.stream import ChangeStreamOptions

DECORATOR_MODELS: tuple[type[Options], ...] = (
    ChangeStreamOptions,
    CheckpointOptions,
    PipelineOptions,
    RetryPolicy,
    DeadLetterOptions,
    BatchOptions,
    DataFrameOptions,
)


def _default(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, tuple) and all(isinstance(item, type) for item in value):
        return "(" + ", ".join(item.__name__ for item in value) + ("," if len(value) == 1 else "") + ")"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def model_section(model: type[Options]) -> list[str]:
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    lines = [
        f"## @{model.decorator}",
        "",
        " ".join(doc.split()),
        "",
        "| option | default | accepts | what it does |",
    ]
    lines.append("|---|---|---|---|")
    for name in model.option_names():
        field = model.option_field(name)
        lines.append(
            f"| `{name}` | {_default(field.default)} | {_cell(model.allowed[name])} | "
            f"{_cell(field.description or '')} |"
        )
    return [*lines, ""]


def render() -> str:
    lines = [
        "# Options reference",
        "",
        "Every option of every decorator, with its default, what it accepts and what it does.",
        "This page is written from the option models (`python -m flowwarden.config.reference`), the",
        "one place each option is declared; a bad value fails when the decorator is applied, with a",
        "message naming the option and what it accepts. The streaming source's options are in",
        "[spark.md](spark.md).",
        "",
    ]
    for model in DECORATOR_MODELS:
        lines.extend(model_section(model))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
