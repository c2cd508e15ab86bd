"""Racing a wait on a store or a server against a reason to stop waiting for it.

A stream stops waiting for the deployment when it stops, and a committer when it closes or is
interrupted. The work waited for is then abandoned, not awaited: PyMongo may go on retrying a
write through its cancellation, and a server that holds a request without answering would
otherwise hold whoever waits for as long. An abandoned task is cancelled and its outcome read
whenever it ends, so asyncio does not warn about it.
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


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task``, which nobody awaits any more, and retrieve its outcome whenever it ends
    so that asyncio does not warn."""
    task.cancel()
    task.add_done_callback(_consume_outcome)


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


__all__ = ["abandon", "unless_given_up"]
