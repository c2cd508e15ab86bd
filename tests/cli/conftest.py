"""Helpers of the command-line tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flowwarden import Connector

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the FLOWWARDEN_* variables they mean to; none leak in from the shell."""
    for name in list(os.environ):
        if name.startswith("FLOWWARDEN_") and name != "FLOWWARDEN_TEST_MONGODB_URI":
            monkeypatch.delenv(name)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flowwarden: "), err
    return lines[0]


def flowwarden(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60):
    """``python -m flowwarden.cli ARGS`` in a process of its own, with ``env`` added to a copy of
    this process's environment that holds no FLOWWARDEN_* settings."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLOWWARDEN_")}
    return subprocess.run(
        [sys.executable, "-m", "flowwarden.cli", *args],
        capture_output=True,
        text=True,
        env={**environment, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value


@contextmanager
def running(uri: str, handlers: list[type], **kwargs: Any) -> Iterator[Connector]:
    """A connector started in this process, stopped when the block ends."""
    connector = Connector(uri, handlers, **kwargs)
    connector.start()
    try:
        yield connector
    finally:
        connector.stop(timeout=30)


def checkpoint_doc(client: Any, db: str, stream: str) -> dict[str, Any] | None:
    document: dict[str, Any] | None = client[db]["_fw_checkpoints"].find_one({"_id": stream})
    return document
