"""docs/spark.md runs: each of its Python examples executes as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_doc_has_its_four_examples() -> None:
    blocks = python_blocks()
    assert len(blocks) == 4
    assert "events_to_dataframe" in blocks[0] and 'format("flowwarden")' in blocks[1]
    assert "infer_schema" in blocks[2] and "latest_per_key" in blocks[2]
    assert "native.AVAILABLE" in blocks[3]


@pytest.mark.parametrize(
    "index", [0, 1, 2, 3], ids=["batches", "streaming-source", "inferred-latest", "compiled-converter"]
)
def test_the_examples_run(spark: SparkSession, index: int) -> None:
    # `spark` is started first so get_or_create_session() in the doc returns the shared session.
    code = compile(python_blocks()[index], f"{DOC}#example{index}", "exec", dont_inherit=True)
    exec(code, {"__name__": "__docs__"})
