"""The dead-letter queue: events whose handling was given up on, kept for inspection and replay.

A dead letter is written BEFORE the stream moves past its event; if the write fails the caller must
not advance the checkpoint (the event is then neither handled nor parked, and must come again).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from flowwarden.events import token_cluster_time


class DeadLetterWriter:
    """Writes dead letters to one collection, with a TTL index on ``failedAt``."""

    def __init__(self, collection: Any, retention_days: float) -> None:
        self._coll = collection
        self._retention_seconds = int(retention_days * 86400)
        self._index_ready = False

    async def _ensure_index(self) -> None:
        if self._index_ready:
            return
        await self._coll.create_index(
            "failedAt", expireAfterSeconds=self._retention_seconds, name="fw_dlq_ttl"
        )
        self._index_ready = True

    async def write(
        self,
        *,
        stream: str,
        event: Mapping[str, Any] | None,
        token: Mapping[str, Any] | None,
        error: BaseException,
        attempts: int,
    ) -> None:
        await self._ensure_index()
        cluster_time = None
        if token is not None:
            try:
                cluster_time = token_cluster_time(token)
            except ValueError:
                cluster_time = None
        await self._coll.insert_one(
            {
                "stream": stream,
                "token": dict(token) if token is not None else None,
                "clusterTime": cluster_time,
                "event": dict(event) if event is not None else None,
                "errorType": f"{type(error).__module__}.{type(error).__qualname__}",
                "message": str(error),
                "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
                "attempts": attempts,
                "failedAt": datetime.now(timezone.utc),
            }
        )
