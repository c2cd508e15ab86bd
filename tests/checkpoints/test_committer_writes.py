"""CheckpointCommitter: what each write carries, and the writes it does not make."""

from __future__ import annotations

import time

import pytest
from test_committer import STREAM, RecordingStore, committer, tok

from flowwarden.checkpoints import Checkpoint
from flowwarden.errors import CheckpointError, CheckpointSaveFailedError


async def test_a_committer_without_an_epoch_writes_epoch_0() -> None:
    store = RecordingStore()
    c = committer(store)
    await c.commit(1, tok(1))
    loaded = store.load(STREAM)
    assert loaded is not None and loaded.epoch == 0
    await c.close()


async def test_the_saved_checkpoint_carries_the_connectors_instance_token() -> None:
    store = RecordingStore()
    c = committer(store, instance_id="host:7", instance_token="3f2a")
    await c.commit(1, tok(1))
    loaded = store.load(STREAM)
    assert loaded is not None and (loaded.instance_id, loaded.instance_token) == ("host:7", "3f2a")
    await c.close()


async def test_before_the_first_commit_there_is_no_frontier_token_and_the_committer_is_open() -> None:
    c = committer(RecordingStore())
    assert (c.frontier_sequence, c.frontier_token, c.last_saved_token) == (0, None, None)
    assert c.closed is False
    await c.close()
    assert c.closed is True


async def test_a_flush_with_nothing_new_writes_nothing() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    c.observe_seen(tok(2))
    await c.flush()
    calls = store.calls
    await c.flush()
    c.observe_seen(dict(tok(2)))  # the same position again, as another object
    await c.flush()
    assert store.calls == calls
    assert (store.saved, store.seen) == ([1], [2])
    await c.close()


async def test_the_initial_checkpoints_seen_token_is_not_written_again() -> None:
    store = RecordingStore()
    initial = Checkpoint(stream_id=STREAM, last_processed_token=tok(1), last_seen_token=tok(4))
    store.save(initial)
    store.save_seen(STREAM, tok(4), 0)
    calls = store.calls
    c = committer(store, save_every_n=100, initial=initial)
    assert initial.last_seen_token is not None
    c.observe_seen(initial.last_seen_token)
    assert await c.close() is True
    assert store.calls == calls


async def test_an_initial_seen_token_and_no_new_one_close_cleanly() -> None:
    store = RecordingStore()
    initial = Checkpoint(stream_id=STREAM, last_processed_token=tok(1), last_seen_token=tok(4))
    c = committer(store, save_every_n=100, initial=initial)
    await c.commit(1, tok(5))
    assert await c.close() is True
    assert (c.save_failures, store.saved, store.seen) == (0, [5], [])


async def test_a_failed_seen_write_is_reported_and_retried_like_a_failed_save() -> None:
    errors: list[tuple[BaseException, int]] = []
    failure = CheckpointError("primary stepped down")
    store = RecordingStore(fail=lambda call: failure if call == 1 else None)
    c = committer(store, save_every_n=100, on_save_error=lambda error, count: errors.append((error, count)))
    c.observe_seen(tok(3))
    with pytest.raises(CheckpointError):
        await c.flush()
    assert errors == [(failure, 1)]
    assert c.failure is None
    await c.flush()
    assert store.seen == [3]
    await c.close()


async def test_after_a_failed_count_save_the_next_try_is_save_every_n_advances_later() -> None:
    store = RecordingStore(fail=lambda call: OSError("connection reset") if call == 1 else None)
    c = committer(store, save_every_n=3, save_interval_seconds=60)
    for sequence in range(1, 6):
        await c.commit(sequence, tok(sequence))
    assert (store.calls, store.saved) == (1, []), "no retry on every commit after a failure"
    await c.commit(6, tok(6))
    assert (store.calls, store.saved) == (2, [6])
    await c.close()


async def test_by_default_the_tenth_failure_in_a_row_fails_the_committer() -> None:
    store = RecordingStore(fail=lambda call: OSError("connection reset"))
    c = committer(store)
    for sequence in range(1, 10):
        await c.commit(sequence, tok(sequence))
    assert (c.consecutive_failures, c.failure) == (9, None)
    with pytest.raises(CheckpointSaveFailedError) as raised:
        await c.commit(10, tok(10))
    assert raised.value.failures == 10


async def test_one_allowed_failure_means_the_first_failure_is_fatal() -> None:
    store = RecordingStore(fail=lambda call: OSError("connection reset"))
    c = committer(store, max_consecutive_failures=1)
    with pytest.raises(CheckpointSaveFailedError) as raised:
        await c.commit(1, tok(1))
    assert raised.value.failures == 1


async def test_a_flush_whose_failure_fails_the_committer_raises_that_failure() -> None:
    failure = OSError("connection reset")
    store = RecordingStore(fail=lambda call: failure)
    c = committer(store, save_every_n=100, max_consecutive_failures=1)
    await c.commit(1, tok(1))
    with pytest.raises(CheckpointSaveFailedError) as raised:
        await c.flush()
    assert raised.value is c.failure
    assert raised.value.__cause__ is failure


async def test_on_saved_hears_how_long_each_successful_write_took() -> None:
    durations: list[float] = []
    store = RecordingStore(fail=lambda call: OSError("connection reset") if call == 2 else None)
    c = committer(store, save_every_n=100, on_saved=durations.append)
    await c.commit(1, tok(1))
    began = time.perf_counter()
    await c.flush()  # the processed position
    c.observe_seen(tok(2))
    with pytest.raises(OSError):
        await c.flush()  # the seen token: fails, nothing to hear
    await c.flush()  # the seen token again
    elapsed = time.perf_counter() - began
    assert len(durations) == 2
    assert all(0 <= duration <= elapsed for duration in durations)
    await c.close()
