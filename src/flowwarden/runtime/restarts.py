"""When a stream that failed is opened again, and when it fails for good.

Errors are judged by :func:`flowwarden.mongo.failures.classify`: a fatal one fails the stream at once;
a transient one re-opens it with backoff for as long as it lasts; an unknown one re-opens it at
most ``max_restarts`` times in a row, then fails it with
:class:`~flowwarden.errors.RestartsExhaustedError`. The count starts again once a re-opened stream
reads (:meth:`Restarts.reset`), so only errors that keep a stream from reading at all add up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from flowwarden.config import ChangeStreamOptions
from flowwarden.errors import RestartsExhaustedError
from flowwarden.mongo.failures import Failure, classify
from flowwarden.runtime.context import stream_logger


class Restarts:
    """One stream's restart rule and counters."""

    def __init__(self, name: str, options: ChangeStreamOptions, stopping: asyncio.Event) -> None:
        self.name = name
        self._options = options
        self.log = stream_logger(__name__, name)
        self._stopping = stopping
        self.count = 0
        """Re-opens after errors since the stream started."""
        self._in_a_row = 0
        self._unknown_in_a_row = 0

    def reset(self) -> None:
        """The re-opened stream reads: the errors before were not for good."""
        self._in_a_row = 0
        self._unknown_in_a_row = 0

    async def after(self, error: BaseException, restarting: Callable[[str], None]) -> None:
        """Raise ``error`` (or RestartsExhaustedError) when the stream must fail; otherwise call
        ``restarting(error text)`` and wait the backoff (a stop ends the wait)."""
        kind = classify(error)
        if kind is Failure.FATAL:
            raise error
        if kind is Failure.UNKNOWN:
            self._unknown_in_a_row += 1
            limit = self._options.max_restarts
            if limit is not None and self._unknown_in_a_row > limit:
                raise RestartsExhaustedError(
                    self.name, restarts=self._unknown_in_a_row - 1, last_error=error
                ) from error
        self._in_a_row += 1
        self.count += 1
        text = f"{type(error).__name__}: {error}"
        restarting(text)
        delay = self._options.restart_delay_for(self._in_a_row)
        self.log.warning(
            "stream %s: %s (%s error); re-opening from the last saved checkpoint in %.1fs (restart %d)",
            self.name,
            text,
            kind.value,
            delay,
            self.count,
        )
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
        except asyncio.TimeoutError:
            pass


__all__ = ["Restarts"]
