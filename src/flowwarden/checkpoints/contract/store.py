"""The checkpoint store contract: one suite, every rule of the store SPI one test, for sync and
asyncio stores alike.

The rules are written once, in :class:`StoreRules`, as tests that await each store call.
:class:`AsyncCheckpointStoreContract` runs them on an asyncio store as they are;
:class:`CheckpointStoreContract` runs the same tests on a blocking store (see
:mod:`flowwarden.checkpoints.contract.support`), its racing writers in threads.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from itertools import pairwise
from typing import Any, TypeVar

import pytest

from flowwarden.checkpoints.contract.support import (
    OWNERS,
    ROUNDS,
    STREAM,
    Blocking,
    assert_utc,
    blocking_form,
    owner_token,
    processed_data,
    race_in_tasks,
    race_in_threads,
    sample_token,
    seen_data,
)
from flowwarden.checkpoints.model import Checkpoint, SaveResult
from flowwarden.checkpoints.store import AsyncCheckpointStore, CheckpointStore
from flowwarden.errors import FencedError
from flowwarden.events import token_data, token_datetime

T = TypeVar("T")


class StoreRules(abc.ABC):
    """Every rule of the store SPI, one test each, written against the awaited store calls.

    Not run by itself: :class:`CheckpointStoreContract` and :class:`AsyncCheckpointStoreContract`
    run it. ``store`` (the fixture) is a store on this test's data; :meth:`another_store` gives
    one more, as another application instance would have.
    """

    @abc.abstractmethod
    def make_store(self) -> Any:
        """A store on this test's data; called once per simulated application instance."""

    @pytest.fixture
    def store(self) -> Any:
        return self.make_store()

    @abc.abstractmethod
    def another_store(self) -> AsyncCheckpointStore:
        """A new store object on this test's data (from :meth:`make_store`), awaited as the tests await."""

    @abc.abstractmethod
    async def race(self, workers: Sequence[Callable[[], Awaitable[T]]]) -> list[T | Exception]:
        """The workers run at once, as writers in separate application instances; their results
        (or errors) in order."""

    # -- load / save ------------------------------------------------------------------------

    async def test_load_of_an_unknown_stream_returns_none(self, store: AsyncCheckpointStore) -> None:
        assert await store.load(STREAM) is None
        assert await store.list() == []

    async def test_save_then_load_round_trips_every_field(self, store: AsyncCheckpointStore) -> None:
        token = sample_token(1_700_000_000, 7)
        metadata = {"schema": 2, "nested": {"ok": True, "tags": ["a", "b"]}, "note": "x"}
        result = await store.save(
            Checkpoint(
                stream_id=STREAM,
                instance_id="host-1:42",
                instance_token="host-1:42:0f1e2d3c",
                last_processed_token=token,
                events_processed=12,
                epoch=3,
                metadata=metadata,
            )
        )
        assert result is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.stream_id == STREAM
        assert loaded.instance_id == "host-1:42"
        assert loaded.instance_token == "host-1:42:0f1e2d3c"
        assert loaded.last_processed_token == token
        assert loaded.last_processed_at == token_datetime(token)
        assert loaded.last_seen_token is None
        assert loaded.events_processed == 12
        assert loaded.epoch == 3
        assert loaded.metadata == metadata
        assert_utc(loaded.updated_at)
        assert_utc(loaded.last_processed_at)
        assert loaded.resume_token == token

    async def test_a_newer_position_is_stored(self, store: AsyncCheckpointStore) -> None:
        result = await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(100)))
        assert result is SaveResult.STORED
        newer = sample_token(100, 2)
        result = await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=newer, events_processed=2)
        )
        assert result is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_processed_token == newer
        assert loaded.events_processed == 2

    async def test_the_same_position_is_ignored_and_writes_nothing(self, store: AsyncCheckpointStore) -> None:
        token = sample_token(100)
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=token, instance_id="a", metadata={"v": 1})
        )
        before = await store.load(STREAM)
        result = await store.save(
            Checkpoint(
                stream_id=STREAM,
                last_processed_token=token,
                instance_id="b",
                events_processed=99,
                metadata={"v": 2},
            )
        )
        assert result is SaveResult.IGNORED
        assert await store.load(STREAM) == before

    async def test_an_older_position_is_ignored_and_never_regresses(
        self, store: AsyncCheckpointStore
    ) -> None:
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(200), events_processed=5)
        )
        before = await store.load(STREAM)
        for older in (sample_token(199, 9), sample_token(200, 0), sample_token(1)):
            result = await store.save(
                Checkpoint(stream_id=STREAM, last_processed_token=older, events_processed=1, epoch=1)
            )
            assert result is SaveResult.IGNORED
        assert await store.load(STREAM) == before

    async def test_a_save_without_a_processed_token_is_rejected(self, store: AsyncCheckpointStore) -> None:
        with pytest.raises(ValueError, match="last_processed_token"):
            await store.save(Checkpoint(stream_id=STREAM))
        assert await store.load(STREAM) is None

    async def test_metadata_is_replaced_by_each_stored_save(self, store: AsyncCheckpointStore) -> None:
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1), metadata={"a": 1})
        )
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2), metadata={"b": 2})
        )
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.metadata == {"b": 2}

    async def test_streams_are_independent(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id="a", last_processed_token=sample_token(500), epoch=5))
        result = await store.save(Checkpoint(stream_id="b", last_processed_token=sample_token(1), epoch=0))
        assert result is SaveResult.STORED
        loaded = await store.load("b")
        assert loaded is not None
        assert loaded.last_processed_token == sample_token(1)
        assert loaded.epoch == 0

    # -- fencing ----------------------------------------------------------------------------

    async def test_a_lower_epoch_save_is_fenced_and_writes_nothing(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(100), epoch=2))
        before = await store.load(STREAM)
        with pytest.raises(FencedError) as raised:
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(900), epoch=1))
        assert raised.value.epoch == 1
        assert raised.value.stored_epoch == 2
        assert raised.value.stream == STREAM
        # Fencing wins over "older position": a stale owner learns it lost the stream.
        with pytest.raises(FencedError):
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1), epoch=1))
        with pytest.raises(FencedError):
            await store.save_seen(STREAM, sample_token(901), 1)
        assert await store.load(STREAM) == before

    async def test_a_higher_epoch_takes_over_and_fences_the_previous_owner(
        self, store: AsyncCheckpointStore
    ) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(100), epoch=1))
        result = await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(101), epoch=2)
        )
        assert result is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.epoch == 2
        with pytest.raises(FencedError):
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(102), epoch=1))
        with pytest.raises(FencedError):
            await store.save_seen(STREAM, sample_token(103), 1)
        assert processed_data(await store.load(STREAM)) == token_data(sample_token(101))

    async def test_an_equal_epoch_keeps_writing(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1), epoch=4))
        result = await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2), epoch=4))
        assert result is SaveResult.STORED
        assert await store.save_seen(STREAM, sample_token(3), 4) is SaveResult.STORED

    # -- save_seen --------------------------------------------------------------------------

    async def test_save_seen_creates_a_record_with_no_processed_position(
        self, store: AsyncCheckpointStore
    ) -> None:
        token = sample_token(300)
        assert await store.save_seen(STREAM, token, 1) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_seen_token == token
        assert loaded.last_seen_at == token_datetime(token)
        assert loaded.last_processed_token is None
        assert loaded.epoch == 1
        assert loaded.resume_token == token
        # The first processed save still lands on a record created by save_seen.
        result = await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(10), epoch=1)
        )
        assert result is SaveResult.STORED

    async def test_save_seen_only_moves_forward(self, store: AsyncCheckpointStore) -> None:
        await store.save_seen(STREAM, sample_token(300), 0)
        assert await store.save_seen(STREAM, sample_token(300), 0) is SaveResult.IGNORED
        assert await store.save_seen(STREAM, sample_token(299), 0) is SaveResult.IGNORED
        assert seen_data(await store.load(STREAM)) == token_data(sample_token(300))
        assert await store.save_seen(STREAM, sample_token(301), 0) is SaveResult.STORED
        assert seen_data(await store.load(STREAM)) == token_data(sample_token(301))

    async def test_save_seen_never_touches_the_processed_position(self, store: AsyncCheckpointStore) -> None:
        await store.save(
            Checkpoint(
                stream_id=STREAM,
                last_processed_token=sample_token(100),
                events_processed=7,
                instance_id="i",
                metadata={"k": "v"},
            )
        )
        await store.save_seen(STREAM, sample_token(500), 0)
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_processed_token == sample_token(100)
        assert loaded.last_processed_at == token_datetime(sample_token(100))
        assert loaded.events_processed == 7
        assert loaded.instance_id == "i"
        assert loaded.metadata == {"k": "v"}
        assert loaded.resume_token == sample_token(500)

    async def test_save_never_touches_the_seen_position(self, store: AsyncCheckpointStore) -> None:
        await store.save_seen(STREAM, sample_token(500), 0)
        await store.save(
            Checkpoint(
                stream_id=STREAM,
                last_processed_token=sample_token(100),
                last_seen_token=sample_token(50),
            )
        )
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_seen_token == sample_token(500)
        assert loaded.last_processed_token == sample_token(100)

    async def test_save_seen_with_a_lower_epoch_is_fenced(self, store: AsyncCheckpointStore) -> None:
        await store.save_seen(STREAM, sample_token(10), 3)
        with pytest.raises(FencedError) as raised:
            await store.save_seen(STREAM, sample_token(11), 2)
        assert raised.value.stored_epoch == 3
        assert seen_data(await store.load(STREAM)) == token_data(sample_token(10))

    async def test_save_seen_with_a_higher_epoch_takes_over(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(10), epoch=1))
        assert await store.save_seen(STREAM, sample_token(20), 2) is SaveResult.STORED
        with pytest.raises(FencedError):
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(30), epoch=1))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.epoch == 2

    # -- save_batch_end ---------------------------------------------------------------------

    async def test_save_batch_end_creates_moves_forward_and_never_touches_a_position(
        self, store: AsyncCheckpointStore
    ) -> None:
        assert await store.save_batch_end(STREAM, sample_token(200), 1) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.batch_end_token == sample_token(200)
        assert loaded.resume_token is None and loaded.epoch == 1
        assert loaded.pending_batch_end == sample_token(200)
        assert await store.save_batch_end(STREAM, sample_token(200), 1) is SaveResult.IGNORED
        assert await store.save_batch_end(STREAM, sample_token(199), 1) is SaveResult.IGNORED
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(150), epoch=1, metadata={"a": 1})
        )
        await store.save_seen(STREAM, sample_token(160), 1)
        assert await store.save_batch_end(STREAM, sample_token(300), 1) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.batch_end_token == sample_token(300)
        assert loaded.last_processed_token == sample_token(150)
        assert loaded.last_seen_token == sample_token(160)
        assert loaded.metadata == {"a": 1}
        # Once the position reaches the batch end, that batch is over.
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(300), epoch=1))
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.batch_end_token == sample_token(300) and loaded.pending_batch_end is None

    async def test_save_batch_end_is_fenced_and_rewind_forgets_it(self, store: AsyncCheckpointStore) -> None:
        await store.save_batch_end(STREAM, sample_token(10), 3)
        with pytest.raises(FencedError):
            await store.save_batch_end(STREAM, sample_token(11), 2)
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.batch_end_token == sample_token(10)
        await store.rewind(STREAM, sample_token(5))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.batch_end_token is None
        assert await store.save_batch_end(STREAM, sample_token(9), 3) is SaveResult.STORED

    # -- delete / list ----------------------------------------------------------------------

    async def test_delete_removes_the_record(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
        await store.save(Checkpoint(stream_id="other", last_processed_token=sample_token(1)))
        assert await store.delete(STREAM) is True
        assert await store.load(STREAM) is None
        assert await store.delete(STREAM) is False
        assert [c.stream_id for c in await store.list()] == ["other"]

    async def test_list_returns_every_record_ordered_by_stream(self, store: AsyncCheckpointStore) -> None:
        for name, seconds in (("c", 3), ("a", 1), ("b", 2)):
            await store.save(Checkpoint(stream_id=name, last_processed_token=sample_token(seconds)))
        await store.save_seen("d", sample_token(4), 0)
        listed = await store.list()
        assert [c.stream_id for c in listed] == ["a", "b", "c", "d"]
        assert listed[0] == await store.load("a")
        assert listed[3].last_seen_token == sample_token(4)

    # -- rewind -----------------------------------------------------------------------------

    async def test_rewind_moves_backwards_and_clears_the_seen_position(
        self, store: AsyncCheckpointStore
    ) -> None:
        await store.save(
            Checkpoint(
                stream_id=STREAM,
                last_processed_token=sample_token(500),
                epoch=4,
                events_processed=50,
                metadata={"m": 1},
            )
        )
        await store.save_seen(STREAM, sample_token(600), 4)
        await store.rewind(STREAM, sample_token(100))
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_processed_token == sample_token(100)
        assert loaded.last_processed_at == token_datetime(sample_token(100))
        assert loaded.last_seen_token is None
        assert loaded.resume_token == sample_token(100)
        assert loaded.epoch == 4
        assert loaded.events_processed == 50
        assert loaded.metadata == {"m": 1}
        # After a rewind, positions between the new and the old one are progress again.
        result = await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(200), epoch=4)
        )
        assert result is SaveResult.STORED
        with pytest.raises(FencedError):
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(300), epoch=3))

    async def test_rewind_to_none_clears_both_positions(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(500), epoch=2))
        await store.save_seen(STREAM, sample_token(600), 2)
        await store.rewind(STREAM, None)
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_processed_token is None
        assert loaded.last_seen_token is None
        assert loaded.resume_token is None
        assert loaded.epoch == 2
        result = await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1), epoch=2))
        assert result is SaveResult.STORED

    async def test_rewind_of_an_unknown_stream(self, store: AsyncCheckpointStore) -> None:
        await store.rewind(STREAM, None)
        assert await store.load(STREAM) is None
        await store.rewind(STREAM, sample_token(42))
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.resume_token == sample_token(42)
        assert loaded.epoch == 0

    # -- atomicity under racing writers -----------------------------------------------------

    async def test_racing_first_inserts_leave_one_record_with_the_newest_token(self) -> None:
        stores = [self.another_store() for _ in range(8)]
        tokens = [sample_token(1000, 1 + (i * 5) % 8) for i in range(8)]
        results = await self.race(
            [
                partial(s.save, Checkpoint(stream_id=STREAM, last_processed_token=t))
                for s, t in zip(stores, tokens, strict=True)
            ]
        )
        assert len(results) == 8
        assert all(isinstance(r, SaveResult) for r in results), results
        assert SaveResult.STORED in results
        records = [c for c in await stores[0].list() if c.stream_id == STREAM]
        assert len(records) == 1
        assert processed_data(records[0]) == max(token_data(t) for t in tokens)

    async def test_racing_first_save_seen_and_save_leave_one_record_with_both(self) -> None:
        stores = [self.another_store() for _ in range(6)]
        workers: list[Callable[[], Awaitable[SaveResult]]] = []
        for i, store in enumerate(stores):
            if i % 2:
                workers.append(partial(store.save_seen, STREAM, sample_token(3000, i), 0))
            else:
                workers.append(
                    partial(
                        store.save, Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2000, i))
                    )
                )
        results = await self.race(workers)
        assert all(isinstance(r, SaveResult) for r in results), results
        records = await stores[0].list()
        assert len(records) == 1
        assert processed_data(records[0]) == token_data(sample_token(2000, 4))
        assert seen_data(records[0]) == token_data(sample_token(3000, 5))

    async def test_racing_owners_never_regress_and_the_lower_epochs_get_fenced(self) -> None:
        stores = [self.another_store() for _ in range(OWNERS)]
        observer_store = self.another_store()
        observed: list[tuple[int, str]] = []
        finished: list[int] = []

        async def observe() -> None:
            # Reads all along, until every owner is done.
            while len(finished) < OWNERS:
                current = await observer_store.load(STREAM)
                data = processed_data(current)
                if current is not None and data is not None:
                    observed.append((current.epoch, data))
                await asyncio.sleep(0)

        async def owner(epoch: int) -> list[SaveResult | FencedError]:
            outcomes: list[SaveResult | FencedError] = []
            try:
                for round_ in range(ROUNDS):
                    try:
                        outcomes.append(
                            await stores[epoch].save(
                                Checkpoint(
                                    stream_id=STREAM,
                                    last_processed_token=owner_token(round_, epoch),
                                    epoch=epoch,
                                )
                            )
                        )
                    except FencedError as exc:
                        outcomes.append(exc)
            finally:
                finished.append(epoch)
            return outcomes

        workers: list[Callable[[], Awaitable[Any]]] = [observe, *(partial(owner, e) for e in range(OWNERS))]
        observer_result, *results = await self.race(workers)
        assert observer_result is None, observer_result
        assert not any(isinstance(r, Exception) for r in results), results
        for epoch, outcomes in enumerate(results):
            assert isinstance(outcomes, list)
            for outcome in outcomes:
                if isinstance(outcome, FencedError):
                    assert outcome.epoch == epoch
                    assert outcome.stored_epoch > epoch
        top = results[-1]
        assert isinstance(top, list)
        assert not any(isinstance(o, FencedError) for o in top), "the highest epoch was fenced"
        final = await stores[0].load(STREAM)
        assert final is not None
        assert final.epoch == OWNERS - 1
        assert final.last_processed_token == owner_token(ROUNDS - 1, OWNERS - 1)
        assert len(await stores[0].list()) == 1
        for (e1, d1), (e2, d2) in pairwise(observed):
            assert d2 >= d1, "the stored position went backwards"
            assert e2 >= e1, "the stored epoch went backwards"
        with pytest.raises(FencedError):
            await stores[0].save(
                Checkpoint(stream_id=STREAM, last_processed_token=sample_token(9999), epoch=0)
            )


@blocking_form
class CheckpointStoreContract(StoreRules):
    """Every rule of :class:`~flowwarden.checkpoints.CheckpointStore`, one test each, on a blocking
    store: implement :meth:`make_store`. Racing writers are threads."""

    @abc.abstractmethod
    def make_store(self) -> CheckpointStore:
        """A store on this test's data; called once per simulated application instance."""

    def another_store(self) -> AsyncCheckpointStore:
        return Blocking(self.make_store())

    async def race(self, workers: Sequence[Callable[[], Awaitable[T]]]) -> list[T | Exception]:
        return race_in_threads(workers)


class AsyncCheckpointStoreContract(StoreRules):
    """Every rule of :class:`~flowwarden.checkpoints.AsyncCheckpointStore`, one test each (the
    same tests as :class:`CheckpointStoreContract`'s): implement :meth:`make_store`. Racing
    writers are tasks. Needs pytest-asyncio."""

    pytestmark = [pytest.mark.asyncio]

    @abc.abstractmethod
    def make_store(self) -> AsyncCheckpointStore:
        """A store on this test's data; called once per simulated application instance."""

    def another_store(self) -> AsyncCheckpointStore:
        return self.make_store()

    async def race(self, workers: Sequence[Callable[[], Awaitable[T]]]) -> list[T | Exception]:
        return await race_in_tasks(workers)


__all__ = ["AsyncCheckpointStoreContract", "CheckpointStoreContract", "StoreRules"]
