"""The README's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_an_example() -> None:
    assert python_blocks(), "README.md lost its python example"


def test_readme_example_runs() -> None:
    for block in python_blocks():
        namespace: dict[str, object] = {"__name__": "readme_example"}
        exec(compile(block, str(README), "exec"), namespace)
