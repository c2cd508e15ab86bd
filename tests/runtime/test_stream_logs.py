"""Every line about a stream names it: each runtime module and the committer log under their own
module path, through an adapter that puts ``stream`` on the record, which the JSON format shows."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import flowwarden.runtime
from flowwarden import (
    ChangeEvent,
    OnError,
    Snapshot,
    StreamState,
    change_stream,
    checkpoint,
    on_change,
    retry_policy,
)
from flowwarden.cli.logs import JsonFormatter
from helpers import checkpoint_doc, running, wait_until

from .conftest import FailCommand

RUNTIME = Path(flowwarden.runtime.__file__).parent
# Modules whose lines are about the connector as a whole, not about one stream.
CONNECTOR_WIDE = {"flowwarden.runtime.connector"}
# Each module that logs about a stream, with the line the scenario below makes it write.
EXPECTED_MODULES = {
    "flowwarden.runtime.stream",  # stopped gracefully
    "flowwarden.runtime.opening",  # where it opens
    "flowwarden.runtime.ownership",  # the lease acquired
    "flowwarden.runtime.snapshot",  # the initial snapshot done
    "flowwarden.runtime.invoke",  # a handler retried
    "flowwarden.runtime.exhausted",  # an event skipped
    "flowwarden.runtime.restarts",  # re-opened after an error
    "flowwarden.runtime.dispatch",  # invalidated, restarting
    "flowwarden.runtime.observability",  # progress lines
    "flowwarden.checkpoints.committer",  # heartbeats
}


def orders_class(db: str, attempts: dict[Any, int]) -> type:
    @change_stream(
        "orders",
        db,
        name="orders",
        max_await_time_ms=50,
        deployment="single_leader",
        snapshot=Snapshot.INITIAL,
        on_invalidate="restart",
        restart_initial_delay_seconds=0.05,
        restart_max_delay_seconds=0.1,
    )
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    @retry_policy(
        max_attempts=2, initial_delay_seconds=0.01, max_delay_seconds=0.02, on_exhausted=OnError.SKIP
    )
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"] if event.document_key else None
            attempts[key] = attempts.get(key, 0) + 1
            if key == "always" or (key == "once" and attempts[key] == 1):
                raise ValueError(f"cannot handle {key} yet")

    return Orders


def test_every_line_of_the_runtime_and_the_committer_names_its_stream_in_json(
    mongodb_uri: str, client: Any, db_name: str, fail_command: FailCommand, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="flowwarden")
    orders = client[db_name]["orders"]
    orders.insert_one({"_id": "existing"})
    attempts: dict[Any, int] = {}
    with running(mongodb_uri, [orders_class(db_name, attempts)], progress_interval=0.1) as connector:
        wait_until(lambda: "existing" in attempts, what="the snapshot's row")
        orders.insert_many([{"_id": "once"}, {"_id": "always"}])
        wait_until(lambda: attempts.get("always") == 2 and attempts.get("once") == 2, what="retries")
        wait_until(lambda: (checkpoint_doc(client, db_name) or {}).get("eventsProcessed") == 2)
        # BadValue on the next getMore: no resumable label, so the stream re-opens itself.
        fail_command(["getMore"], mode={"times": 1}, errorCode=2)
        wait_until(lambda: connector.status()["orders"].restarts >= 1, what="a restart")
        orders.drop()
        wait_until(lambda: None in attempts, what="the invalidate event")
        orders.insert_one({"_id": "after"})
        wait_until(lambda: "after" in attempts, what="the insert after the invalidate")
        wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING, what="RUNNING")
        # Idle now: the committer's heartbeat says nothing finished since its last save.
        wait_until(lambda: any("heartbeat" in r.getMessage() for r in caplog.records), what="a heartbeat")
    formatter = JsonFormatter()
    lines = [
        json.loads(formatter.format(record))
        for record in caplog.records
        if record.name.startswith(("flowwarden.runtime.", "flowwarden.checkpoints."))
        and record.name not in CONNECTOR_WIDE
    ]
    unnamed = [line for line in lines if line.get("stream") != "orders"]
    assert not unnamed, f"lines without their stream: {unnamed[:5]}"
    assert EXPECTED_MODULES <= {line["logger"] for line in lines}, sorted({line["logger"] for line in lines})


def test_each_runtime_module_logs_about_a_stream_through_its_own_logger() -> None:
    """The rule the test above samples, held for every module: a stream's lines go through
    ``stream_logger(__name__, ...)``; a module-level logger only for connector-wide lines."""
    for path in sorted(RUNTIME.glob("*.py")):
        module = f"flowwarden.runtime.{path.stem}"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name == "stream_logger":
                first = node.args[0] if node.args else None
                assert isinstance(first, ast.Name) and first.id == "__name__", f"{module}:{node.lineno}"
            elif name == "getLogger":
                allowed = CONNECTOR_WIDE | {"flowwarden.runtime.observability", "flowwarden.runtime.context"}
                assert module in allowed, (
                    f"{module}:{node.lineno}: a stream's lines go through stream_logger(__name__, stream)"
                )
            elif name == "StreamLogger":
                assert module == "flowwarden.runtime.context", f"{module}:{node.lineno}"
