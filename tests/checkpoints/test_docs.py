"""docs/checkpoints.md runs: its scripts execute and its example store passes the contract suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from flowwarden.checkpoints.contract import CheckpointStoreContract

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
FILE_MARK = re.compile(r"^# file: (\S+)\n")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_doc_has_the_examples_this_test_runs() -> None:
    blocks = python_blocks()
    files = [FILE_MARK.match(block).group(1) for block in blocks if FILE_MARK.match(block)]  # type: ignore[union-attr]
    assert files == ["sqlite_store.py", "test_sqlite_store.py"]
    assert len(blocks) == 3


def test_the_scripts_run() -> None:
    for block in python_blocks():
        if not FILE_MARK.match(block):
            exec(compile(block, str(DOC), "exec"), {"__name__": "__docs__"})


def test_the_example_store_passes_the_contract_suite(tmp_path: Path) -> None:
    for block in python_blocks():
        mark = FILE_MARK.match(block)
        if mark:
            (tmp_path / mark.group(1)).write_text(block, encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    expected = len([name for name in dir(CheckpointStoreContract) if name.startswith("test_")])
    assert f"{expected} passed" in result.stdout, result.stdout
