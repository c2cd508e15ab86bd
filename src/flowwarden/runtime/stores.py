"""The runtime's view of a checkpoint store: sync and async stores awaited the same way."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from flowwarden.checkpoint import Checkpoint
from flowwarden.events import ResumeToken


class AsyncStore:
    """Awaitable calls on any checkpoint store.

    An async store's coroutines are awaited; a sync store's blocking calls run in a worker thread,
    unless the store declares itself non-blocking (``nonblocking = True``): then they run inline.
    """

    def __init__(self, store: Any) -> None:
        self.raw = store
        self._async = inspect.iscoroutinefunction(getattr(store, "load", None))
        self._inline = not self._async and getattr(store, "nonblocking", False) is True

    async def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self.raw, name)
        if self._async:
            return await method(*args)
        if self._inline:
            return method(*args)
        return await asyncio.to_thread(method, *args)

    async def load(self, stream_id: str) -> Checkpoint | None:
        result: Checkpoint | None = await self._call("load", stream_id)
        return result

    async def save(self, checkpoint: Checkpoint) -> Any:
        return await self._call("save", checkpoint)

    async def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> Any:
        return await self._call("save_seen", stream_id, token, epoch)

    async def list(self) -> list[Checkpoint]:
        result: list[Checkpoint] = await self._call("list")
        return result

    async def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        await self._call("rewind", stream_id, token)

    async def delete(self, stream_id: str) -> bool:
        return bool(await self._call("delete", stream_id))
