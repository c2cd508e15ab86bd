"""Handling up to ``max_concurrency`` events at once without reordering any one document's events.

Events with the same ``documentKey`` run one after another, in stream order; an event without one
(drop, rename...) waits for everything before it. At most ``concurrency`` handlers are in flight,
so memory stays flat however far behind the stream is. A handler task that fails makes
:attr:`KeyedScheduler.error` the stream's error; the events after a failed one of the same
document do not run (they stay unfinished, so the checkpoint stays before them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import bson

Handle = Callable[[int, MutableMapping[str, Any]], Awaitable[None]]


class KeyedScheduler:
    """Runs ``handle(sequence, change)`` concurrently, per-key ordered, ``concurrency`` at most."""

    def __init__(self, concurrency: int, on_error: Callable[[], None]) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._on_error = on_error
        self._in_flight: set[asyncio.Task[None]] = set()
        self._key_tails: dict[bytes, asyncio.Task[None]] = {}
        self.error: BaseException | None = None
        """The first error a handler task raised; the read loop raises it at its next turn."""

    def busy(self) -> bool:
        """Whether a handler is still running."""
        return bool(self._in_flight)

    async def spawn(self, sequence: int, change: MutableMapping[str, Any], handle: Handle) -> None:
        """Start handling an event once a slot is free and its document's earlier events are done."""
        await self._slots.acquire()
        key_doc = change.get("documentKey")
        key = bson.encode(key_doc) if isinstance(key_doc, Mapping) else None
        before: asyncio.Task[None] | None
        if key is None:
            # Not a document event (drop, rename...): a barrier after everything before it.
            before = None
            await self.wait_all()
        else:
            before = self._key_tails.get(key)
        task = asyncio.create_task(self._run_after(before, sequence, change, handle))
        self._in_flight.add(task)
        if key is not None:
            self._key_tails[key] = task
        task.add_done_callback(lambda done: self._done(done, key))

    async def wait_all(self) -> None:
        """Wait until every handler in flight has finished, failed or been cancelled."""
        if self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)

    @staticmethod
    async def _run_after(
        before: asyncio.Task[None] | None, sequence: int, change: MutableMapping[str, Any], handle: Handle
    ) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
            if before.cancelled() or before.exception() is not None:
                return  # the same document's earlier event failed: stay behind it, in order
        await handle(sequence, change)

    def _done(self, task: asyncio.Task[None], key: bytes | None) -> None:
        self._in_flight.discard(task)
        if key is not None and self._key_tails.get(key) is task:
            del self._key_tails[key]
        self._slots.release()
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()
            self._on_error()


__all__ = ["KeyedScheduler"]
