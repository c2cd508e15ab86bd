"""The API reference (docs/reference, rendered by mkdocstrings from the docstrings) documents
every decorator, and every public attribute of what a handler receives and what the connector
reports says what it is: an attribute without a docstring would not appear on the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowwarden import decorators

ROOT = Path(__file__).resolve().parents[1]

DECORATORS = [
    "change_stream",
    "checkpoint",
    "pipeline",
    "retry_policy",
    "dead_letter_queue",
    "on_insert",
    "on_update",
    "on_replace",
    "on_delete",
    "on_change",
    "on_snapshot",
    "on_batch",
    "on_dataframe",
    "event_filter",
]

# (module, class, the page it is documented on)
DOCUMENTED = [
    ("flowwarden.events", "ChangeEvent", "events.md"),
    ("flowwarden.runtime.context", "StreamContext", "events.md"),
    ("flowwarden.runtime.status", "StreamStatus", "connector.md"),
    ("flowwarden.runtime.status", "StreamState", "connector.md"),
    *[
        ("flowwarden.config.choices", choice, "decorators.md")
        for choice in ("StartPosition", "OnHistoryLost", "OnError", "OnInvalidate", "Deployment", "Snapshot")
    ],
    ("flowwarden.config.choices", "SchemaMode", "decorators.md"),
]


def test_every_decorator_has_its_entry() -> None:
    page = (ROOT / "docs" / "reference" / "decorators.md").read_text()
    prefixes = ("on_", "change_", "check", "pipe", "retry", "dead", "event_")
    assert {name for name in decorators.__all__ if name.startswith(prefixes)} == set(DECORATORS)
    missing = [name for name in DECORATORS if f"::: flowwarden.decorators.{name}\n" not in page]
    assert missing == []


@pytest.fixture(scope="module")
def loader() -> Any:
    """Reads the sources as mkdocstrings does (griffe, from the docs extra)."""
    griffe = pytest.importorskip("griffe")
    return griffe.GriffeLoader(search_paths=[str(ROOT / "src")])


@pytest.mark.parametrize(("module", "name", "page"), DOCUMENTED, ids=[name for _, name, _ in DOCUMENTED])
def test_every_public_attribute_says_what_it_is(loader: Any, module: str, name: str, page: str) -> None:
    text = (ROOT / "docs" / "reference" / page).read_text()
    documented = loader.load(module)[name]
    shown = module.replace(".choices", "") if page == "decorators.md" else module
    assert f"::: {shown}.{name}\n" in text
    assert documented.docstring, f"{name} has no docstring"
    silent = [
        member
        for member, value in documented.members.items()
        if not member.startswith("_") and not value.docstring
    ]
    assert silent == [], f"{name}: {silent} have no docstring, so the reference leaves them out"
