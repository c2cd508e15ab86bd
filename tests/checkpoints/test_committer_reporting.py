"""CheckpointCommitter: what it tells an operator: its errors, its log lines, its task names."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from test_committer import STREAM, GatedAsyncStore, RecordingStore, committer, tok

from flowwarden.checkpoints import Checkpoint, InMemoryCheckpointStore
from flowwarden.errors import CommitterClosedError, ConfigurationError, FencedError

LOGGER = "flowwarden.checkpoints.committer"


def logged(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    records = [r for r in caplog.records if r.name == LOGGER and r.levelno == level]
    # Each record carries the stream's name as a field (the JSON log format's "stream").
    assert [getattr(r, "stream", None) for r in records] == [STREAM] * len(records)
    return [r.getMessage() for r in records]


# -- construction --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "option", "value", "message"),
    [
        (
            {"save_every_n": -1},
            "save_every_n",
            -1,
            "CheckpointCommitter('orders'), option 'save_every_n': save_every_n=-1 is not accepted: "
            "Input should be greater than or equal to 0 (allowed: an int >= 0)",
        ),
        (
            {"max_consecutive_failures": 0},
            "max_consecutive_failures",
            0,
            "CheckpointCommitter('orders'), option 'max_consecutive_failures': must be >= 1",
        ),
        (
            {"initial": Checkpoint(stream_id="other")},
            "initial",
            None,
            "CheckpointCommitter('orders'), option 'initial': initial checkpoint belongs to stream 'other'",
        ),
    ],
)
async def test_a_refused_option_names_the_committer_the_option_and_the_value(
    options: dict[str, Any], option: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        committer(InMemoryCheckpointStore(), **options)
    error = raised.value
    assert (error.owner, error.option, error.value) == ("CheckpointCommitter('orders')", option, value)
    assert str(error) == message


def test_created_outside_an_event_loop_it_says_why_it_needs_one() -> None:
    with pytest.raises(RuntimeError) as raised:
        committer(InMemoryCheckpointStore())
    assert str(raised.value) == (
        "CheckpointCommitter must be created inside a running event loop (it starts its save timer there)"
    )


async def test_close_gives_up_on_a_silent_store_after_10_seconds_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Waiting 10 s to see it would prove nothing more: the wait close() makes says it.
    timeouts: list[float | None] = []
    wait = asyncio.wait

    async def recorded(tasks: Any, *, timeout: float | None = None, **options: Any) -> Any:
        timeouts.append(timeout)
        return await wait(tasks, timeout=timeout, **options)

    c = committer(RecordingStore())
    monkeypatch.setattr(asyncio, "wait", recorded)
    assert await c.close() is True
    assert 10.0 in timeouts


# -- failures --------------------------------------------------------------------------------------


async def test_a_failed_save_is_logged_with_the_stream_the_count_and_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RecordingStore(fail=lambda call: OSError("connection reset") if call <= 2 else None)
    c = committer(store)
    caplog.set_level(logging.WARNING, LOGGER)
    await c.commit(1, tok(1))
    await c.commit(2, tok(2))
    assert logged(caplog, logging.WARNING) == [
        "stream 'orders': checkpoint save failed (1 in a row, retried at the next trigger): "
        "OSError: connection reset",
        "stream 'orders': checkpoint save failed (2 in a row, retried at the next trigger): "
        "OSError: connection reset",
    ]
    await c.close()


async def test_the_failure_that_stops_the_committer_names_the_stream_and_keeps_its_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failure = OSError("connection reset")
    store = RecordingStore(fail=lambda call: failure)
    c = committer(store, max_consecutive_failures=1)
    caplog.set_level(logging.WARNING, LOGGER)
    with pytest.raises(Exception) as raised:
        await c.commit(1, tok(1))
    error = raised.value
    assert error is c.failure is c.failed.result()
    assert (error.stream, error.__cause__) == (STREAM, failure)  # type: ignore[attr-defined]
    assert logged(caplog, logging.ERROR) == [
        "stream 'orders': checkpoint committer failed: stream 'orders': 1 consecutive checkpoint saves "
        "failed (last: OSError: connection reset). The stream stops so it does not run without a "
        "durable position; fix the checkpoint store and restart."
    ]
    assert logged(caplog, logging.WARNING) == []
    with pytest.raises(Exception) as again:
        await c.commit(2, tok(2))
    assert again.value.__cause__ is failure


async def test_a_fenced_committer_logs_the_fencing_error(caplog: pytest.LogCaptureFixture) -> None:
    store = RecordingStore()
    store.save(Checkpoint(stream_id=STREAM, last_processed_token=tok(0), epoch=5))
    c = committer(store, epoch=4)
    caplog.set_level(logging.WARNING, LOGGER)
    with pytest.raises(FencedError) as raised:
        await c.commit(1, tok(1))
    assert logged(caplog, logging.ERROR) == [f"stream 'orders': checkpoint committer failed: {raised.value}"]


async def test_a_raising_error_callback_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def callback(error: BaseException, count: int) -> None:
        raise RuntimeError("callback bug")

    store = RecordingStore(fail=lambda call: OSError("connection reset") if call == 1 else None)
    c = committer(store, on_save_error=callback)
    caplog.set_level(logging.WARNING, LOGGER)
    await c.commit(1, tok(1))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["stream 'orders': on_save_error callback raised"]
    assert errors[0].exc_info is not None and str(errors[0].exc_info[1]) == "callback bug"
    await c.close()


# -- close -----------------------------------------------------------------------------------------


async def test_a_failed_final_save_at_close_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = RecordingStore(fail=lambda call: OSError("connection reset"))
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    caplog.set_level(logging.WARNING, LOGGER)
    assert await c.close() is False
    assert logged(caplog, logging.WARNING)[-1] == (
        "stream 'orders': final checkpoint save at close failed: OSError: connection reset"
    )


async def test_a_store_silent_at_close_is_logged_with_what_stays_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = GatedAsyncStore()
    c = committer(store, save_every_n=2, save_interval_seconds=60)
    await c.commit(1, tok(1))
    await c.commit(2, tok(2))
    await c.commit(3, tok(3))
    store.gate.clear()  # the final save hangs
    caplog.set_level(logging.WARNING, LOGGER)
    assert await asyncio.wait_for(c.close(timeout=0.05), 10) is False
    assert logged(caplog, logging.WARNING) == [
        "stream 'orders': checkpoint store did not answer within 0.05s at close; the save in progress "
        "was abandoned. Stored position: sequence 2 of frontier 3."
    ]


async def test_a_commit_after_close_is_refused_naming_the_stream() -> None:
    c = committer(RecordingStore())
    await c.close()
    with pytest.raises(CommitterClosedError) as raised:
        await c.commit(1, tok(1))
    assert raised.value.stream == STREAM
    assert str(raised.value) == "stream 'orders': commit after the checkpoint committer was closed"


async def test_the_committers_tasks_are_named_after_their_stream() -> None:
    store = GatedAsyncStore()
    c = committer(store, save_every_n=100, save_interval_seconds=60)
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert "flowwarden-checkpoint[orders]" in names
    await c.commit(1, tok(1))
    store.gate.clear()
    closing = asyncio.create_task(c.close())
    await asyncio.wait_for(store.started.wait(), 10)
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert "flowwarden-checkpoint-close[orders]" in names
    store.gate.set()
    assert await closing is True
