"""The contract of an :class:`~flowwarden.checkpoints.AsyncCheckpointStore`: the same rules, awaited."""

from __future__ import annotations

import abc
import asyncio
from itertools import pairwise

import pytest

from flowwarden.checkpoints.contract.support import (
    OWNERS,
    RACE_TIMEOUT_SECONDS,
    ROUNDS,
    STREAM,
    assert_utc,
    owner_token,
    processed_data,
    sample_token,
)
from flowwarden.checkpoints.model import Checkpoint, SaveResult
from flowwarden.checkpoints.store import AsyncCheckpointStore
from flowwarden.errors import FencedError
from flowwarden.events import token_data, token_datetime


class AsyncCheckpointStoreContract(abc.ABC):
    """Every rule of :class:`~flowwarden.checkpoints.AsyncCheckpointStore`, one test each."""

    pytestmark = [pytest.mark.asyncio]

    @abc.abstractmethod
    def make_store(self) -> AsyncCheckpointStore:
        """A store on this test's data; called once per simulated application instance."""

    @pytest.fixture
    def store(self) -> AsyncCheckpointStore:
        return self.make_store()

    async def test_load_of_an_unknown_stream_returns_none(self, store: AsyncCheckpointStore) -> None:
        assert await store.load(STREAM) is None
        assert await store.list() == []

    async def test_save_then_load_round_trips_every_field(self, store: AsyncCheckpointStore) -> None:
        token = sample_token(1_700_000_000, 7)
        metadata = {"schema": 2, "nested": {"ok": True, "tags": ["a", "b"]}}
        checkpoint = Checkpoint(
            stream_id=STREAM,
            instance_id="host-1:42",
            instance_token="host-1:42:0f1e2d3c",
            last_processed_token=token,
            events_processed=12,
            epoch=3,
            metadata=metadata,
        )
        assert await store.save(checkpoint) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.instance_id == "host-1:42"
        assert loaded.instance_token == "host-1:42:0f1e2d3c"
        assert loaded.last_processed_token == token
        assert loaded.last_processed_at == token_datetime(token)
        assert loaded.events_processed == 12
        assert loaded.epoch == 3
        assert loaded.metadata == metadata
        assert_utc(loaded.updated_at)

    async def test_same_or_older_positions_are_ignored(self, store: AsyncCheckpointStore) -> None:
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(200), metadata={"v": 1})
        )
        before = await store.load(STREAM)
        for token in (sample_token(200), sample_token(199)):
            result = await store.save(
                Checkpoint(stream_id=STREAM, last_processed_token=token, metadata={"v": 2}, epoch=1)
            )
            assert result is SaveResult.IGNORED
        assert await store.load(STREAM) == before
        assert await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(201))) is (
            SaveResult.STORED
        )

    async def test_a_save_without_a_processed_token_is_rejected(self, store: AsyncCheckpointStore) -> None:
        with pytest.raises(ValueError, match="last_processed_token"):
            await store.save(Checkpoint(stream_id=STREAM))

    async def test_a_lower_epoch_is_fenced_and_writes_nothing(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(100), epoch=2))
        before = await store.load(STREAM)
        with pytest.raises(FencedError) as raised:
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(900), epoch=1))
        assert (raised.value.epoch, raised.value.stored_epoch) == (1, 2)
        with pytest.raises(FencedError):
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1), epoch=1))
        with pytest.raises(FencedError):
            await store.save_seen(STREAM, sample_token(901), 1)
        assert await store.load(STREAM) == before

    async def test_a_higher_epoch_takes_over(self, store: AsyncCheckpointStore) -> None:
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(100), epoch=1))
        assert await store.save_seen(STREAM, sample_token(150), 2) is SaveResult.STORED
        with pytest.raises(FencedError):
            await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(160), epoch=1))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.epoch == 2

    async def test_save_seen_creates_moves_forward_and_leaves_processed_alone(
        self, store: AsyncCheckpointStore
    ) -> None:
        assert await store.save_seen(STREAM, sample_token(300), 0) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.last_processed_token is None
        assert await store.save_seen(STREAM, sample_token(299), 0) is SaveResult.IGNORED
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(100), events_processed=3)
        )
        assert await store.save_seen(STREAM, sample_token(301), 0) is SaveResult.STORED
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_seen_token == sample_token(301)
        assert loaded.last_seen_at == token_datetime(sample_token(301))
        assert loaded.last_processed_token == sample_token(100)
        assert loaded.events_processed == 3
        assert loaded.resume_token == sample_token(301)

    async def test_save_never_touches_the_seen_position(self, store: AsyncCheckpointStore) -> None:
        await store.save_seen(STREAM, sample_token(500), 0)
        await store.save(
            Checkpoint(
                stream_id=STREAM, last_processed_token=sample_token(100), last_seen_token=sample_token(5)
            )
        )
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.last_seen_token == sample_token(500)

    async def test_save_batch_end(self, store: AsyncCheckpointStore) -> None:
        assert await store.save_batch_end(STREAM, sample_token(200), 1) is SaveResult.STORED
        assert await store.save_batch_end(STREAM, sample_token(199), 1) is SaveResult.IGNORED
        await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(150), epoch=1))
        assert await store.save_batch_end(STREAM, sample_token(300), 1) is SaveResult.STORED
        with pytest.raises(FencedError):
            await store.save_batch_end(STREAM, sample_token(400), 0)
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.batch_end_token == sample_token(300)
        assert loaded.last_processed_token == sample_token(150)
        assert loaded.pending_batch_end == sample_token(300)
        await store.rewind(STREAM, sample_token(100))
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.batch_end_token is None

    async def test_delete_and_list(self, store: AsyncCheckpointStore) -> None:
        for name in ("b", "a", "c"):
            await store.save(Checkpoint(stream_id=name, last_processed_token=sample_token(1)))
        assert [c.stream_id for c in await store.list()] == ["a", "b", "c"]
        assert await store.delete("b") is True
        assert await store.delete("b") is False
        assert await store.load("b") is None
        assert [c.stream_id for c in await store.list()] == ["a", "c"]

    async def test_rewind(self, store: AsyncCheckpointStore) -> None:
        await store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(500), epoch=4, metadata={"m": 1})
        )
        await store.save_seen(STREAM, sample_token(600), 4)
        await store.rewind(STREAM, sample_token(100))
        loaded = await store.load(STREAM)
        assert loaded is not None
        assert loaded.last_processed_token == sample_token(100)
        assert loaded.last_seen_token is None
        assert (loaded.epoch, loaded.metadata) == (4, {"m": 1})
        await store.rewind(STREAM, None)
        loaded = await store.load(STREAM)
        assert loaded is not None and loaded.resume_token is None and loaded.epoch == 4
        await store.rewind("fresh", None)
        assert await store.load("fresh") is None
        await store.rewind("fresh", sample_token(7))
        fresh = await store.load("fresh")
        assert fresh is not None and fresh.resume_token == sample_token(7)

    async def test_racing_first_inserts_leave_one_record_with_the_newest_token(self) -> None:
        stores = [self.make_store() for _ in range(8)]
        tokens = [sample_token(1000, 1 + (i * 5) % 8) for i in range(8)]
        results = await asyncio.gather(
            *(
                s.save(Checkpoint(stream_id=STREAM, last_processed_token=t))
                for s, t in zip(stores, tokens, strict=True)
            ),
            return_exceptions=True,
        )
        assert all(isinstance(r, SaveResult) for r in results), results
        records = await stores[0].list()
        assert len(records) == 1
        assert processed_data(records[0]) == max(token_data(t) for t in tokens)

    async def test_racing_owners_never_regress_and_the_lower_epochs_get_fenced(self) -> None:
        stores = [self.make_store() for _ in range(OWNERS)]
        observer_store = self.make_store()
        observed: list[tuple[int, str]] = []
        done = asyncio.Event()

        async def observe() -> None:
            while not done.is_set():
                current = await observer_store.load(STREAM)
                data = processed_data(current)
                if current is not None and data is not None:
                    observed.append((current.epoch, data))
                await asyncio.sleep(0)

        async def owner(epoch: int) -> list[SaveResult | FencedError]:
            outcomes: list[SaveResult | FencedError] = []
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
            return outcomes

        watcher = asyncio.ensure_future(observe())
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(owner(e) for e in range(OWNERS))), RACE_TIMEOUT_SECONDS
            )
        finally:
            done.set()
            await watcher
        for epoch, outcomes in enumerate(results):
            for outcome in outcomes:
                if isinstance(outcome, FencedError):
                    assert outcome.epoch == epoch and outcome.stored_epoch > epoch
        assert not any(isinstance(o, FencedError) for o in results[-1])
        final = await stores[0].load(STREAM)
        assert final is not None
        assert final.epoch == OWNERS - 1
        assert final.last_processed_token == owner_token(ROUNDS - 1, OWNERS - 1)
        assert len(await stores[0].list()) == 1
        for (e1, d1), (e2, d2) in pairwise(observed):
            assert d2 >= d1 and e2 >= e1, "the stored checkpoint went backwards"
