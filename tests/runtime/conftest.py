"""Helpers for end-to-end connector tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pymongo

from flowwarden import Connector


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@contextmanager
def running(uri: str, handlers: list[type], **kwargs: Any) -> Iterator[Connector]:
    connector = Connector(uri, handlers, **kwargs)
    connector.start()
    try:
        yield connector
    finally:
        connector.stop(timeout=30)


def checkpoint_doc(client: pymongo.MongoClient[Any], db: str, stream: str) -> dict[str, Any] | None:
    doc: dict[str, Any] | None = client[db]["_fw_checkpoints"].find_one({"_id": stream})
    return doc


async def wait_until_async(
    predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition"
) -> Any:
    """wait_until for tests running on an event loop (the connector shares the loop)."""
    for _ in range(int(timeout / 0.02)):
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
