"""scripts/mutation: its table names tests that exist, and ``--again`` runs what can have changed."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
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
    for module, tests in [*script.TESTS.items(), *script.SPARK_TESTS.items()]:
        assert (ROOT / "src" / "flowwarden" / module).is_file(), module
        for test in tests:
            path = test.removeprefix("--deselect=").split("::")[0]
            assert (ROOT / path).is_file(), f"{module}: {test}"


OLD = """
def kept(x):
    return x + 1


def changed(x):
    return x - 1


class Box:
    def method(self):
        return 1
"""

NEW = """
def kept(x):
    return x + 1


def changed(x):
    return x - 2


def added(x):
    return x


class Box:
    def method(self):
        return 1
"""


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


def _two_pass_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script with one module, m.py, under ``tmp_path``, whose tests have a Spark pass."""
    script = _script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "SCRATCH", tmp_path / ".mutation")
    monkeypatch.setattr(script, "TESTS", {"m.py": ["tests/test_m.py"]})
    monkeypatch.setattr(script, "SPARK_TESTS", {"m.py": ["tests/test_m_spark.py"]})
    return script


def test_the_spark_pass_runs_the_survivors_and_its_results_replace_theirs_except_no_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _two_pass_script(tmp_path, monkeypatch)
    monkeypatch.setattr(script, "one_line_diff", lambda work, target, name: "")
    (tmp_path / "src" / "flowwarden").mkdir(parents=True)
    (tmp_path / "src" / "flowwarden" / "m.py").write_text(NEW)
    first = {
        "flowwarden.m.x_kept__mutmut_1": 1,  # killed: not run again
        "flowwarden.m.x_kept__mutmut_2": 0,  # survived: the Spark tests kill it
        "flowwarden.m.x_changed__mutmut_1": 0,  # survived: the Spark tests never reach it
        "flowwarden.m.x_changed__mutmut_2": 33,  # no tests: the Spark tests let it survive
        "flowwarden.m.x_added__mutmut_1": 36,  # timeout: not run again
    }
    second = {
        "flowwarden.m.x_kept__mutmut_2": 1,
        "flowwarden.m.x_changed__mutmut_1": 33,
        "flowwarden.m.x_changed__mutmut_2": 0,
    }
    calls = []

    def mutate(module, work, tests, names, *, forkserver):
        calls.append((work.name, tests, sorted(names), forkserver))
        codes = first if not forkserver else {name: None for name in first} | second
        meta = work / "mutants" / "src" / "flowwarden" / "m.py.meta"
        meta.parent.mkdir(parents=True)
        meta.write_text(json.dumps({"exit_code_by_key": codes}))
        return dict(codes)

    monkeypatch.setattr(script, "mutate", mutate)
    row = script.run_module("m.py")
    assert calls == [
        ("m", ["tests/test_m.py"], [], False),
        ("m__spark", ["tests/test_m_spark.py"], sorted(second), True),
    ]
    counted = (row["mutants"], row["killed"], row["survived"], row["no tests"], row["timeout"])
    assert counted == (5, 2, 2, 0, 1)
    # What the next --again goes on from.
    stored = tmp_path / ".mutation" / "m" / "mutants" / "src" / "flowwarden" / "m.py.meta"
    assert json.loads(stored.read_text())["exit_code_by_key"] == first | {
        "flowwarden.m.x_kept__mutmut_2": 1,
        "flowwarden.m.x_changed__mutmut_2": 0,
    }


def test_a_run_stopped_in_its_spark_pass_keeps_both_passes_results_for_the_next_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _two_pass_script(tmp_path, monkeypatch)
    target = "src/flowwarden/m.py"
    (tmp_path / target).parent.mkdir(parents=True)
    (tmp_path / target).write_text(NEW)
    work = tmp_path / ".mutation" / "m"
    last = {  # the last run's results: kept_1 was killed, so --again does not run it
        "flowwarden.m.x_kept__mutmut_1": 1,
        "flowwarden.m.x_kept__mutmut_2": 0,
        "flowwarden.m.x_kept__mutmut_3": 0,
    }
    (work / "mutants" / target).parent.mkdir(parents=True)
    (work / target).parent.mkdir(parents=True)
    (work / target).write_text(NEW)
    (work / "mutants" / (target + ".meta")).write_text(json.dumps({"exit_code_by_key": last}))

    def mutate(module, work, tests, names, *, forkserver):
        meta = work / "mutants" / (target + ".meta")
        if not forkserver:  # the first pass: a fresh scratch project, the unnamed mutants not run
            assert sorted(names) == ["flowwarden.m.x_kept__mutmut_2", "flowwarden.m.x_kept__mutmut_3"]
            (work / target).parent.mkdir(parents=True, exist_ok=True)
            (work / target).write_text(NEW)
            codes = {"flowwarden.m.x_kept__mutmut_1": None, "flowwarden.m.x_kept__mutmut_2": 0}
            codes["flowwarden.m.x_kept__mutmut_3"] = 0
            meta.parent.mkdir(parents=True, exist_ok=True)
            meta.write_text(json.dumps({"exit_code_by_key": codes}))
            return codes
        # The Spark pass measured one mutant (mutmut saves as each ends), then the run stopped.
        meta.parent.mkdir(parents=True, exist_ok=True)
        partial = {name: None for name in last} | {"flowwarden.m.x_kept__mutmut_2": 1}
        meta.write_text(json.dumps({"exit_code_by_key": partial}))
        first = work.with_name("m") / "mutants" / (target + ".meta")
        os.utime(meta, (first.stat().st_mtime + 1, first.stat().st_mtime + 1))
        raise KeyboardInterrupt

    monkeypatch.setattr(script, "mutate", mutate)
    with pytest.raises(KeyboardInterrupt):
        script.run_module("m.py", again=True)
    kept, names = script.still_open("m.py", work, target)
    assert kept == {"flowwarden.m.x_kept__mutmut_1": 1, "flowwarden.m.x_kept__mutmut_2": 1}
    assert names == ["flowwarden.m.x_kept__mutmut_3"]
