"""What happens to events whose handling failed for good: the retry policy's ``on_exhausted``.

STOP raises :class:`~flowwarden.errors.HandlerError`, so the stream fails with its checkpoint
still before the events; SKIP logs them and lets them count as finished; DEAD_LETTER writes each
to the dead-letter collection first (if that write fails, the stream stops as with STOP). Events
a DataFrame schema refused under DROPMALFORMED are dead-lettered the same way. Every event given
up on counts in :attr:`GivingUp.failed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo.errors import PyMongoError

from flowwarden.config import OnError
from flowwarden.errors import HandlerError, SchemaMismatchError
from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.dead_letter import DeadLetterWriter
from flowwarden.runtime.metrics import StreamMetrics


class GivingUp:
    """Applies one stream's ``on_exhausted`` and counts the events it gave up on."""

    def __init__(
        self,
        name: str,
        policy: OnError,
        dead_letters: DeadLetterWriter | None,
        metrics: StreamMetrics | None = None,
    ) -> None:
        self.name = name
        self._policy = policy
        self._dead_letters = dead_letters
        self.log = stream_logger(__name__, name)
        self.failed = 0
        self._metrics = metrics

    def _count(self, changes: list[Mapping[str, Any]], outcome: str) -> None:
        self.failed += len(changes)
        if self._metrics is not None:
            for change in changes:
                self._metrics.handled(str(change.get("operationType", "")), outcome)
            if outcome == "dead_lettered":
                self._metrics.dead_letters += len(changes)

    async def give_up(self, changes: list[Mapping[str, Any]], error: BaseException, attempts: int) -> None:
        """Returns when the events may count as finished (skipped or dead-lettered); raises
        HandlerError when the stream must stop with the checkpoint still before them."""
        token = plain_token(changes[0].get("_id")) if changes else None
        if self._policy == OnError.STOP:
            self._count(changes, "failed")
            raise HandlerError(self.name, token=token, attempts=attempts, cause=error) from error
        if self._policy == OnError.SKIP:
            self._count(changes, "skipped")
            self.log.warning(
                "stream %s: skipping %d event(s) from %r after %d attempt(s): %s: %s",
                self.name,
                len(changes),
                token,
                attempts,
                type(error).__name__,
                error,
                extra={"token": token},
            )
            return
        assert self._dead_letters is not None
        try:
            for change in changes:
                await self._dead_letters.write(
                    stream=self.name, event=change, token=change.get("_id"), error=error, attempts=attempts
                )
        except PyMongoError as dlq_error:
            self._count(changes, "failed")
            raise HandlerError(self.name, token=token, attempts=attempts, cause=error) from dlq_error
        self._count(changes, "dead_lettered")
        self.log.warning(
            "stream %s: %d event(s) from %r dead-lettered after %d attempt(s): %s",
            self.name,
            len(changes),
            token,
            attempts,
            error,
            extra={"token": token},
        )

    async def park_malformed(self, dropped: list[tuple[Mapping[str, Any], Any]]) -> None:
        """Dead-letter the events DROPMALFORMED left out of a DataFrame; they count as failed."""
        assert self._dead_letters is not None
        for change, row in dropped:
            error = SchemaMismatchError(field=row.field, token=row.token, index=row.index, reason=row.error)
            try:
                await self._dead_letters.write(
                    stream=self.name, event=change, token=change.get("_id"), error=error, attempts=1
                )
            except PyMongoError as dlq_error:
                self._count([change], "failed")
                raise HandlerError(
                    self.name, token=plain_token(change.get("_id")), attempts=1, cause=error
                ) from dlq_error
        self._count([change for change, _ in dropped], "dead_lettered")
        self.log.warning(
            "stream %s: %d event(s) did not fit the DataFrame schema and were dead-lettered",
            self.name,
            len(dropped),
        )

    async def undecodable(
        self, change: Mapping[str, Any] | bytes, error: BaseException, *, in_batch: bool
    ) -> dict[str, Any]:
        """Give up at once (decoding again cannot help) on an event whose BSON cannot be decoded:
        a raw event, or its bytes. Returns what could be read of it."""
        where = "an event of a DataFrame batch" if in_batch else "an event"
        self.log.error("stream %s: %s cannot be decoded: %s", self.name, where, error)
        if isinstance(change, bytes):
            data = change
        else:
            data = bytes(change.raw) if isinstance(change, RawBSONDocument) else bson.encode(change)
        event = readable(data)
        await self.give_up([event], error, attempts=1)
        return event


def plain_token(token: Any) -> Any:
    """A token for messages and errors: a raw event's ``_id`` as a plain dict."""
    return dict(token) if isinstance(token, RawBSONDocument) else token


def readable(data: bytes) -> dict[str, Any]:
    """What can be read of an event that cannot be decoded, for the dead-letter queue: the
    document with undecodable text escaped, or else its ``_id`` and its bytes as they came."""
    try:
        document: dict[str, Any] = bson.decode(
            data, codec_options=CodecOptions(tz_aware=True, unicode_decode_error_handler="backslashreplace")
        )
        return document
    except Exception:  # damaged beyond text: keep the bytes, they are all there is
        token = RawBSONDocument(data)["_id"]
        return {"_id": dict(token), "undecodableBson": bson.Binary(data)}


__all__ = ["GivingUp", "plain_token", "readable"]
