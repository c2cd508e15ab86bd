"""CheckpointCommitter: gap tracking, save triggers, failures, flush and close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flowwarden.checkpoints import (
    Checkpoint,
    CheckpointCommitter,
    InMemoryCheckpointStore,
    SaveResult,
    is_retryable_save_error,
)
from flowwarden.checkpoints.contract import sample_token
from flowwarden.errors import (
    CheckpointError,
    CheckpointSaveFailedError,
    CommitterClosedError,
    ConfigurationError,
    FencedError,
)
from flowwarden.events import ResumeToken

STREAM = "orders"


def tok(sequence: int) -> dict[str, Any]:
    """The token of the event with this sequence number."""
    return sample_token(1_700_000_000 + sequence, 1)


def seq_of(token: ResumeToken | None) -> int | None:
    if token is None:
        return None
    return int(token["_data"][2:10], 16) - 1_700_000_000


class RecordingStore(InMemoryCheckpointStore):
    """The in-memory store, recording each call; ``failures`` says which saves raise."""

    def __init__(self, *, fail: Callable[[int], BaseException | None] | None = None) -> None:
        super().__init__()
        self.saved: list[int | None] = []
        self.seen: list[int | None] = []
        self.calls = 0
        self.threads: set[int] = set()
        self._fail = fail
        # Set after every call, from whichever thread made it, so tests wait on it, not on time.
        self.changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def _signal(self) -> None:
        self._loop.call_soon_threadsafe(self.changed.set)

    def _maybe_fail(self) -> None:
        self._signal()
        self.calls += 1
        self.threads.add(threading.get_ident())
        if self._fail is not None:
            error = self._fail(self.calls)
            if error is not None:
                raise error

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        self._maybe_fail()
        result = super().save(checkpoint)
        if result is SaveResult.STORED:
            self.saved.append(seq_of(checkpoint.last_processed_token))
        self._signal()
        return result

    def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        self._maybe_fail()
        result = super().save_seen(stream_id, token, epoch)
        if result is SaveResult.STORED:
            self.seen.append(seq_of(token))
        self._signal()
        return result

    def stored_sequence(self) -> int | None:
        loaded = self.load(STREAM)
        return None if loaded is None else seq_of(loaded.last_processed_token)


class BlockingStore(RecordingStore):
    """The same store declared blocking: the committer must call it from a worker thread."""

    nonblocking = False


class GatedAsyncStore:
    """An async store whose saves wait at a gate the test opens; tracks concurrent saves."""

    def __init__(self) -> None:
        self.inner = RecordingStore()
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_save = 0
        self.max_in_save = 0
        self.started = asyncio.Event()

    async def load(self, stream_id: str) -> Checkpoint | None:
        return self.inner.load(stream_id)

    async def save(self, checkpoint: Checkpoint) -> SaveResult:
        self.in_save += 1
        self.max_in_save = max(self.max_in_save, self.in_save)
        self.started.set()
        try:
            await self.gate.wait()
            return self.inner.save(checkpoint)
        finally:
            self.in_save -= 1

    async def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return self.inner.save_seen(stream_id, token, epoch)

    async def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return self.inner.save_batch_end(stream_id, token, epoch)

    async def delete(self, stream_id: str) -> bool:
        return self.inner.delete(stream_id)

    async def list(self) -> list[Checkpoint]:
        return self.inner.list()

    async def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        self.inner.rewind(stream_id, token)


async def settle(rounds: int = 20) -> None:
    """Let every ready task run (the saver task takes a few steps per save)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def eventually(store: RecordingStore, predicate: Callable[[], bool], limit: float = 10.0) -> None:
    """Wait until ``predicate`` holds, re-checking after each store call.

    ``limit`` only turns a hang into a failure; nothing here measures speed.
    """

    async def wait() -> None:
        while not predicate():
            store.changed.clear()
            if predicate():
                return
            await store.changed.wait()

    try:
        await asyncio.wait_for(wait(), limit)
    except asyncio.TimeoutError:
        raise AssertionError(f"the awaited condition did not hold within {limit}s") from None


def committer(store: Any, **options: Any) -> CheckpointCommitter:
    options.setdefault("save_every_n", 0)
    options.setdefault("save_interval_seconds", 0)
    return CheckpointCommitter(store, STREAM, **options)


# -- gap tracking ------------------------------------------------------------------------------


async def test_completions_2_3_1_save_nothing_until_1_then_3() -> None:
    store = RecordingStore()
    c = committer(store)
    await c.commit(2, tok(2))
    await c.commit(3, tok(3))
    assert store.saved == []
    assert (c.frontier_sequence, c.pending) == (0, 2)
    await c.commit(1, tok(1))
    assert store.saved == [3]
    assert (c.frontier_sequence, c.saved_sequence, c.pending) == (3, 3, 0)
    assert c.last_saved_token == tok(3)
    await c.close()


async def test_completions_1_2_4_then_3() -> None:
    store = RecordingStore()
    c = committer(store)
    for sequence in (1, 2, 4):
        await c.commit(sequence, tok(sequence))
    assert store.saved == [1, 2]
    assert c.pending == 1
    await c.commit(3, tok(3))
    assert store.saved == [1, 2, 4]
    assert c.pending == 0
    await c.close()


async def test_a_batch_commit_joins_completions_committed_past_it() -> None:
    """Events after a batch (left out by a filter) complete before the batch does: once the
    batch is committed through its end, the frontier moves on over them."""
    store = RecordingStore()
    c = committer(store)
    await c.commit(4, tok(4))  # inside the batch: covered by its commit
    await c.commit(6, tok(6))
    await c.commit(7, tok(7))
    await c.commit(9, tok(9))  # past a gap: stays pending
    assert store.saved == []
    await c.commit_through(5, tok(5))
    assert (c.frontier_sequence, c.pending) == (7, 1)
    assert store.saved == [7] and c.last_saved_token == tok(7)
    await c.close()


async def test_duplicate_commits_are_harmless() -> None:
    store = RecordingStore()
    c = committer(store)
    await c.commit(1, tok(1))
    await c.commit(1, tok(1))
    await c.commit(3, tok(3))
    await c.commit(3, tok(3))
    assert c.pending == 1
    await c.commit(2, tok(2))
    await c.commit(2, tok(2))
    await c.commit(1, tok(1))
    assert store.saved == [1, 3]
    assert (c.frontier_sequence, c.pending, c.saves) == (3, 0, 2)
    await c.close()


async def test_memory_stays_bounded_as_gaps_close() -> None:
    c = committer(InMemoryCheckpointStore(), save_every_n=1000, save_interval_seconds=0)
    for window in range(0, 4000, 8):
        for sequence in range(window + 8, window, -1):  # each window completes in reverse
            await c.commit(sequence, tok(sequence))
        assert c.pending == 0
    assert c.frontier_sequence == 4000
    await c.close()


# -- save triggers -------------------------------------------------------------------------------


async def test_every_n_saves_at_the_boundaries() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=3)
    for sequence in range(1, 8):
        await c.commit(sequence, tok(sequence))
        await settle()
    assert store.saved == [3, 6]
    assert (c.saved_sequence, c.unsaved) == (6, 1)
    await c.close()
    assert store.saved == [3, 6, 7]


async def test_every_n_counts_frontier_advances_not_completions_past_a_gap() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=3)
    for sequence in (2, 3, 4, 5):
        await c.commit(sequence, tok(sequence))
    await settle()
    assert store.saved == []
    await c.commit(1, tok(1))
    await settle()
    assert store.saved == [5]
    await c.close()


async def test_n_0_and_t_0_save_each_advancing_commit_before_it_returns() -> None:
    store = RecordingStore()
    c = committer(store)
    for sequence in range(1, 6):
        await c.commit(sequence, tok(sequence))
        assert store.stored_sequence() == sequence
    assert c.saves == 5
    await c.close()


async def test_interval_only_saves_with_no_further_events() -> None:
    store = RecordingStore()
    c = committer(store, save_interval_seconds=0.05)
    for sequence in range(1, 6):
        await c.commit(sequence, tok(sequence))
    assert store.saved == []
    await eventually(store, lambda: store.saved == [5])
    await c.close()
    assert store.saved == [5]


async def test_the_timer_keeps_saving_new_progress() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=1000, save_interval_seconds=0.02)
    await c.commit(1, tok(1))
    await eventually(store, lambda: store.saved == [1])
    await c.commit(2, tok(2))
    await eventually(store, lambda: store.saved == [1, 2])
    await c.close()


async def test_a_failed_save_is_retried_by_the_timer_with_no_further_events() -> None:
    errors: list[tuple[BaseException, int]] = []
    store = RecordingStore(fail=lambda call: CheckpointError("primary stepped down") if call == 1 else None)
    c = committer(
        store,
        save_every_n=3,
        save_interval_seconds=0.05,
        on_save_error=lambda error, count: errors.append((error, count)),
    )
    for sequence in range(1, 4):
        await c.commit(sequence, tok(sequence))
    await eventually(store, lambda: store.saved == [3])
    assert c.save_failures == 1
    assert c.consecutive_failures == 0
    assert len(errors) == 1 and errors[0][1] == 1
    assert "stepped down" in str(errors[0][0])
    assert c.failure is None and not c.failed.done()
    await c.close()


async def test_a_failed_synchronous_save_is_retried_by_the_next_commit() -> None:
    store = RecordingStore(fail=lambda call: OSError("connection reset") if call == 1 else None)
    c = committer(store)
    await c.commit(1, tok(1))
    assert store.saved == [] and c.save_failures == 1
    await c.commit(2, tok(2))
    assert store.saved == [2]
    await c.close()


async def test_unconfirmed_since_runs_from_the_first_unanswered_write_until_one_succeeds() -> None:
    store = GatedAsyncStore()
    store.inner = RecordingStore(fail=lambda call: OSError("connection reset") if call == 1 else None)
    store.gate.clear()
    c = committer(store, save_every_n=1)
    assert c.unconfirmed_since is None
    first = asyncio.create_task(c.commit(1, tok(1)))
    await store.started.wait()
    began = c.unconfirmed_since
    assert began is not None  # a write the store has not answered yet
    store.gate.set()
    await first
    assert c.save_failures == 1 and c.unconfirmed_since == began  # it failed: still unconfirmed
    store.gate.clear()
    store.started.clear()
    second = asyncio.create_task(c.commit(2, tok(2)))
    await store.started.wait()
    assert c.unconfirmed_since == began  # the oldest unconfirmed write counts
    store.gate.set()
    await second
    assert store.inner.saved == [2] and c.unconfirmed_since is None
    await c.close()


async def test_count_saves_finish_before_commit_returns_one_at_a_time_and_coalesce() -> None:
    store = GatedAsyncStore()
    store.gate.clear()
    c = committer(store, save_every_n=1)
    first = asyncio.create_task(c.commit(1, tok(1)))
    await asyncio.wait_for(store.started.wait(), 10)
    await settle()
    assert not first.done(), "a count save must finish before commit returns"
    # Handlers finishing meanwhile (concurrent streams) wait for the save in flight...
    others = [asyncio.create_task(c.commit(sequence, tok(sequence))) for sequence in range(2, 10)]
    await settle()
    assert store.in_save == 1
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *others), 10)
    # ...and are covered by one save of the frontier they reached: never two saves at once.
    assert c.saved_sequence == 9
    assert store.max_in_save == 1
    assert store.inner.saved == [1, 9]
    await c.close()


async def test_flush_saves_the_frontier_now() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100, save_interval_seconds=60)
    for sequence in (1, 2, 3, 5):
        await c.commit(sequence, tok(sequence))
    await c.flush()
    assert store.saved == [3]
    await c.flush()
    assert store.saved == [3]
    await c.close()


async def test_flush_raises_the_stores_error() -> None:
    store = RecordingStore(fail=lambda call: CheckpointError("down") if call == 1 else None)
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    with pytest.raises(CheckpointError, match="down"):
        await c.flush()
    assert c.save_failures == 1
    await c.flush()
    assert store.saved == [1]
    await c.close()


# -- seen tokens, metadata, initial state ----------------------------------------------------------


async def test_observe_seen_is_written_on_the_heartbeat() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100, save_interval_seconds=0.02)
    await c.commit(1, tok(1))
    c.observe_seen(tok(10))
    c.observe_seen(tok(8))  # older than what was observed: ignored
    await eventually(store, lambda: store.seen == [10] and store.saved == [1])
    loaded = store.load(STREAM)
    assert loaded is not None
    assert loaded.resume_token == tok(10)
    c.observe_seen(tok(20))
    await eventually(store, lambda: store.seen == [10, 20])
    await c.close()


async def test_observe_seen_is_dropped_while_completions_wait_past_a_gap() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100)
    await c.commit(2, tok(2))
    c.observe_seen(tok(9))
    await c.close()
    assert store.seen == []


async def test_observe_seen_is_saved_at_flush_and_close_without_a_timer() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100)
    c.observe_seen(tok(4))
    await c.flush()
    assert store.seen == [4]
    c.observe_seen(tok(5))
    assert await c.close() is True
    assert store.seen == [4, 5]


async def test_the_saved_checkpoint_carries_epoch_instance_count_and_metadata() -> None:
    store = RecordingStore()
    initial = Checkpoint(
        stream_id=STREAM, last_processed_token=tok(0), events_processed=40, metadata={"a": 1}
    )
    c = committer(store, epoch=3, instance_id="host:7", initial=initial)
    assert c.last_saved_token == tok(0)
    c.set_metadata("b", 2)
    await c.commit(1, tok(1))
    await c.commit(2, tok(2))
    loaded = store.load(STREAM)
    assert loaded is not None
    assert (loaded.epoch, loaded.instance_id, loaded.events_processed) == (3, "host:7", 42)
    assert loaded.metadata == {"a": 1, "b": 2}
    await c.close()


# -- where store calls run -------------------------------------------------------------------------


async def test_a_nonblocking_store_is_called_inline_and_a_blocking_one_in_a_thread() -> None:
    loop_thread = threading.get_ident()
    inline, blocking = RecordingStore(), BlockingStore()
    for store in (inline, blocking):
        c = committer(store)
        await c.commit(1, tok(1))
        await c.close()
    assert inline.threads == {loop_thread}
    assert blocking.threads and loop_thread not in blocking.threads
    assert blocking.saved == [1]


async def test_an_async_store_is_awaited() -> None:
    store = GatedAsyncStore()
    c = committer(store)
    await c.commit(1, tok(1))
    assert store.inner.saved == [1]
    await c.close()


# -- failing for good ------------------------------------------------------------------------------


async def test_consecutive_failures_make_the_committer_fail() -> None:
    store = RecordingStore(fail=lambda call: CheckpointError(f"down #{call}"))
    c = committer(store, max_consecutive_failures=3)
    await c.commit(1, tok(1))
    await c.commit(2, tok(2))
    with pytest.raises(CheckpointSaveFailedError) as raised:
        await c.commit(3, tok(3))
    assert raised.value.failures == 3
    assert "down #3" in str(raised.value.last_error)
    assert c.failed.done() and c.failed.result() is c.failure
    with pytest.raises(CheckpointSaveFailedError):
        await c.commit(4, tok(4))
    with pytest.raises(CheckpointSaveFailedError):
        await c.flush()
    assert store.calls == 3  # nothing more is tried once failed
    assert await c.close() is False


async def test_the_failed_future_tells_a_stream_that_commits_no_more() -> None:
    store = RecordingStore(fail=lambda call: CheckpointError("down"))
    c = committer(store, save_every_n=1000, save_interval_seconds=0.01, max_consecutive_failures=2)
    await c.commit(1, tok(1))
    error = await asyncio.wait_for(c.failed, 10)
    assert isinstance(error, CheckpointSaveFailedError)
    assert c.save_failures == 2
    await c.close()


async def test_fencing_stops_the_committer_at_once() -> None:
    store = RecordingStore()
    store.save(Checkpoint(stream_id=STREAM, last_processed_token=tok(0), epoch=5))
    c = committer(store, epoch=4)
    with pytest.raises(FencedError):
        await c.commit(1, tok(1))
    assert isinstance(c.failure, FencedError)
    assert c.save_failures == 1
    with pytest.raises(FencedError):
        await c.commit(2, tok(2))


async def test_an_error_no_retry_can_fix_fails_at_once() -> None:
    store = RecordingStore(fail=lambda call: TypeError("cannot encode object"))
    c = committer(store, max_consecutive_failures=10)
    with pytest.raises(CheckpointSaveFailedError) as raised:
        await c.commit(1, tok(1))
    assert isinstance(raised.value.last_error, TypeError)
    assert raised.value.failures == 1


def test_the_retry_rule() -> None:
    from pymongo.errors import AutoReconnect

    assert is_retryable_save_error(CheckpointError("x"))
    assert is_retryable_save_error(AutoReconnect("x"))
    assert is_retryable_save_error(ConnectionResetError())
    assert is_retryable_save_error(asyncio.TimeoutError())
    assert not is_retryable_save_error(FencedError("s", epoch=1, stored_epoch=2))
    assert not is_retryable_save_error(ValueError("x"))
    assert not is_retryable_save_error(KeyError("x"))


async def test_a_raising_error_callback_does_not_break_the_committer() -> None:
    def callback(error: BaseException, count: int) -> None:
        raise RuntimeError("callback bug")

    store = RecordingStore(fail=lambda call: CheckpointError("x") if call == 1 else None)
    c = committer(store, on_save_error=callback)
    await c.commit(1, tok(1))
    await c.commit(2, tok(2))
    assert store.saved == [2]
    await c.close()


# -- close -----------------------------------------------------------------------------------------


async def test_close_with_a_gap_saves_below_the_gap_only() -> None:
    store = RecordingStore()
    c = committer(store, save_every_n=100, save_interval_seconds=60)
    for sequence in (1, 2, 4, 5):
        await c.commit(sequence, tok(sequence))
    assert await c.close() is True
    assert store.saved == [2]
    with pytest.raises(CommitterClosedError):
        await c.commit(3, tok(3))
    with pytest.raises(CommitterClosedError):
        await c.flush()
    assert await c.close() is True


async def test_close_returns_within_its_timeout_when_an_async_store_hangs() -> None:
    store = GatedAsyncStore()
    store.gate.clear()  # never opened: the save hangs
    c = committer(store, save_every_n=1, save_interval_seconds=60)
    stuck = asyncio.create_task(c.commit(1, tok(1)))  # its count save hangs in the store
    await asyncio.wait_for(store.started.wait(), 10)
    assert await asyncio.wait_for(c.close(timeout=0.1), 10) is False
    assert store.inner.saved == []
    with pytest.raises(CommitterClosedError):
        await asyncio.wait_for(stuck, 10)  # released by close, not left hanging
    with pytest.raises(CommitterClosedError):
        await c.commit(2, tok(2))


class StubbornAsyncStore(GatedAsyncStore):
    """Its saves hold on through cancellation until the gate opens, as a driver retrying a
    write the server holds does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.clear()
        self.cancellations = 0

    async def save(self, checkpoint: Checkpoint) -> SaveResult:
        self.started.set()
        while not self.gate.is_set():
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancellations += 1
        return self.inner.save(checkpoint)


async def test_interrupt_releases_a_count_save_the_store_does_not_let_go_of() -> None:
    store = StubbornAsyncStore()
    c = committer(store, save_every_n=1, save_interval_seconds=60)
    stuck = asyncio.create_task(c.commit(1, tok(1)))
    await asyncio.wait_for(store.started.wait(), 10)
    c.interrupt()
    await asyncio.wait_for(stuck, 10)  # the event is handled; only its position stays unsaved
    assert store.cancellations == 1  # the save was cancelled, and held on regardless
    assert await asyncio.wait_for(c.close(timeout=0.1), 10) is False
    assert store.inner.saved == []
    store.gate.set()
    await settle()


async def test_interrupt_and_close_release_a_flush_the_store_does_not_let_go_of() -> None:
    store = StubbornAsyncStore()
    c = committer(store, save_every_n=100, save_interval_seconds=60)
    await c.commit(1, tok(1))
    interrupted = asyncio.create_task(c.flush())
    await asyncio.wait_for(store.started.wait(), 10)
    c.interrupt()
    with pytest.raises(CommitterClosedError, match="abandoned because the stream is stopping"):
        await asyncio.wait_for(interrupted, 10)
    store.gate.set()
    await settle()

    store = StubbornAsyncStore()
    c = committer(store, save_every_n=100, save_interval_seconds=60)
    await c.commit(1, tok(1))
    closed = asyncio.create_task(c.flush())
    await asyncio.wait_for(store.started.wait(), 10)
    assert await asyncio.wait_for(c.close(timeout=0.1), 10) is False
    with pytest.raises(CommitterClosedError, match="after the checkpoint committer was closed"):
        await asyncio.wait_for(closed, 10)
    store.gate.set()
    await settle()


async def test_close_returns_within_its_timeout_when_a_blocking_store_hangs() -> None:
    release = threading.Event()
    entered = threading.Event()

    def hang(call: int) -> BaseException | None:
        entered.set()
        release.wait(30)
        return None

    store = BlockingStore(fail=hang)
    c = committer(store, save_every_n=100)
    try:
        await c.commit(1, tok(1))
        assert await asyncio.wait_for(c.close(timeout=0.1), 10) is False
        assert entered.is_set()
    finally:
        release.set()  # let the abandoned worker thread finish so the loop can shut down


async def test_close_reports_a_failed_final_save() -> None:
    store = RecordingStore(fail=lambda call: CheckpointError("down"))
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    assert await c.close() is False


async def test_concurrent_closes_share_one_outcome() -> None:
    store = GatedAsyncStore()
    store.gate.clear()
    c = committer(store, save_every_n=100)
    await c.commit(1, tok(1))
    first = asyncio.ensure_future(c.close(timeout=30))
    await asyncio.wait_for(store.started.wait(), 10)
    second = asyncio.ensure_future(c.close(timeout=30))
    await settle()
    assert not second.done()  # waits for the first close instead of answering early
    store.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), 10) == [True, True]
    assert store.inner.saved == [1]


async def test_async_with_closes() -> None:
    store = RecordingStore()
    async with committer(store, save_every_n=100) as c:
        await c.commit(1, tok(1))
    assert c.closed and store.saved == [1]


# -- construction ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("save_every_n", -1),
        ("save_every_n", 1.5),
        ("save_interval_seconds", -0.1),
        ("max_consecutive_failures", 0),
    ],
)
async def test_bad_options_fail_at_construction(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option):
        committer(InMemoryCheckpointStore(), **{option: value})


async def test_an_initial_checkpoint_of_another_stream_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="initial"):
        committer(InMemoryCheckpointStore(), initial=Checkpoint(stream_id="other"))


def test_construction_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        committer(InMemoryCheckpointStore())
