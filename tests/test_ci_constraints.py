"""CI installs pinned versions (.ci/constraints.txt): every dependency the project names has a pin.

A dependency added to pyproject.toml without running scripts/update-constraints would be
installed unpinned in CI, and its next release could turn CI red with no change here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement string (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def test_every_dependency_has_a_pin_in_the_ci_constraints() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    named = {_name(r) for r in project["dependencies"]}
    for requirements in project["optional-dependencies"].values():
        named |= {_name(r) for r in requirements}
    named -= {"flowwarden", "flowwarden-embedded"}  # this repository's own distributions
    named -= {"tomli"}  # Python 3.10 only: CI runs a newer Python
    pinned = {
        _name(line.split("==")[0])
        for line in (ROOT / ".ci" / "constraints.txt").read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.startswith("#")
    }
    missing = sorted(named - pinned)
    assert not missing, f"no pin in .ci/constraints.txt for {missing}: run scripts/update-constraints"


def test_ci_installs_through_the_constraints() -> None:
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'export PIP_CONSTRAINT="$PWD/.ci/constraints.txt"' in run
