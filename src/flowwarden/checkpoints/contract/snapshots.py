"""The contract of :class:`~flowwarden.checkpoints.SnapshotStore`: initial and incremental
snapshot progress.

Mix :class:`SnapshotStoreContract` (blocking stores) or :class:`AsyncSnapshotStoreContract`
(asyncio stores) into a store's contract test class when the store has ``save_snapshot``; the
mixins use the class's ``make_store()`` and ``store`` fixture. Both run the same tests,
:class:`SnapshotRules`, as the store suite does (:mod:`flowwarden.checkpoints.contract.store`).
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest
from bson import MinKey, ObjectId

from flowwarden.checkpoints.contract.support import STREAM, blocking_form, sample_token
from flowwarden.checkpoints.model import (
    Checkpoint,
    IncrementalProgress,
    IncrementalState,
    SaveResult,
    SnapshotProgress,
)
from flowwarden.errors import FencedError

STARTED = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)
# _id values of every kind a collection may hold: the store keeps each as it was given.
LAST_IDS: tuple[Any, ...] = (7, "sku-9", ObjectId("65a1b2c3d4e5f60718293a4b"), {"region": "eu", "n": 3}, 2.5)


def progress(
    chunk: int,
    *,
    done: bool = False,
    token: Mapping[str, Any] | None = None,
    last_id: Any = None,
    end_id: Any = 10_000,
    planned: Any = MinKey(),
) -> SnapshotProgress:
    """Progress of the snapshot taken at ``token`` (default: one fixed token) after ``chunk``
    chunks, the last one finished, or planned through ``planned`` and not finished yet."""
    return SnapshotProgress(
        token=token or sample_token(1_700_000_000, 5),
        namespaces=("shop.orders", "shop.returns"),
        namespace="shop.orders",
        end_id=end_id,
        last_id=chunk * 10 if last_id is None else last_id,
        chunk=chunk,
        chunk_end=planned,
        copied=chunk * 10,
        total=1_000,
        done=done,
        started_at=STARTED,
    )


def incremental(
    chunk: int,
    *,
    request: str = "65a1b2c3d4e5f60718293a4b",
    state: IncrementalState = IncrementalState.RUNNING,
    last_id: Any = None,
    planned: Any = MinKey(),
) -> IncrementalProgress:
    """Progress of incremental snapshot ``request`` after ``chunk`` chunks, the last one
    finished, or planned through ``planned`` and not finished yet."""
    return IncrementalProgress(
        request=request,
        namespaces=("shop.orders", "shop.returns"),
        namespace="shop.returns",
        end_id=10_000,
        last_id=chunk * 10 if last_id is None else last_id,
        chunk=chunk,
        chunk_end=planned,
        copied=chunk * 10,
        dropped=chunk,
        total=2_000,
        state=state,
        started_at=STARTED,
        ended_at=None if state is IncrementalState.RUNNING else STARTED + dt.timedelta(minutes=5),
    )


class SnapshotRules(abc.ABC):
    """Every rule of ``save_snapshot``, written against the awaited store calls; run by
    :class:`SnapshotStoreContract` and :class:`AsyncSnapshotStoreContract`."""

    @abc.abstractmethod
    def make_store(self) -> Any:
        """A store on this test's data (see :class:`~flowwarden.checkpoints.contract.StoreRules`)."""

    async def test_snapshot_progress_round_trips_and_creates_the_record(self, store: Any) -> None:
        for index, last_id in enumerate(LAST_IDS):
            saved = progress(index + 1, last_id=last_id)
            assert await store.save_snapshot(STREAM, saved, 0) is SaveResult.STORED
            loaded = await store.load(STREAM)
            assert loaded is not None and loaded.snapshot == saved
            # Progress is not a position: no token was written.
            assert loaded.resume_token is None

    async def test_the_bound_and_the_planned_chunk_round_trip(self, store: Any) -> None:
        chunk = 0
        for bound in (*LAST_IDS, MinKey(), None):
            for planned in (bound, MinKey()):
                chunk += 1
                saved = progress(chunk, end_id=bound, planned=planned)
                assert await store.save_snapshot(STREAM, saved, 0) is SaveResult.STORED
                loaded = await store.load(STREAM)
                assert loaded is not None and loaded.snapshot is not None
                assert isinstance(loaded.snapshot.end_id, MinKey) is isinstance(bound, MinKey)
                assert loaded.snapshot.end_id == bound and loaded.snapshot.chunk_end == saved.chunk_end
                assert loaded.snapshot.pending is not isinstance(planned, MinKey) and loaded.snapshot == saved
        # A plan never goes back either, to a lower planned chunk of the same snapshot.
        assert await store.save_snapshot(STREAM, progress(chunk, planned=5), 0) is SaveResult.IGNORED

    async def test_a_chunk_is_planned_then_finished_and_never_planned_again(self, store: Any) -> None:
        assert await store.save_snapshot(STREAM, progress(2), 0) is SaveResult.STORED
        assert await store.save_snapshot(STREAM, progress(3, last_id=20, planned=30), 0) is SaveResult.STORED
        # The plan stays: a save of the finished chunk before it does not go back.
        assert await store.save_snapshot(STREAM, progress(2), 0) is SaveResult.IGNORED
        assert await store.save_snapshot(STREAM, progress(3, last_id=20, planned=30), 0) is SaveResult.IGNORED
        assert await store.save_snapshot(STREAM, progress(3), 0) is SaveResult.STORED
        assert await store.save_snapshot(STREAM, progress(3, last_id=20, planned=30), 0) is SaveResult.IGNORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot == progress(3)

    async def test_snapshot_progress_never_goes_back(self, store: Any) -> None:
        assert await store.save_snapshot(STREAM, progress(10), 0) is SaveResult.STORED
        assert await store.save_snapshot(STREAM, progress(10), 0) is SaveResult.IGNORED
        assert await store.save_snapshot(STREAM, progress(4), 0) is SaveResult.IGNORED
        assert await store.save_snapshot(STREAM, progress(10, done=True), 0) is SaveResult.STORED
        assert await store.save_snapshot(STREAM, progress(10), 0) is SaveResult.IGNORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot == progress(10, done=True)

    async def test_another_snapshot_replaces_the_progress(self, store: Any) -> None:
        await store.save_snapshot(STREAM, progress(500, done=True), 0)
        later = progress(3, token=sample_token(1_700_000_900))
        assert await store.save_snapshot(STREAM, later, 0) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot == later

    async def test_snapshot_progress_is_fenced(self, store: Any) -> None:
        await store.save_snapshot(STREAM, progress(1), 3)
        with pytest.raises(FencedError):
            await store.save_snapshot(STREAM, progress(2), 2)
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot == progress(1) and loaded.epoch == 3

    async def test_positions_keep_the_progress_and_a_rewind_clears_it(self, store: Any) -> None:
        await store.save_snapshot(STREAM, progress(8), 0)
        await store.save_seen(STREAM, sample_token(1_700_000_000, 5), 0)
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1_700_000_001)))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot == progress(8)
        await store.rewind(STREAM, sample_token(1_700_000_000, 9))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot is None
        assert loaded.last_processed_token == sample_token(1_700_000_000, 9)

    async def test_incremental_progress_round_trips_and_creates_the_record(self, store: Any) -> None:
        for index, last_id in enumerate(LAST_IDS):
            for planned in (MinKey(), last_id):
                chunk = 2 * index + (1 if isinstance(planned, MinKey) else 2)
                saved = incremental(chunk, last_id=last_id, planned=planned)
                assert await store.save_incremental(STREAM, saved, 0) is SaveResult.STORED
                loaded = await store.load(STREAM)
                assert loaded is not None and loaded.incremental_snapshot == saved
                assert loaded.incremental_snapshot.pending is not isinstance(planned, MinKey)
                # Progress is not a position, and no initial snapshot was begun.
                assert loaded.resume_token is None and loaded.snapshot is None

    async def test_incremental_progress_never_goes_back(self, store: Any) -> None:
        assert await store.save_incremental(STREAM, incremental(3), 0) is SaveResult.STORED
        planned = incremental(4, last_id=30, planned=40)
        assert await store.save_incremental(STREAM, planned, 0) is SaveResult.STORED
        assert await store.save_incremental(STREAM, incremental(3), 0) is SaveResult.IGNORED
        assert await store.save_incremental(STREAM, planned, 0) is SaveResult.IGNORED
        assert await store.save_incremental(STREAM, incremental(4), 0) is SaveResult.STORED
        ended = incremental(4, state=IncrementalState.CANCELLED)
        assert await store.save_incremental(STREAM, ended, 0) is SaveResult.STORED
        # Once ended, a running save of the same request (a late writer) does not revive it.
        assert await store.save_incremental(STREAM, incremental(4), 0) is SaveResult.IGNORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.incremental_snapshot == ended

    async def test_another_request_replaces_the_incremental_progress(self, store: Any) -> None:
        await store.save_incremental(STREAM, incremental(90, state=IncrementalState.DONE), 0)
        later = incremental(1, request="65a1b2c3d4e5f60718293aff")
        assert await store.save_incremental(STREAM, later, 0) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.incremental_snapshot == later

    async def test_incremental_progress_is_fenced(self, store: Any) -> None:
        await store.save_incremental(STREAM, incremental(1), 3)
        with pytest.raises(FencedError):
            await store.save_incremental(STREAM, incremental(2), 2)
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.incremental_snapshot == incremental(1) and loaded.epoch == 3

    async def test_positions_the_initial_snapshot_and_a_rewind_keep_the_incremental_progress(
        self, store: Any
    ) -> None:
        await store.save_incremental(STREAM, incremental(6), 0)
        await store.save_seen(STREAM, sample_token(1_700_000_000, 5), 0)
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1_700_000_001)))
        await store.save_batch_end(STREAM, sample_token(1_700_000_002), 0)
        await store.save_snapshot(STREAM, progress(2), 0)
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.incremental_snapshot == incremental(6)
        assert loaded.snapshot == progress(2)
        # A copy requested while the stream runs is not tied to a position: a rewind keeps it.
        await store.rewind(STREAM, sample_token(1_700_000_000, 9))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.snapshot is None
        assert loaded.incremental_snapshot == incremental(6)


@blocking_form
class SnapshotStoreContract(SnapshotRules):
    """Every rule of ``save_snapshot`` on a blocking store."""


class AsyncSnapshotStoreContract(SnapshotRules):
    """Every rule of ``save_snapshot`` on an asyncio store (the same tests). Needs pytest-asyncio."""

    pytestmark = [pytest.mark.asyncio]


__all__ = [
    "AsyncSnapshotStoreContract",
    "SnapshotRules",
    "SnapshotStoreContract",
    "incremental",
    "progress",
]
