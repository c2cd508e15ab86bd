"""scripts/mutation: its table names tests that exist, and ``--again`` runs what can have changed."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("mutation_script", str(ROOT / "scripts" / "mutation"))
    spec = importlib.util.spec_from_loader("mutation_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_module_and_test_of_the_table_exists() -> None:
    script = _script()
    for module, tests in script.TESTS.items():
        assert (ROOT / "src" / "flowwarden" / module).is_file(), module
        for test in tests:
            path = test.removeprefix("--deselect=").split("::")[0]
            assert (ROOT / path).is_file(), f"{module}: {test}"


OLD = '''
def kept(x):
    return x + 1


def changed(x):
    return x - 1


class Box:
    def method(self):
        return 1
'''

NEW = '''
def kept(x):
    return x + 1


def changed(x):
    return x - 2


def added(x):
    return x


class Box:
    def method(self):
        return 1
'''


def test_again_runs_the_survivors_of_unchanged_functions_and_every_mutant_of_changed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    target = "src/flowwarden/m.py"
    (tmp_path / target).parent.mkdir(parents=True)
    (tmp_path / target).write_text(NEW)
    work = tmp_path / ".mutation" / "m"
    (work / target).parent.mkdir(parents=True)
    (work / target).write_text(OLD)
    (work / "mutants" / target).parent.mkdir(parents=True)
    codes = {
        "flowwarden.m.x_kept__mutmut_1": 1,  # killed
        "flowwarden.m.x_kept__mutmut_2": 0,  # survived
        "flowwarden.m.x_changed__mutmut_1": 1,
        "flowwarden.m.x_changed__mutmut_2": 0,
        "flowwarden.m.x\u01c1Box\u01c1method__mutmut_1": 0,
        "flowwarden.m.x\u01c1Box\u01c1method__mutmut_2": 36,  # timeout
    }
    (work / "mutants" / (target + ".meta")).write_text(json.dumps({"exit_code_by_key": codes}))
    kept, names = script.still_open("m.py", work, target)
    assert kept == {"flowwarden.m.x_kept__mutmut_1": 1, "flowwarden.m.x\u01c1Box\u01c1method__mutmut_2": 36}
    assert sorted(names) == sorted(
        [
            "flowwarden.m.x_added__mutmut_*",
            "flowwarden.m.x_changed__mutmut_*",
            "flowwarden.m.x_kept__mutmut_2",
            "flowwarden.m.x\u01c1Box\u01c1method__mutmut_1",
        ]
    )
