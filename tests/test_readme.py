"""The README's example and the runtime guide's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "runtime.md"]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_examples_run(path: Path) -> None:
    blocks = python_blocks(path)
    assert blocks, f"{path.name} lost its python examples"
    for block in blocks:
        namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
        exec(compile(block, str(path), "exec"), namespace)
