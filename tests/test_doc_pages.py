"""The README and the documentation pages run: every Python block executes as written.

Blocks run one by one, each in a fresh namespace. docs/spark.md (which needs the shared Spark
session) and docs/checkpoints.md (whose example store also goes through the contract suite) have
tests of their own; every other page is run here, so a new page is covered the day it is written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_TESTS = {
    "spark.md": "tests/spark/test_spark_docs.py",
    "checkpoints.md": "tests/checkpoints/test_docs.py",
}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


BLOCKS = [
    pytest.param(page, index, block, id=f"{page.relative_to(ROOT)}#{index}")
    for page in PAGES
    if page.name not in OWN_TESTS
    for index, block in enumerate(python_blocks(page))
]


@pytest.mark.parametrize(("page", "index", "block"), BLOCKS)
def test_the_block_runs(page: Path, index: int, block: str) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}_{index}"}
    exec(compile(block, f"{page}#python-block-{index}", "exec"), namespace)


def test_the_pages_that_teach_the_api_have_examples() -> None:
    for name in ("README.md", "index.md", "handlers.md", "runtime.md", "operations.md", "guarantees.md"):
        page = ROOT / name if name == "README.md" else ROOT / "docs" / name
        assert python_blocks(page), f"{name} lost its examples"


def test_pages_with_tests_of_their_own_have_them() -> None:
    for page, test in OWN_TESTS.items():
        assert python_blocks(ROOT / "docs" / page) and (ROOT / test).exists(), page


def test_the_site_lists_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        assert str(page.relative_to(ROOT / "docs")) in nav, f"mkdocs.yml's nav lacks {page.name}"
