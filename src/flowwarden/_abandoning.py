"""Racing a wait on a store or a server against a reason to stop waiting for it.

A stream stops waiting for the deployment when it stops, and a committer when it closes or is
interrupted. The work waited for is then abandoned, not awaited: PyMongo may go on retrying a
write through its cancellation, and a server that holds a request without answering would
otherwise hold whoever waits for as long. An abandoned task is cancelled and its outcome read
whenever it ends, so asyncio does not warn about it. A task being ended is given a bound to end
in (:func:`cancel_within`) for the same reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def unless_given_up(work: Awaitable[T], give_up: asyncio.Event) -> asyncio.Future[T] | None:
    """Run ``work`` until it ends or ``give_up`` is set, whichever comes first.

    Returns ``work``'s ended task, its result or error to be read, or None when ``give_up`` came
    first: ``work`` is then abandoned (see :func:`abandon`), or never started when ``give_up``
    was set already. A caller cancelled while waiting abandons ``work`` too.
    """
    if give_up.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        return None
    task = asyncio.ensure_future(work)
    given_up = asyncio.ensure_future(give_up.wait())
    try:
        await asyncio.wait((task, given_up), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        abandon(task)
        raise
    finally:
        given_up.cancel()
    if task.done():
        return task
    abandon(task)
    return None


async def cancel_within(task: asyncio.Future[Any], timeout: float) -> None:
    """Cancel ``task`` and give it ``timeout`` seconds to end; then it is abandoned (see
    :func:`abandon`). Its outcome is read either way, never raised; the caller's cancellation is.

    For a task whose cancellation may itself wait for a server: PyMongo closes a change stream's
    or a cursor's server-side cursor when the read that holds it is cancelled, and with the
    deployment out of reach that close waits as long as server selection lasts.
    """
    task.cancel()
    # wait(), not await: never raises the task's CancelledError; the caller's, yes.
    ended, _ = await asyncio.wait({task}, timeout=timeout)
    if ended:
        _consume_outcome(task)
    else:
        abandon(task)


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task``, which nobody awaits any more, and retrieve its outcome whenever it ends
    so that asyncio does not warn."""
    task.cancel()
    task.add_done_callback(_consume_outcome)


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


__all__ = ["abandon", "cancel_within", "unless_given_up"]
