"""Reading a change stream one batch ahead of the handlers.

A change stream's ``try_next()`` returns buffered events at once and runs a getMore when the
buffer is empty; done in the handlers' loop, every getMore is a round trip during which nothing
is handled, and every batch of handling is time the server sits idle. :class:`ReadAhead` runs
``try_next()`` in a task of its own, so the next getMore is in flight while the handlers work
through the events already read: the server's time and the handlers' time overlap.

What the read loop sees is unchanged, and in stream order: each event, an :class:`EmptyRead`
where ``try_next()`` returned None (with the stream's resume token and liveness taken right
then: a post-batch token is a safe resume point only once every event before it is finished,
which the read loop judges when it reaches the marker), and the error ``try_next()`` raised, in
the place it was raised. Nothing read ahead is acknowledged anywhere: events read but not yet
handled when the loop ends are simply read again from the checkpoint.

A stream that splits large events is read as the opener returns it, joining their fragments
(:mod:`flowwarden.mongo.large_events`): only whole events are queued, and an :class:`EmptyRead` taken while
fragments are held carries no token (one then lies between fragments, never a resume point).
``read_error`` words an error as the stream fails with it (an event over 16 MB without the split
stage names the option that reads it: :meth:`~flowwarden.runtime.opening.StreamOpener.read_error`).

``raw`` readers (streams whose events are ``RawBSONDocument``) keep what they read lean
(:func:`flowwarden.mongo.raw_events.lean`). At most ``limit`` items wait; the reader pauses when that
many do (and the driver holds at most one more batch), so memory stays bounded however far behind
the stream is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from flowwarden._abandoning import cancel_within
from flowwarden.mongo.raw_events import lean


class EmptyRead:
    """``try_next()`` returned None: the stream's resume token and liveness at that moment."""

    __slots__ = ("alive", "token")

    def __init__(self, token: Mapping[str, Any] | None, alive: bool) -> None:
        self.token = token
        self.alive = alive


class FailedRead:
    """``try_next()`` raised ``error``; the reader stopped there."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class ReadAhead:
    """A task reading ``stream`` into a bounded queue; :attr:`items` and :meth:`wait` drain it.

    The read loop takes ``items.popleft()`` while there are items and awaits :meth:`wait`
    otherwise (no coroutine per event on the hot path). Call :meth:`close` when done.
    """

    def __init__(
        self,
        stream: Any,
        limit: int,
        *,
        raw: bool = False,
        read_error: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        self.items: deque[Any] = deque()
        self._raw = raw
        self._read_error = read_error
        self._stream = stream
        self._limit = max(limit, 1)
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(), name="flowwarden-read-ahead")

    async def _read(self) -> None:
        stream, items, ready, limit, raw = self._stream, self.items, self._ready, self._limit, self._raw
        try:
            while True:
                if len(items) >= limit:
                    self._room.clear()
                    await self._room.wait()
                    continue
                change = await stream.try_next()
                if change is None:
                    alive = bool(stream.alive)
                    items.append(EmptyRead(stream.resume_token, alive))
                    ready.set()
                    if not alive:
                        return
                else:
                    # Raw events wait lean: see flowwarden.mongo.raw_events.
                    items.append(lean(change) if raw else change)
                    ready.set()
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # handed to the read loop, which raises it in its place
            items.append(FailedRead(self._read_error(error) if self._read_error is not None else error))
            ready.set()

    async def wait(self) -> Any:
        """The next item, once there is one."""
        items = self.items
        while not items:
            if self._task.done():
                raise RuntimeError("the change stream reader ended without a last item")
            self._room.set()
            self._ready.clear()
            await self._ready.wait()
        return items.popleft()

    def interrupt(self) -> None:
        """Wake a read loop waiting for the next item (a stop): it gets an :class:`EmptyRead`
        with no token, and finds its halt flag set before it reads on."""
        self.items.append(EmptyRead(None, True))
        self._ready.set()

    async def close(self, timeout: float) -> None:
        """Stop reading; what was read ahead and not taken is dropped (read again from the checkpoint).

        A change stream whose read is cancelled closes its cursor before it ends, and that waits
        for a server: the reader gets ``timeout`` seconds to end, then it is abandoned, cancelled
        once more (which ends the close it is in) and its outcome read whenever it ends (the
        server drops an abandoned cursor after its idle timeout).
        """
        await cancel_within(self._task, timeout)
        self.items.clear()
