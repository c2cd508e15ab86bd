"""SaveHealth: when a stream is reported unable to save, from when, and what clears it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from flowwarden.errors import CheckpointError
from flowwarden.runtime import save_health
from flowwarden.runtime.metrics import StreamMetrics
from flowwarden.runtime.save_health import SaveHealth, one_line

WALL = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


class Clock:
    """Both clocks SaveHealth reads, moved by hand: ``monotonic`` seconds, and the wall clock."""

    def __init__(self) -> None:
        self.seconds = 1000.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self, tz: timezone) -> datetime:
        return WALL + timedelta(seconds=self.seconds - 1000.0)

    def at(self, seconds: float) -> datetime:
        """The wall-clock time of a monotonic reading."""
        return WALL + timedelta(seconds=seconds - 1000.0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(save_health, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(save_health, "datetime", SimpleNamespace(now=clock.now))
    return clock


def test_a_failed_save_shows_once_the_grace_passed_counted_from_when_its_write_began(clock):
    health = SaveHealth(None)
    clock.seconds = 1003.0
    health.failed(CheckpointError("stream 'orders': checkpoint save failed: timed out"), began=1001.0)
    assert health.failures == 1
    assert health.error == "CheckpointError: stream 'orders': checkpoint save failed: timed out"
    clock.seconds = 1001.0 + save_health.SAVE_GRACE_SECONDS - 0.1
    assert health.cannot_save_since(None) is None
    clock.seconds = 1001.0 + save_health.SAVE_GRACE_SECONDS
    assert health.cannot_save_since(None) == clock.at(1001.0)


def test_a_write_the_store_does_not_answer_counts_from_when_it_began(clock):
    health = SaveHealth(None)
    clock.seconds = 1000.0 + save_health.SAVE_GRACE_SECONDS
    assert health.cannot_save_since(1000.0) == clock.at(1000.0)
    assert health.cannot_save_since(1000.5) is None  # still within the grace
    assert health.failures == 0 and health.error is None


def test_failures_carry_over_to_the_next_committer_and_only_a_success_clears_them(clock):
    metrics = StreamMetrics()
    health = SaveHealth(metrics)
    health.failed(OSError("first run"), began=990.0)
    # The stream re-opened with a new committer, whose own first write began later and failed too.
    health.failed(OSError("second run"), began=995.0)
    clock.seconds = 1020.0
    assert health.cannot_save_since(995.0) == clock.at(990.0)
    assert (health.failures, health.error) == (2, "OSError: second run")
    health.saved(0.01)
    assert health.cannot_save_since(None) is None
    assert (health.failures, health.error) == (0, None)
    assert (metrics.saves, metrics.save_failures) == (1, 2)


def test_the_error_is_one_line_with_uri_passwords_hidden_and_bounded():
    error = CheckpointError("cannot write to mongodb://app:Hunter2xyz@db1:27017/?replicaSet=rs0\n  timed out")
    assert one_line(error) == (
        "CheckpointError: cannot write to mongodb://app:***@db1:27017/?replicaSet=rs0 timed out"
    )
    long = one_line(OSError("x" * 2000))
    assert len(long) == 500 and long.endswith("…")
