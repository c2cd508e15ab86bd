"""examples/streaming_query.py runs: a streaming aggregation, restarted from its checkpoint."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "streaming_query.py"


def test_streaming_query_example(mongodb_uri: str, db_name: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--uri",
            mongodb_uri,
            "--database",
            db_name,
            "--orders",
            "60",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "totals match the orders written: every event counted once" in result.stdout
    totals = pq.read_table(str(tmp_path / "totals")).to_pylist()
    assert sum(row["orders"] for row in totals) == 120
    assert {row["status"] for row in totals} <= {"new", "paid", "shipped"}
    assert all(isinstance(row["revenue"], Decimal) for row in totals)
