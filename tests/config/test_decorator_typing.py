"""What a type checker makes of the decorators: ``mypy --strict`` accepts the documented uses,
keeps the decorated classes and methods their types, and reports a misspelt option, a value of
the wrong type or kind, and options given by position, on the line that has them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flowwarden

pytest.importorskip("mypy")

CORRECT = '''
from __future__ import annotations

from datetime import datetime, timezone

import pydantic
from typing_extensions import assert_type

from flowwarden import (
    ChangeEvent, Deployment, OnError, OnHistoryLost, OnInvalidate, SchemaMode, Snapshot, StartPosition,
    StreamContext, change_stream, checkpoint, dead_letter_queue, event_filter, on_batch, on_change,
    on_dataframe, on_insert, on_snapshot, on_update, pipeline, retry_policy,
)
from flowwarden.checkpoints import InMemoryCheckpointStore


class Order(pydantic.BaseModel):
    sku: str


@change_stream(
    "orders", "shop", name="orders-v2", full_document="updateLookup", operation_types=["insert", "update"],
    deployment="single_leader", on_invalidate=OnInvalidate.RESTART, snapshot=Snapshot.INITIAL,
    max_restarts=None, batch_size=500, lease_ttl_seconds=10, show_expanded_events=False,
)
@checkpoint(
    save_every_n=100, save_interval_seconds=5, start_position=StartPosition.AT_TIME,
    start_at=datetime(2024, 1, 1, tzinfo=timezone.utc), on_history_lost="RESUME_FROM_NOW",
    store=InMemoryCheckpointStore(),
)
@pipeline([{"$match": {"operationType": {"$in": ["insert", "update"]}}}])
@retry_policy(
    max_attempts=3, retry_on=(ValueError, KeyError), no_retry_on=TypeError, on_exhausted=OnError.DEAD_LETTER
)
@dead_letter_queue(retention_days=30, collection="poison")
class Orders:
    @on_insert
    @on_update
    def upserted(self, event: ChangeEvent) -> None: ...

    @on_snapshot
    async def copied(self, event: ChangeEvent, ctx: StreamContext) -> None: ...

    @on_change()
    def other(self, event: ChangeEvent) -> None: ...


@change_stream
@checkpoint
@retry_policy
@dead_letter_queue
class Everything:
    @on_batch
    def handle(self, events: list[ChangeEvent]) -> int:
        return len(events)


@change_stream(database="shop", deployment=Deployment.SINGLE_LEADER)
@checkpoint(on_history_lost=OnHistoryLost.FAIL, start_position="LATEST")
class Frames:
    @on_dataframe(max_events=10, schema=Order, mode="FAILFAST")
    def frame(self, df: object, ctx: StreamContext) -> None: ...

    @on_batch(max_events=5, max_wait_seconds=0.5)
    async def batch(self, events: list[ChangeEvent]) -> None: ...


@change_stream(collection="orders", database="shop")
class Modes:
    @on_dataframe(mode=SchemaMode.DROPMALFORMED)
    def frame(self, df: object) -> None: ...


@change_stream(
    database="shop", collections=["orders", "re:inv.*"], exclude_collections=("tmp",),
    exclude_fields=["ssn"], hash_fields={"email"}, hash_salt_env="SHOP_SALT",
)
class Filtered:
    @event_filter
    def keep(self, event: ChangeEvent) -> bool:
        return event.collection != "audit"

    @on_insert
    def created(self, event: ChangeEvent) -> None: ...


assert_type(Orders(), Orders)
assert_type(Filtered().keep(ChangeEvent({})), bool)
assert_type(Everything(), Everything)
assert_type(Everything().handle([]), int)
assert_type(Frames(), Frames)
assert_type(Modes(), Modes)
'''

# Each misuse, its first line the call mypy must flag, and what mypy must say about that line.
MISUSES: list[tuple[str, str]] = [
    (
        '@change_stream(colection="orders", database="shop")\nclass Misspelt: ...',
        'Unexpected keyword argument "colection" for overloaded function "change_stream"; '
        'did you mean "collection"',
    ),
    (
        '@checkpoint(save_every_n="100")\nclass WrongType: ...',
        'No overload variant of "checkpoint" matches argument type "str"',
    ),
    (
        '@checkpoint(100, 5.0, "LATEST")\nclass ByPosition: ...',
        'No overload variant of "checkpoint" matches argument types "int", "float", "str"',
    ),
    (
        '@change_stream("orders", "shop", "orders-v2")\nclass ThirdByPosition: ...',
        'No overload variant of "change_stream" matches argument types "str", "str", "str"',
    ),
    (
        '@change_stream("orders", "shop", full_document="updatelookup")\nclass NotAChoice: ...',
        'No overload variant of "change_stream" matches argument types "str", "str", "str"',
    ),
    (
        '@change_stream(database="shop", operation_types=["insert", "upsert"])\nclass NoSuchType: ...',
        "List item 1 has incompatible type \"Literal['upsert']\"",
    ),
    (
        '@change_stream(database="shop", operation_types="insert")\nclass OneType: ...',
        'Argument "operation_types" to "change_stream" has incompatible type "str"',
    ),
    (
        '@retry_policy(on_exhausted="RETRY")\nclass NotAnOutcome: ...',
        'No overload variant of "retry_policy" matches argument type "str"',
    ),
    (
        '@retry_policy(retry_on=[ValueError, "KeyError"])\nclass NotAnError: ...',
        'List item 1 has incompatible type "str"; expected "type[Exception]"',
    ),
    (
        '@pipeline(stage=[{"$match": {}}])\nclass PipelineMisspelt: ...',
        'Unexpected keyword argument "stage" for "pipeline"; did you mean "stages"?',
    ),
    (
        "@on_dataframe(max_event=10)\ndef frame(self: object, df: object) -> None: ...",
        'Unexpected keyword argument "max_event" for overloaded function "on_dataframe"; '
        'did you mean "max_events"?',
    ),
    (
        "@on_batch(100)\ndef batch(self: object, events: object) -> None: ...",
        'No overload variant of "on_batch" matches argument type "int"',
    ),
]


def misuses_module() -> tuple[str, dict[int, str]]:
    """The misuses as one module, and the line of each -> what mypy must say there."""
    lines = [
        "from __future__ import annotations",
        "",
        "from flowwarden import change_stream, checkpoint, on_batch, on_dataframe, pipeline, retry_policy",
    ]
    expected = {}
    for code, message in MISUSES:
        lines += ["", ""]
        expected[len(lines) + 1] = message
        lines += code.splitlines()
    return "\n".join(lines) + "\n", expected


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, str]]]:
    """mypy --strict on both snippets, once: file name -> [(line, error message)].

    The tree under test comes first on the search path; errors inside flowwarden itself are not
    the snippets' and are silenced, as they are for an installed flowwarden.
    """
    folder = tmp_path_factory.mktemp("typing")
    (folder / "correct.py").write_text(CORRECT)
    (folder / "misuses.py").write_text(misuses_module()[0])
    search = [str(Path(flowwarden.__file__).resolve().parents[1])]
    try:
        import flowwarden_embedded

        search.append(str(Path(flowwarden_embedded.__file__).resolve().parents[1]))
    except ImportError:
        pass
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--show-error-codes",
            "--no-pretty",
            "--cache-dir",
            str(folder / ".mypy_cache"),
            "correct.py",
            "misuses.py",
        ],
        cwd=folder,
        env={**os.environ, "MYPYPATH": os.pathsep.join(search)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    errors: dict[str, list[tuple[int, str]]] = {"correct.py": [], "misuses.py": []}
    for line in result.stdout.splitlines():
        match = re.match(r"(correct\.py|misuses\.py):(\d+): error: (.*)", line)
        if match:
            errors[match[1]].append((int(match[2]), match[3]))
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert errors["misuses.py"], "mypy reported nothing: " + result.stdout + result.stderr
    return errors


def test_documented_uses_type_check_clean_and_keep_their_types(
    mypy_output: dict[str, list[tuple[int, str]]],
) -> None:
    assert mypy_output["correct.py"] == []


@pytest.mark.parametrize(
    ("line", "message"), misuses_module()[1].items(), ids=[code.split("\n")[0] for code, _ in MISUSES]
)
def test_each_misuse_is_reported_on_its_line(
    mypy_output: dict[str, list[tuple[int, str]]], line: int, message: str
) -> None:
    said = [text for number, text in mypy_output["misuses.py"] if number == line]
    assert any(message in text for text in said), f"line {line}: expected {message!r}, mypy said {said}"


def test_nothing_else_is_reported(mypy_output: dict[str, list[tuple[int, str]]]) -> None:
    flagged = misuses_module()[1]
    assert [(line, text) for line, text in mypy_output["misuses.py"] if line not in flagged] == []
