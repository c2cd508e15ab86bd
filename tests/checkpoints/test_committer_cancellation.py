"""CheckpointCommitter under cancellation: a cancelled caller ends cancelled, and a close that
gives up on a silent store leaves no task running and nothing for asyncio to report."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import pytest
from test_committer import GatedAsyncStore, RecordingStore, committer, settle, tok

from flowwarden.checkpoints import Checkpoint, SaveResult
from flowwarden.errors import CheckpointSaveFailedError


class HookedStore(GatedAsyncStore):
    """A gated async store that runs ``after_save`` inside a save, once the save is done."""

    after_save: Callable[[], None] | None = None

    async def save(self, checkpoint: Checkpoint) -> SaveResult:
        result = await super().save(checkpoint)
        if self.after_save is not None:
            self.after_save()
        return result


def loop_errors() -> list[dict[str, Any]]:
    """What the running loop's exception handler receives from now on."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    return errors


def timer_task() -> asyncio.Task[Any]:
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "flowwarden-checkpoint[orders]"]
    return task


async def test_close_giving_up_on_a_silent_store_stops_the_timer_and_leaves_nothing_to_report() -> None:
    errors = loop_errors()
    store = GatedAsyncStore()
    store.gate.clear()  # never opened
    c = committer(store, save_every_n=100, save_interval_seconds=0.01)
    timer = timer_task()
    await c.commit(1, tok(1))
    await asyncio.wait_for(store.started.wait(), 10)  # the heartbeat's save hangs
    assert await asyncio.wait_for(c.close(timeout=0.05), 10) is False
    await asyncio.wait_for(asyncio.wait({timer}), 10)
    assert timer.cancelled()
    await settle()
    gc.collect()
    await settle()
    assert errors == []


async def test_a_cancelled_close_abandons_its_save_and_ends_cancelled() -> None:
    errors = loop_errors()
    store = GatedAsyncStore()
    c = committer(store, save_every_n=100, save_interval_seconds=60)
    timer = timer_task()
    await c.commit(1, tok(1))
    store.gate.clear()
    closing = asyncio.create_task(c.close(timeout=None))
    await asyncio.wait_for(store.started.wait(), 10)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.wait_for(asyncio.wait({timer}), 10)
    shutdowns = [t for t in asyncio.all_tasks() if t.get_name() == "flowwarden-checkpoint-close[orders]"]
    await asyncio.wait_for(asyncio.gather(*shutdowns, return_exceptions=True), 10)
    await settle()
    gc.collect()
    await settle()
    assert errors == []
    assert store.inner.saved == []


async def test_a_commit_cancelled_while_its_save_waits_ends_cancelled_once_the_committer_failed() -> None:
    store = GatedAsyncStore()
    store.inner = RecordingStore(fail=lambda call: TypeError("cannot encode object"))  # fatal
    store.gate.clear()
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Task[None]] = []
    # The failure of the save in flight cancels the commit that waits for the next one.
    c = committer(store, save_every_n=1, on_save_error=lambda error, count: loop.call_soon(waiting[0].cancel))
    first = asyncio.create_task(c.commit(1, tok(1)))
    await asyncio.wait_for(store.started.wait(), 10)
    second = asyncio.create_task(c.commit(2, tok(2)))
    waiting.append(second)
    await settle()
    store.gate.set()
    with pytest.raises(CheckpointSaveFailedError):
        await asyncio.wait_for(first, 10)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(second, 10)
    assert isinstance(c.failure, CheckpointSaveFailedError)


@pytest.mark.parametrize("meanwhile", ["close", "interrupt"])
async def test_a_flush_cancelled_as_its_save_completes_ends_cancelled(meanwhile: str) -> None:
    store = HookedStore()
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    store.gate.clear()
    flush = asyncio.create_task(c.flush())
    await asyncio.wait_for(store.started.wait(), 10)
    loop = asyncio.get_running_loop()
    closing = None
    if meanwhile == "close":
        closing = asyncio.create_task(c.close(timeout=None))
        await settle()
        assert c.closed
    else:
        store.after_save = c.interrupt
    previous = store.after_save
    # Cancelled after its save finished and before it resumes: the save succeeded, yet the
    # caller was cancelled, and a cancelled caller must see CancelledError.
    store.after_save = lambda: (previous and loop.call_soon(previous), loop.call_soon(flush.cancel))
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(flush, 10)
    assert store.inner.saved == [1]
    if closing is not None:
        assert await asyncio.wait_for(closing, 10) is True
    else:
        assert await c.close() is True
