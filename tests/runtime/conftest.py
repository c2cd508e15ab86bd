"""Helpers for end-to-end connector tests."""

from __future__ import annotations

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
