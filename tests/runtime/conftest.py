"""Helpers for end-to-end connector tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pymongo
import pytest
from bson.codec_options import TypeDecoder
from bson.decimal128 import Decimal128
from bson.errors import InvalidBSON

from helpers import wait_until


def run_connector(
    uri: str, db: str, log: Path, target: str = "cli_handlers:Orders", **env: str
) -> subprocess.Popen[str]:
    """``flowwarden run TARGET`` in a process of its own, ``cli_handlers:Orders`` unless told
    (see cli_handlers.py; the modules beside it are importable too)."""
    environment = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        FW_TEST_DB=db,
        FW_TEST_LOG=str(log),
        **env,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "flowwarden.cli", "run", target, "--uri", uri],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


class ChildLog:
    """What a child process writes to a pipe (its stderr, say), read as it is written: a test
    waits for a line instead of sleeping, and a chatty child never blocks on a full pipe."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None, "start the child with the pipe set to subprocess.PIPE"
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._lines.append(line)

    def text(self) -> str:
        return "".join(self._lines)

    def lines(self) -> list[str]:
        return list(self._lines)

    def mark(self) -> int:
        """Where the log ends now: ``wait_for(..., after=mark)`` waits for a line written later."""
        return len(self._lines)

    def wait_for(self, fragment: str, timeout: float = 20.0, after: int = 0) -> None:
        wait_until(
            lambda: any(fragment in line for line in self._lines[after:]),
            timeout=timeout,
            what=f"{fragment!r} in the log",
        )

    def finish(self, timeout: float = 10.0) -> str:
        """Everything the child wrote, once it has exited."""
        self._reader.join(timeout)
        return self.text()


def handled(log: Path) -> list[str]:
    """The lines cli_handlers.py wrote: one ``_id`` per handled event ("blocked" for a hung one)."""
    return log.read_text().split() if log.exists() else []


class FailCommand:
    """MongoDB's ``failCommand`` fail point, for the connector's commands only (its client's
    appName is "flowwarden"): ``fail_command(["getMore"], mode={"times": 1}, errorCode=6)``."""

    def __init__(self, client: pymongo.MongoClient[Any]) -> None:
        self._admin = client.admin
        self._fired_before = 0

    def __call__(self, commands: list[str], *, mode: Any, **data: Any) -> None:
        reply = self._admin.command(
            "configureFailPoint",
            "failCommand",
            mode=mode,
            data={"failCommands": commands, "appName": "flowwarden", **data},
        )
        # ``count`` is how often the fail point fired during the server's life so far.
        self._fired_before = int(reply["count"])

    def off(self) -> int:
        """Switch the fail point off; returns how many times it fired since it was set."""
        reply = self._admin.command("configureFailPoint", "failCommand", mode="off")
        return int(reply["count"]) - self._fired_before


@pytest.fixture
def fail_command(client: pymongo.MongoClient[Any]) -> Iterator[FailCommand]:
    """A :class:`FailCommand`, switched off after the test however it ended."""
    fail_point = FailCommand(client)
    try:
        yield fail_point
    finally:
        fail_point.off()


class PoisonDecimal(TypeDecoder):
    """Refuses to decode the amount 666, as a codec does with a value it cannot read."""

    bson_type = Decimal128

    def transform_bson(self, value: Decimal128) -> Decimal128:
        if value == Decimal128("666"):
            raise InvalidBSON("cannot decode the amount of this order")
        return value
