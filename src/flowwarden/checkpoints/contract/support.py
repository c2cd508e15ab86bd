"""What the contract suites share: sample tokens, racing writers, and how they read records."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from flowwarden.checkpoints.model import Checkpoint
from flowwarden.events import token_data

T = TypeVar("T")

STREAM = "orders"

RACE_TIMEOUT_SECONDS = 60.0


def sample_token(seconds: int, increment: int = 1) -> dict[str, Any]:
    """A resume token shaped like the server's: KeyString cluster time, then the event's key bytes.

    Tokens order by ``(seconds, increment)``, like events in the oplog.
    """
    return {"_data": f"82{seconds:08X}{increment:08X}2B042C0100296E5A1004463D2A5F3C4B"}


def processed_data(checkpoint: Checkpoint | None) -> str | None:
    if checkpoint is None or checkpoint.last_processed_token is None:
        return None
    return token_data(checkpoint.last_processed_token)


def seen_data(checkpoint: Checkpoint | None) -> str | None:
    if checkpoint is None or checkpoint.last_seen_token is None:
        return None
    return token_data(checkpoint.last_seen_token)


def assert_utc(value: datetime | None) -> None:
    assert value is not None
    assert value.tzinfo is not None and value.utcoffset() == timezone.utc.utcoffset(value)


def race(workers: Sequence[Callable[[], T]]) -> list[T | Exception]:
    """Run the workers in threads released together by a barrier; collect results or errors."""
    barrier = threading.Barrier(len(workers))
    results: list[T | Exception | None] = [None] * len(workers)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = workers[index]()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RACE_TIMEOUT_SECONDS)
        assert not thread.is_alive(), "a racing writer hung"
    return [result for result in results if result is not None]


# Owners racing with epochs: owner e saves tokens (round, e + 1) for round 0.., so within a round
# the higher epoch has the newer token and the last round of the highest epoch is the newest.
OWNERS = 4
ROUNDS = 12


def owner_token(round_: int, epoch: int) -> dict[str, Any]:
    return sample_token(2000 + round_, epoch + 1)
