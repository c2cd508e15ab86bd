"""Racing a wait against a reason to stop waiting: the work that loses is abandoned, never
awaited, and its outcome read whenever it ends."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from flowwarden._abandoning import cancel_within, unless_given_up


def run(scenario: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``scenario()``'s result, and what the loop reported as unhandled (a never-retrieved error)."""
    unhandled: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))
        return await scenario()

    return asyncio.run(main()), unhandled


def test_work_that_ends_first_is_returned_with_its_result_or_its_error() -> None:
    async def scenario() -> tuple[Any, Any]:
        give_up = asyncio.Event()
        answered = await unless_given_up(asyncio.sleep(0, "answered"), give_up)

        async def failing() -> None:
            raise ValueError("refused")

        failed = await unless_given_up(failing(), give_up)
        assert answered is not None and failed is not None
        return answered.result(), failed.exception()

    (result, error), unhandled = run(scenario)
    assert result == "answered" and isinstance(error, ValueError) and str(error) == "refused"
    assert unhandled == []


def test_work_given_up_on_is_cancelled_and_its_late_error_is_read() -> None:
    async def scenario() -> tuple[Any, list[str]]:
        give_up, release = asyncio.Event(), asyncio.Event()
        steps: list[str] = []

        async def held() -> None:  # as a driver retrying a write through its cancellation
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                steps.append("cancelled")
            await release.wait()
            steps.append("ended")
            raise RuntimeError("the write failed after all")

        waiting = asyncio.ensure_future(unless_given_up(held(), give_up))
        await asyncio.sleep(0.01)
        give_up.set()
        outcome = await asyncio.wait_for(waiting, 10)
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        return outcome, steps

    (outcome, steps), unhandled = run(scenario)
    assert outcome is None and steps == ["cancelled", "ended"]
    assert unhandled == [], "an abandoned task's error was left unretrieved"


def test_work_is_never_started_once_given_up() -> None:
    started: list[bool] = []

    async def work() -> None:
        started.append(True)

    async def scenario() -> Any:
        give_up = asyncio.Event()
        give_up.set()
        return await unless_given_up(work(), give_up)

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        outcome, unhandled = run(scenario)
        gc.collect()
    assert outcome is None and started == [] and unhandled == []
    assert [str(w.message) for w in warned] == []  # closed: not "coroutine ... was never awaited"


def test_a_waiter_cancelled_abandons_the_work() -> None:
    async def scenario() -> bool:
        work = asyncio.ensure_future(asyncio.Event().wait())
        waiting = asyncio.ensure_future(unless_given_up(work, asyncio.Event()))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)
        return work.cancelled()

    cancelled, unhandled = run(scenario)
    assert cancelled and unhandled == []


def test_a_task_that_ends_when_cancelled_is_waited_for_and_its_error_read() -> None:
    async def scenario() -> list[str]:
        steps: list[str] = []

        async def renewing() -> None:  # ends at once when cancelled, with an error of its own
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                steps.append("cancelled")
                raise RuntimeError("the renewal was interrupted") from None

        task = asyncio.ensure_future(renewing())
        await asyncio.sleep(0)
        await cancel_within(task, 10)
        steps.append("returned" if task.done() else "returned before the task ended")
        return steps

    steps, unhandled = run(scenario)
    assert steps == ["cancelled", "returned"]
    gc.collect()
    assert unhandled == [], "the task's error was left unretrieved"


def test_a_task_whose_cancellation_waits_is_abandoned_after_the_bound() -> None:
    async def scenario() -> tuple[list[str], bool]:
        steps: list[str] = []

        async def closing_a_cursor() -> None:  # as PyMongo closing a cursor with no server to reach
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                steps.append("cancelled")
                await asyncio.Event().wait()  # the close: ended only by a second cancellation
            raise AssertionError("unreachable")

        task = asyncio.ensure_future(closing_a_cursor())
        await asyncio.sleep(0)
        await cancel_within(task, 0.05)
        returned_while_closing = not task.done()
        await asyncio.sleep(0)  # the abandoned task's second cancellation ends it
        await asyncio.sleep(0)
        steps.append("ended" if task.done() else "still running")
        return steps, returned_while_closing

    (steps, returned_while_closing), unhandled = run(scenario)
    assert returned_while_closing and steps == ["cancelled", "ended"]
    assert unhandled == []


def test_the_callers_cancellation_is_raised() -> None:
    async def scenario() -> bool:
        async def stubborn() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.5)

        task = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(cancel_within(task, 10))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return True

    assert run(scenario)[0]
