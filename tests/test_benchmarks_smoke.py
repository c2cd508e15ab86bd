"""Every script in benchmarks/ has its smoke run: a line in scripts/benchmarks-smoke, which CI runs.

The benchmarks assert nothing and no test imports them, so one that no longer runs against the
code (a patched method renamed, an option gone) goes unnoticed until a user runs it. The smoke
script runs each at a tiny size; this test only checks that none is left out of it (it does not
run the benchmarks), so a new benchmark comes with its smoke line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "scripts" / "benchmarks-smoke"


def smoke_lines() -> dict[str, str]:
    """The benchmarks scripts/benchmarks-smoke runs, each with its command line."""
    runs: dict[str, str] = {}
    for line in SMOKE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\s*bench\s+(\S+\.py)\b", line)
        if match:
            runs[match.group(1)] = line.strip()
    return runs


def test_every_benchmark_has_a_smoke_run() -> None:
    benchmarks = sorted(path.name for path in (ROOT / "benchmarks").glob("*.py"))
    assert benchmarks, "no benchmarks found in benchmarks/"
    missing = [name for name in benchmarks if name not in smoke_lines()]
    assert not missing, (
        f"benchmarks without a smoke run: {missing}; add a line 'bench <name>.py <tiny-size options>' "
        "to scripts/benchmarks-smoke"
    )


def test_the_smoke_runs_only_benchmarks_that_exist() -> None:
    stale = [name for name in smoke_lines() if not (ROOT / "benchmarks" / name).is_file()]
    assert not stale, f"scripts/benchmarks-smoke runs benchmarks that do not exist: {stale}"


def test_ci_runs_the_smoke_script() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(re.fullmatch(r"\s*bash scripts/benchmarks-smoke\s*", line) for line in ci), (
        ".ci/run does not run scripts/benchmarks-smoke"
    )
