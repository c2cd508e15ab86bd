"""CheckpointCommitter for batch handlers and stopping streams: commit_through, save_batch_end and
interrupt."""

from __future__ import annotations

import asyncio

import pytest
from test_committer import STREAM, GatedAsyncStore, RecordingStore, committer, tok

from flowwarden.errors import CheckpointError, CheckpointSaveFailedError, CommitterClosedError, FencedError

# -- commit_through ------------------------------------------------------------------------------


async def test_a_batch_committed_through_its_end_moves_the_frontier_there_in_one_step() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100)
    await c.commit_through(5, tok(5))
    assert (c.frontier_sequence, c.frontier_token, c.unsaved) == (5, tok(5), 5)
    await c.flush()
    assert store.saved == [5]
    assert store.stored_sequence() == 5
    await c.close()


async def test_a_batch_reaching_the_save_count_is_saved_before_commit_through_returns() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=3, save_interval_seconds=60)
    await c.commit_through(2, tok(2))
    assert store.saved == []
    await c.commit_through(3, tok(3))
    assert store.saved == [3]
    await c.commit_through(5, tok(5))
    assert store.saved == [3], "the next count save is at 6"
    await c.close()


async def test_commit_through_at_or_below_the_frontier_changes_nothing() -> None:
    store = RecordingStore()
    c = committer(store)
    await c.commit_through(4, tok(4))
    calls = store.calls
    await c.commit_through(4, tok(9))
    await c.commit_through(3, tok(9))
    assert (c.frontier_sequence, c.frontier_token) == (4, tok(4))
    assert store.calls == calls
    await c.close()


async def test_commit_through_drops_the_completions_it_covers_up_to_its_end() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100)
    await c.commit(3, tok(3))
    await c.commit(5, tok(5))
    assert c.pending == 2
    c.observe_seen(tok(6))  # dropped: completions wait past a gap
    await c.commit_through(5, tok(5))
    assert c.pending == 0, "5 is the batch's end: covered too"
    # Nothing waits past a gap any more, so an idle position is accepted again.
    c.observe_seen(tok(7))
    await c.close()
    assert (store.saved, store.seen) == ([5], [7])


async def test_commit_through_after_close_is_refused() -> None:
    c = committer(RecordingStore())
    await c.close()
    with pytest.raises(CommitterClosedError):
        await c.commit_through(1, tok(1))


# -- save_batch_end ------------------------------------------------------------------------------


async def test_save_batch_end_stores_the_batch_end_with_the_streams_epoch() -> None:
    store = RecordingStore()
    c = committer(store, epoch=3)
    await c.save_batch_end(tok(7))
    loaded = store.load(STREAM)
    assert loaded is not None
    assert (loaded.batch_end_token, loaded.epoch) == (tok(7), 3)
    assert (c.saves, c.consecutive_failures) == (1, 0)
    await c.close()


async def test_a_fenced_save_batch_end_raises_and_fails_the_committer() -> None:
    store = RecordingStore()
    store.save_seen(STREAM, tok(1), 5)
    c = committer(store, epoch=4)
    with pytest.raises(FencedError):
        await c.save_batch_end(tok(7))
    assert isinstance(c.failure, FencedError)
    with pytest.raises(FencedError):
        await c.save_batch_end(tok(8))


async def test_a_failed_save_batch_end_is_counted_reported_and_raised() -> None:
    errors: list[tuple[BaseException, int]] = []
    store = GatedAsyncStore()
    failure = CheckpointError("primary stepped down")

    async def failing(stream_id: str, token: object, epoch: int) -> object:
        raise failure

    store.save_batch_end = failing  # type: ignore[attr-defined]
    c = committer(store, on_save_error=lambda error, count: errors.append((error, count)))
    with pytest.raises(CheckpointError) as raised:
        await c.save_batch_end(tok(7))
    assert raised.value is failure
    assert errors == [(failure, 1)]
    assert (c.save_failures, c.failure) == (1, None)
    await c.close()


async def test_a_save_batch_end_failure_that_fails_the_committer_raises_that_failure() -> None:
    store = GatedAsyncStore()
    failure = CheckpointError("primary stepped down")

    async def failing(stream_id: str, token: object, epoch: int) -> object:
        raise failure

    store.save_batch_end = failing  # type: ignore[attr-defined]
    c = committer(store, max_consecutive_failures=1)
    with pytest.raises(CheckpointSaveFailedError) as raised:
        await c.save_batch_end(tok(7))
    assert raised.value is c.failure
    assert raised.value.__cause__ is failure
    with pytest.raises(CheckpointSaveFailedError):
        await c.save_batch_end(tok(8))
    assert await c.close() is False


async def test_save_batch_end_after_close_is_refused() -> None:
    c = committer(RecordingStore())
    await c.close()
    with pytest.raises(CommitterClosedError):
        await c.save_batch_end(tok(1))


# -- interrupt -----------------------------------------------------------------------------------


async def test_interrupt_releases_a_commit_waiting_for_a_hung_count_save() -> None:
    store = GatedAsyncStore()
    store.gate.clear()
    c = committer(store, save_every_n=1, save_interval_seconds=60)
    stuck = asyncio.create_task(c.commit(1, tok(1)))
    await asyncio.wait_for(store.started.wait(), 10)
    c.interrupt()
    await asyncio.wait_for(stuck, 10)  # returns: the event was handled, its position is unsaved
    assert (c.frontier_sequence, c.saved_sequence) == (1, 0)
    # Later count saves are not even tried: the stream is stopping.
    store.started.clear()
    await c.commit(2, tok(2))
    assert not store.started.is_set()
    assert c.failure is None
    store.gate.set()
    assert await c.close() is True
    assert store.inner.saved == [2], "close tries once more"


async def test_after_interrupt_flush_and_save_batch_end_refuse_to_pretend_they_saved() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    c.interrupt()
    for call in (c.flush, lambda: c.save_batch_end(tok(1))):
        with pytest.raises(CommitterClosedError) as raised:
            await call()
        assert raised.value.stream == STREAM
        assert str(raised.value) == (
            "stream 'orders': the checkpoint save was abandoned because the stream is stopping"
        )
    assert store.calls == 0
    await c.close()


async def test_interrupt_abandons_a_flush_waiting_for_a_hung_store() -> None:
    store = GatedAsyncStore()
    store.gate.clear()
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    flush = asyncio.create_task(c.flush())
    await asyncio.wait_for(store.started.wait(), 10)
    c.interrupt()
    with pytest.raises(CommitterClosedError, match="abandoned because the stream is stopping"):
        await asyncio.wait_for(flush, 10)
    store.gate.set()
    await c.close()


async def test_interrupt_with_no_save_in_flight_is_harmless() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=1)
    await c.commit(1, tok(1))  # its save finished: nothing is awaited any more
    c.interrupt()
    c.interrupt()
    assert await c.close() is True
    assert store.saved == [1]
