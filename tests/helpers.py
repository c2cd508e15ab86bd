"""Helpers every test folder shares: waiting with a deadline, reading a stored checkpoint, a
connector running for the length of a block, its /metrics scraped (and the events they counted),
and a command's one-line error.

Import them as ``from helpers import ...`` (tests/ is on the path of every test module).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from flowwarden import Connector


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """``predicate()``'s first truthy value; fails naming ``what`` once ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value


async def wait_until_async(
    predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition"
) -> Any:
    """:func:`wait_until` for tests running on an event loop (a connector sharing the loop)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
    return value


def complete_lines(log: Path) -> list[str]:
    """The non-empty lines of a file another process appends to, up to its last newline: a read
    while it writes, or after it was killed, may end in the middle of a line."""
    text = log.read_text() if log.exists() else ""
    return [line for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def checkpoint_doc(client: Any, db: str, stream: str = "orders") -> dict[str, Any] | None:
    """The stored checkpoint record of ``stream`` in ``db``'s ``_fw_checkpoints``."""
    document: dict[str, Any] | None = client[db]["_fw_checkpoints"].find_one({"_id": stream})
    return document


@contextmanager
def running(uri: str, handlers: list[type], **kwargs: Any) -> Iterator[Connector]:
    """A connector started in this process, stopped (gracefully) when the block ends."""
    connector = Connector(uri, handlers, **kwargs)
    connector.start()
    try:
        yield connector
    finally:
        connector.stop(timeout=30)


def flowwarden_command(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
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


# A log line of the text format: "2026-01-02 03:04:05,678 INFO flowwarden.runtime...: ..."
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")


def one_error_line(stderr: str, *, logged: bool = False) -> str:
    """The one line a failed command printed, starting with ``flowwarden: ``, and no traceback.

    Nothing else may be on stderr, except log lines when ``logged`` (``flowwarden run`` logs
    what its streams did before it ends with the line).
    """
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    errors = [line for line in lines if line.startswith("flowwarden: ")]
    others = [line for line in lines if not line.startswith("flowwarden: ")]
    assert len(errors) == 1, stderr
    assert not others or (logged and all(_LOG_LINE.match(line) for line in others)), stderr
    return errors[0]


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""A scrape of /metrics: (sample name, its labels) -> value."""


def get(connector: Connector, path: str) -> tuple[int, bytes]:
    """GET ``path`` from the connector's metrics server: (status, body), errors included."""
    address = connector.metrics_address
    assert address is not None, "the connector serves no metrics: start it with metrics_port=0"
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def samples(connector: Connector) -> Samples:
    """``/metrics`` parsed as Prometheus parses it."""
    status, body = get(connector, "/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` with exactly ``labels``; None when it is not there."""
    return found.get((name, frozenset(labels.items())))


def events_counted(connector: Connector) -> dict[tuple[str, str], float]:
    """``flowwarden_events_total`` of a connector serving metrics (``metrics_port=0``):
    (operation, outcome) -> events, zeros left out."""
    counted = {}
    for (name, labels), number in samples(connector).items():
        if name == "flowwarden_events_total" and number:
            labelled = dict(labels)
            counted[(labelled["operation"], labelled["outcome"])] = number
    return counted
