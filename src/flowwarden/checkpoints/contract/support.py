"""What the contract suites share: sample tokens, and how one suite runs on sync and async stores.

Every rule is written once, as an ``async`` test that awaits each store call. An asyncio store
runs those tests as they are. A blocking store runs them through :func:`blocking_form`: each test
runs in an event loop of its own, with the store behind :class:`Blocking`, whose awaited calls
are the store's blocking calls made inline; racing writers are threads, as separate application
instances would be.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from flowwarden.checkpoints.model import Checkpoint, IncrementalProgress, SaveResult, SnapshotProgress
from flowwarden.checkpoints.store import CheckpointStore
from flowwarden.events import ResumeToken, token_data

T = TypeVar("T")
C = TypeVar("C", bound=type)

STREAM = "orders"

RACE_TIMEOUT_SECONDS = 60.0


def sample_token(seconds: int, increment: int = 1) -> dict[str, Any]:
    """A resume token shaped like the server's: KeyString cluster time, then the event's key bytes.

    Tokens order by ``(seconds, increment)``, like events in the oplog.
    """
    return {"_data": f"82{seconds:08X}{increment:08X}2B042C0100296E5A1004463D2A5F3C4B"}


def processed_data(checkpoint: Checkpoint | None) -> str | None:
    if checkpoint is None or checkpoint.last_processed_token is None:
        return None
    return token_data(checkpoint.last_processed_token)


def seen_data(checkpoint: Checkpoint | None) -> str | None:
    if checkpoint is None or checkpoint.last_seen_token is None:
        return None
    return token_data(checkpoint.last_seen_token)


def assert_utc(value: datetime | None) -> None:
    assert value is not None
    assert value.tzinfo is not None and value.utcoffset() == timezone.utc.utcoffset(value)


# Owners racing with epochs: owner e saves tokens (round, e + 1) for round 0.., so within a round
# the higher epoch has the newer token and the last round of the highest epoch is the newest.
OWNERS = 4
ROUNDS = 12


def owner_token(round_: int, epoch: int) -> dict[str, Any]:
    return sample_token(2000 + round_, epoch + 1)


# -- the blocking form -----------------------------------------------------------------------------


class Blocking:
    """A blocking store, as the contract's tests await it: each awaited call is the store's own
    blocking call, made inline (so each call is one call, in the thread that awaits it)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store: Any = store  # a SnapshotStore too, for the snapshot rules

    async def load(self, stream_id: str) -> Checkpoint | None:
        loaded: Checkpoint | None = self.store.load(stream_id)
        return loaded

    async def save(self, checkpoint: Checkpoint) -> SaveResult:
        result: SaveResult = self.store.save(checkpoint)
        return result

    async def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        result: SaveResult = self.store.save_seen(stream_id, token, epoch)
        return result

    async def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        result: SaveResult = self.store.save_batch_end(stream_id, token, epoch)
        return result

    async def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        result: SaveResult = self.store.save_snapshot(stream_id, progress, epoch)
        return result

    async def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult:
        result: SaveResult = self.store.save_incremental(stream_id, progress, epoch)
        return result

    async def delete(self, stream_id: str) -> bool:
        deleted: bool = self.store.delete(stream_id)  # as returned: the suite checks it is True
        return deleted

    async def list(self) -> builtins.list[Checkpoint]:
        listed: builtins.list[Checkpoint] = self.store.list()
        return listed

    async def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        self.store.rewind(stream_id, token)


def blocking_form(suite: C) -> C:
    """``suite`` with each inherited ``async`` test turned into a plain one that runs it in an
    event loop of its own, its ``store`` argument (the fixture) behind :class:`Blocking`. Plain
    tests, so a blocking store's suite needs no asyncio plugin."""
    for name in dir(suite):
        body = getattr(suite, name)
        if name.startswith("test_") and inspect.iscoroutinefunction(body):
            setattr(suite, name, _blocking_test(body))
    return suite


def _blocking_test(body: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    # wraps() keeps the body's signature (pytest reads the fixtures it asks for) and its marks.
    @functools.wraps(body)
    def test(self: Any, *args: Any, **kwargs: Any) -> None:
        if "store" in kwargs:
            kwargs["store"] = Blocking(kwargs["store"])
        asyncio.run(body(self, *args, **kwargs))

    return test


def race_in_threads(workers: Sequence[Callable[[], Awaitable[T]]]) -> list[T | Exception]:
    """Each worker in a thread and an event loop of its own, released together by a barrier; the
    results (or errors) in the workers' order."""
    barrier = threading.Barrier(len(workers))
    results: list[T | Exception | None] = [None] * len(workers)

    def run(index: int) -> None:
        loop = asyncio.new_event_loop()
        try:
            barrier.wait()
            results[index] = loop.run_until_complete(workers[index]())
        except Exception as exc:
            results[index] = exc
        finally:
            loop.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RACE_TIMEOUT_SECONDS)
        assert not thread.is_alive(), "a racing writer hung"
    return results  # type: ignore[return-value]  # every slot was filled by its thread


async def race_in_tasks(workers: Sequence[Callable[[], Awaitable[T]]]) -> list[T | Exception]:
    """Each worker as a task of the running loop, all started together; the results (or errors)
    in the workers' order."""
    gathered = asyncio.gather(*(worker() for worker in workers), return_exceptions=True)
    results = await asyncio.wait_for(gathered, RACE_TIMEOUT_SECONDS)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
    return list(results)  # type: ignore[arg-type]  # BaseExceptions other than Exception re-raised
