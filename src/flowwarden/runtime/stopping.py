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

from flowwarden._abandoning import unless_given_up

T = TypeVar("T")


class StopRequested(Exception):
    """A stop was asked for while the stream waited on the deployment; the wait was abandoned."""


async def unless_stopping(work: Awaitable[T], stopping: asyncio.Event) -> T:
    """``work``'s result; raises :class:`StopRequested` as soon as ``stopping`` is set, leaving
    ``work`` cancelled and abandoned (:func:`flowwarden._abandoning.unless_given_up`)."""
    task = await unless_given_up(work, stopping)
    if task is None:
        raise StopRequested("a stop was asked for while the stream waited on the deployment")
    return task.result()


__all__ = ["StopRequested", "unless_stopping"]
