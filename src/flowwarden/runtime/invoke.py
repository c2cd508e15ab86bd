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
from flowwarden.runtime.context import StreamContext


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
    """

    def __init__(
        self,
        bound: Callable[..., Any],
        *,
        is_async: bool,
        wants_ctx: bool,
        ctx: StreamContext,
        policy: RetryPolicy,
        stopping: asyncio.Event,
        threaded: bool,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self._bound = bound
        self._observe = observe
        self._wants_ctx = wants_ctx
        self._ctx = ctx
        self._policy = policy
        self._stopping = stopping
        self._threaded = threaded and not is_async

        # A sync method on the loop needs no coroutine at all: see call_inline().
        self.inline = not is_async and not self._threaded

    def _call_once(self, arg: Any) -> Awaitable[Any] | Any:
        args = (arg, self._ctx) if self._wants_ctx else (arg,)
        if self._threaded:
            return asyncio.to_thread(self._bound, *args)
        return self._bound(*args)

    def call_inline(self, arg: Any) -> BaseException | None:
        """First attempt of an :attr:`inline` (sync, on-loop) method: no await on the hot path.

        Returns None on success, else the error, for :meth:`retry` to take over.
        """
        self._ctx.attempt = 1
        observe = self._observe
        began = time.perf_counter() if observe is not None else 0.0
        try:
            if self._wants_ctx:
                self._bound(arg, self._ctx)
            else:
                self._bound(arg)
        except Exception as error:  # handed to retry(), which applies the policy's rule
            return error
        finally:
            if observe is not None:
                observe(time.perf_counter() - began)
        return None

    async def __call__(self, arg: Any) -> int:
        """Call until success and return how many calls it took; raise :class:`Exhausted` or
        :class:`Interrupted` otherwise."""
        if self.inline:
            error = self.call_inline(arg)
            if error is not None:
                return await self.retry(arg, error)
            return 1
        return await self._attempts(arg, 1)

    async def retry(self, arg: Any, error: BaseException) -> int:
        """Go on after a failed first attempt, under the retry policy; the calls it took in all."""
        await self._backoff_or_give_up(error, 1)
        return await self._attempts(arg, 2)

    async def _attempts(self, arg: Any, attempt: int) -> int:
        while True:
            self._ctx.attempt = attempt
            began = time.perf_counter()
            try:
                result = self._call_once(arg)
                if not self.inline:
                    await result
            except Exception as error:  # the retry rule is RetryPolicy.should_retry(), below
                self._took(began)
                await self._backoff_or_give_up(error, attempt)
                attempt += 1
                continue
            self._took(began)
            return attempt

    def _took(self, began: float) -> None:
        if self._observe is not None:
            self._observe(time.perf_counter() - began)

    async def _backoff_or_give_up(self, error: BaseException, attempt: int) -> None:
        policy = self._policy
        if attempt >= policy.max_attempts or not policy.should_retry(error):
            raise Exhausted(error, attempt) from error
        delay = policy.delay_for(attempt)
        self._ctx.logger.warning(
            "handler failed (attempt %d of %d), retrying in %.2fs: %s: %s",
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
