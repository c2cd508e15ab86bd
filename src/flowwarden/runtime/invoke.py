"""Calling a handler method under its retry policy.

The one rule for what is retried is :meth:`RetryPolicy.should_retry`: an ``Exception`` of the
policy's ``retry_on`` classes and of none of its ``no_retry_on`` classes, while attempts remain. Cancellation
and ``BaseException``s that are not ``Exception`` (KeyboardInterrupt, SystemExit) are never caught.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from flowwarden.config import RetryPolicy
from flowwarden.runtime.context import StreamContext, stream_logger


class Exhausted(Exception):
    """A handler call failed for good: retries are used up or the error is not retryable."""

    def __init__(self, error: BaseException, attempts: int) -> None:
        super().__init__(f"{type(error).__name__}: {error} (after {attempts} attempt(s))")
        self.error = error
        self.attempts = attempts


class Interrupted(Exception):
    """The stream is stopping while a failed call waited for its next attempt."""


class Invoker:
    """Binds one handler method of one handler instance to its calling convention.

    Sync methods run inline on the stream's event loop when the stream handles one event at a
    time (no thread hop on the hot path), and in worker threads when ``threaded`` is set (streams
    with ``max_concurrency > 1``), so that they really run side by side.

    A method that takes ``ctx`` gets the context of its own event: the caller makes it with
    :meth:`context` and passes it to every attempt, then reads its save request.
    """

    def __init__(
        self,
        bound: Callable[..., Any],
        *,
        is_async: bool,
        wants_ctx: bool,
        stream: str,
        policy: RetryPolicy,
        stopping: asyncio.Event,
        threaded: bool,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self._bound = bound
        self._observe = observe
        self._wants_ctx = wants_ctx
        self._stream = stream
        self._logger = stream_logger(__name__, stream)
        # For log lines: "OrdersHandler.created", also for classes defined inside a function.
        self._method = getattr(bound, "__qualname__", "the handler").rsplit("<locals>.", 1)[-1]
        self._policy = policy
        self._stopping = stopping
        self._threaded = threaded and not is_async

        # A sync method on the loop needs no coroutine at all: see call_inline().
        self.inline = not is_async and not self._threaded

    def context(self, batch_id: str | None = None) -> StreamContext | None:
        """A new context for one event or batch; None when the method takes none (no cost)."""
        if not self._wants_ctx:
            return None
        return StreamContext(self._stream, self._logger, 1, batch_id)

    def _call_once(self, arg: Any, ctx: StreamContext | None) -> Awaitable[Any] | Any:
        args = (arg,) if ctx is None else (arg, ctx)
        if self._threaded:
            return asyncio.to_thread(self._bound, *args)
        return self._bound(*args)

    def call_inline(self, arg: Any, ctx: StreamContext | None) -> BaseException | None:
        """First attempt of an :attr:`inline` (sync, on-loop) method: no await on the hot path.

        Returns None on success, else the error, for :meth:`retry` to take over.
        """
        observe = self._observe
        began = time.perf_counter() if observe is not None else 0.0
        try:
            if ctx is None:
                self._bound(arg)
            else:
                self._bound(arg, ctx)
        except Exception as error:  # handed to retry(), which applies the policy's rule
            return error
        finally:
            if observe is not None:
                observe(time.perf_counter() - began)
        return None

    async def __call__(self, arg: Any, ctx: StreamContext | None = None) -> int:
        """Call until success and return how many calls it took; raise :class:`Exhausted` or
        :class:`Interrupted` otherwise. ``ctx``: the event's context (from :meth:`context`)."""
        if self.inline:
            error = self.call_inline(arg, ctx)
            if error is not None:
                return await self.retry(arg, error, ctx)
            return 1
        return (await self._attempts(arg, 1, ctx))[0]

    async def retry(self, arg: Any, error: BaseException, ctx: StreamContext | None = None) -> int:
        """Go on after a failed first attempt, under the retry policy; the calls it took in all."""
        return (await self.retry_for_result(arg, error, ctx))[0]

    async def retry_for_result(
        self, arg: Any, error: BaseException, ctx: StreamContext | None = None
    ) -> tuple[int, Any]:
        """:meth:`retry`, and what the call that succeeded returned."""
        await self._backoff_or_give_up(error, 1)
        return await self._attempts(arg, 2, ctx)

    async def _attempts(self, arg: Any, attempt: int, ctx: StreamContext | None) -> tuple[int, Any]:
        while True:
            if ctx is not None:
                ctx.attempt = attempt  # attempts of one event run one after another
            began = time.perf_counter()
            try:
                result = self._call_once(arg, ctx)
                if not self.inline:
                    result = await result
            except Exception as error:  # the retry rule is RetryPolicy.should_retry(), below
                self._took(began)
                await self._backoff_or_give_up(error, attempt)
                attempt += 1
                continue
            self._took(began)
            return attempt, result

    def _took(self, began: float) -> None:
        if self._observe is not None:
            self._observe(time.perf_counter() - began)

    async def _backoff_or_give_up(self, error: BaseException, attempt: int) -> None:
        policy = self._policy
        if attempt >= policy.max_attempts or not policy.should_retry(error):
            raise Exhausted(error, attempt) from error
        delay = policy.delay_for(attempt)
        self._logger.warning(
            "stream %s: %s failed (attempt %d of %d), retrying in %.2fs: %s: %s",
            self._stream,
            self._method,
            attempt,
            policy.max_attempts,
            delay,
            type(error).__name__,
            error,
        )
        if await _wait_or_stop(self._stopping, delay):
            raise Interrupted() from error


async def _wait_or_stop(stopping: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds; True if the stream began stopping meanwhile."""
    if stopping.is_set():
        return True
    try:
        await asyncio.wait_for(stopping.wait(), delay)
    except asyncio.TimeoutError:
        return False
    return True
