"""Waiting on the deployment without holding a stop.

A stop lets the handlers in flight finish and saves their positions; what a stream merely waits
for from the deployment (a lease, the opening position, an initial or requested snapshot's reads
and progress writes) is given up on as soon as the stop is asked for. Given up on means
abandoned, not awaited: PyMongo may go on retrying a write through its cancellation, and a
server that holds a request without answering would otherwise hold the stop for as long.
Whatever was abandoned is done again after a restart (a snapshot's chunk in hand at most).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from flowwarden.checkpoints.committer import abandon_task

T = TypeVar("T")


class StopRequested(Exception):
    """A stop was asked for while the stream waited on the deployment; the wait was abandoned."""


async def unless_stopping(work: Awaitable[T], stopping: asyncio.Event) -> T:
    """``work``'s result; raises :class:`StopRequested` as soon as ``stopping`` is set, leaving
    ``work`` cancelled and abandoned."""
    if stopping.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        raise StopRequested("a stop was asked for while the stream waited on the deployment")
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        abandon_task(task)
        raise
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    abandon_task(task)
    raise StopRequested("a stop was asked for while the stream waited on the deployment")


__all__ = ["StopRequested", "unless_stopping"]
