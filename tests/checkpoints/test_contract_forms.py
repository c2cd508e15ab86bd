"""One contract suite, run on sync and on async stores: the same tests, each run in both forms, and
a store that breaks a rule fails the same tests in either form."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from flowwarden.checkpoints.contract import (
    AsyncCheckpointStoreContract,
    AsyncSnapshotStoreContract,
    CheckpointStoreContract,
    SnapshotRules,
    SnapshotStoreContract,
    StoreRules,
)

STORE_TESTS = 27
SNAPSHOT_TESTS = 12


def names_of_tests(cls: type) -> set[str]:
    return {name for name in dir(cls) if name.startswith("test_")}


def test_both_forms_have_every_test_of_the_one_suite() -> None:
    rules, snapshot_rules = names_of_tests(StoreRules), names_of_tests(SnapshotRules)
    assert len(rules) == STORE_TESTS and len(snapshot_rules) == SNAPSHOT_TESTS
    assert names_of_tests(CheckpointStoreContract) == names_of_tests(AsyncCheckpointStoreContract) == rules
    assert names_of_tests(SnapshotStoreContract) == snapshot_rules
    assert names_of_tests(AsyncSnapshotStoreContract) == snapshot_rules
    for name in names_of_tests(StoreRules):
        # The blocking form's tests are plain (no asyncio plugin needed), the same bodies inside.
        blocking = getattr(CheckpointStoreContract, name)
        assert not inspect.iscoroutinefunction(blocking), name
        body = getattr(StoreRules, name)
        assert blocking.__wrapped__ is body is getattr(AsyncCheckpointStoreContract, name)


SUITES = textwrap.dedent(
    """
    import asyncio

    import pytest

    from flowwarden.checkpoints import InMemoryCheckpointStore
    from flowwarden.checkpoints.contract import (
        AsyncCheckpointStoreContract,
        AsyncSnapshotStoreContract,
        CheckpointStoreContract,
        SnapshotStoreContract,
    )

    BROKEN = {broken}


    class Memory(InMemoryCheckpointStore):
        def save_seen(self, stream_id, token, epoch):
            # The planted bug: save_seen is never fenced.
            return super().save_seen(stream_id, token, 10**6 if BROKEN else epoch)


    class AsyncMemory:
        \"\"\"The same store, asyncio: every call yields to the loop first.\"\"\"

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            method = getattr(self.inner, name)

            async def call(*args):
                await asyncio.sleep(0)
                return method(*args)

            return call


    class TestSync(CheckpointStoreContract, SnapshotStoreContract):
        @pytest.fixture(autouse=True)
        def _backing(self):
            self.backing = Memory()

        def make_store(self):
            return self.backing


    class TestAsync(AsyncCheckpointStoreContract, AsyncSnapshotStoreContract):
        @pytest.fixture(autouse=True)
        def _backing(self):
            self.backing = Memory()

        def make_store(self):
            return AsyncMemory(self.backing)
    """
)


def run_suites(tmp_path: Path, *, broken: bool) -> tuple[dict[str, set[str]], str]:
    """The two forms run by pytest in a process of its own: the tests each form passed and failed."""
    (tmp_path / "test_forms.py").write_text(SUITES.format(broken=broken), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outcomes: dict[str, set[str]] = {}
    found = re.findall(r"::(TestSync|TestAsync)::(test_\w+) (PASSED|FAILED)", result.stdout)
    for form, name, outcome in found:
        outcomes.setdefault(f"{form} {outcome}", set()).add(name)
    return outcomes, result.stdout + result.stderr


def test_each_test_runs_on_a_sync_and_on_an_async_store(tmp_path: Path) -> None:
    outcomes, output = run_suites(tmp_path, broken=False)
    every = names_of_tests(StoreRules) | names_of_tests(SnapshotRules)
    assert outcomes == {"TestSync PASSED": every, "TestAsync PASSED": every}, output
    assert f"{2 * (STORE_TESTS + SNAPSHOT_TESTS)} passed" in output


def test_a_store_that_breaks_a_rule_fails_the_same_tests_in_both_forms(tmp_path: Path) -> None:
    outcomes, output = run_suites(tmp_path, broken=True)
    failed = outcomes.get("TestSync FAILED", set())
    assert "test_save_seen_with_a_lower_epoch_is_fenced" in failed, output
    assert outcomes.get("TestAsync FAILED") == failed, output
