"""One procedure, run on a sync and on an asyncio client, makes the same calls and gets the same result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pymongo.errors import DuplicateKeyError, OperationFailure

from flowwarden.mongo.calls import Procedure, call, find_all, run, run_async


class SyncTarget:
    """Answers like a PyMongo collection; keeps every call it got."""

    def __init__(self, failures: dict[str, BaseException] | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.failures = failures or {}

    def _answer(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append((method, args, kwargs))
        if method in self.failures:
            raise self.failures.pop(method)
        return {"method": method, "args": args}

    def update_one(self, *args: Any, **kwargs: Any) -> Any:
        return self._answer("update_one", args, kwargs)

    def find_one(self, *args: Any, **kwargs: Any) -> Any:
        return self._answer("find_one", args, kwargs)

    def find(self, *args: Any, **kwargs: Any) -> Iterator[int]:
        self._answer("find", args, kwargs)
        return iter([1, 2, 3])

    def close(self) -> None:
        self._answer("close", (), {})


class AsyncTarget(SyncTarget):
    """The same answers as PyMongo's asyncio collection gives them: coroutines, async cursors;
    ``close`` returns a plain value, as motor's does."""

    def __init__(self, failures: dict[str, BaseException] | None = None, gate: asyncio.Event | None = None):
        super().__init__(failures)
        self.gate = gate

    async def update_one(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if self.gate is not None:
            await self.gate.wait()
        return self._answer("update_one", args, kwargs)

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._answer("find_one", args, kwargs)

    def find(self, *args: Any, **kwargs: Any) -> AsyncIterator[int]:  # type: ignore[override]
        self._answer("find", args, kwargs)

        async def documents() -> AsyncIterator[int]:
            for n in (1, 2, 3):
                yield n

        return documents()


def upsert_then_read(target: Any) -> Procedure[tuple[str, list[int]]]:
    """An upsert whose duplicate key is answered by a read, then a closing call in ``finally``."""
    try:
        try:
            yield call(target, "update_one", {"_id": 1}, {"$set": {"a": 1}}, upsert=True)
            outcome = "stored"
        except DuplicateKeyError:
            found = yield call(target, "find_one", {"_id": 1})
            outcome = f"collided with {found['method']}"
        documents = yield find_all(target, {}, sort=[("_id", 1)])
        return outcome, documents
    finally:
        yield call(target, "close")


def both(make: Any, procedure: Any) -> list[tuple[Any, Any]]:
    """``procedure`` run by :func:`run` on a SyncTarget and by :func:`run_async` on an AsyncTarget
    (each made by ``make(cls)``): (result or error, the calls made), for each."""
    outcomes = []
    for runner, cls in ((run, SyncTarget), (run_async, AsyncTarget)):
        target = make(cls)
        try:
            result = runner(procedure(target))
            if asyncio.iscoroutine(result):
                result = asyncio.run(result)
        except Exception as error:
            result = error
        outcomes.append((result, [(m, a, k) for m, a, k in target.calls]))
    return outcomes


def test_the_same_procedure_makes_the_same_calls_on_both_clients() -> None:
    (sync_result, sync_calls), (async_result, async_calls) = both(lambda cls: cls(), upsert_then_read)
    assert sync_result == async_result == ("stored", [1, 2, 3])
    assert sync_calls == async_calls
    assert [m for m, _, _ in sync_calls] == ["update_one", "find", "close"]
    assert sync_calls[0] == ("update_one", ({"_id": 1}, {"$set": {"a": 1}}), {"upsert": True})


def test_a_driver_error_is_thrown_into_the_procedure_which_decides_what_it_means() -> None:
    outcomes = both(lambda cls: cls({"update_one": DuplicateKeyError("E11000")}), upsert_then_read)
    for result, calls in outcomes:
        assert result == ("collided with find_one", [1, 2, 3])
        assert [m for m, _, _ in calls] == ["update_one", "find_one", "find", "close"]


def test_an_error_the_procedure_does_not_catch_ends_it_after_its_finally_ran() -> None:
    outcomes = both(lambda cls: cls({"find": OperationFailure("no", code=2)}), upsert_then_read)
    for result, calls in outcomes:
        assert isinstance(result, OperationFailure) and result.code == 2
        assert [m for m, _, _ in calls] == ["update_one", "find", "close"]


async def test_a_cancelled_procedure_still_makes_the_calls_of_its_finally() -> None:
    gate = asyncio.Event()
    target = AsyncTarget(gate=gate)
    task = asyncio.ensure_future(run_async(upsert_then_read(target)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [m for m, _, _ in target.calls] == ["close"]
