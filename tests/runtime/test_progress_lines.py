"""The progress lines: rates that never go negative across a re-open, and the initial snapshot's
copy reported while it runs (copied of the estimate, the rate, the time left)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import replace

from flowwarden.checkpoints.model import SnapshotProgress
from flowwarden.runtime.observability import (
    Observability,
    ProgressMark,
    copy_progress,
    duration,
    progress_line,
    rates,
)
from flowwarden.runtime.status import StreamState, StreamStatus
from helpers import wait_until_async

RUNNING = StreamStatus(
    name="orders",
    state=StreamState.RUNNING,
    last_processed_time=None,
    last_seen_time=None,
    lag_seconds=0.5,
    events_processed=0,
    events_failed=0,
    restarts=0,
    last_error=None,
    reason=None,
)


def copy(copied: int, total: int | None = 60_000, done: bool = False) -> SnapshotProgress:
    return SnapshotProgress(
        token={"_data": "8266F0A1B2000000012B042C0100296E5A1004AB"},
        namespaces=("shop.orders",),
        namespace="shop.orders",
        copied=copied,
        total=total,
        done=done,
    )


class FakeRunner:
    """What Observability reads of a stream runner, set by the test."""

    def __init__(self, status: StreamStatus) -> None:
        self.name = status.name
        self.current = status
        self.opened: tuple[float, int] | None = None
        self.log = logging.getLogger("flowwarden.runtime.stream")

    def status(self) -> StreamStatus:
        return self.current

    def saved_position(self) -> str:
        return "its opening position"


def progress(runner: FakeRunner) -> Observability:
    """Observability over ``runner`` alone, a line every 50 ms."""
    return Observability(
        lambda: [runner], metrics_host="127.0.0.1", metrics_port=None, progress_interval=0.05
    )


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("stream orders:")]


def test_the_rate_after_a_reopen_is_measured_from_the_reopen():
    # 1,000 handled at the last line; the stream re-opened at t=110 from a checkpoint saying 900,
    # and has handled 60 more since.
    mark = ProgressMark(at=100.0, events=1000, copied=None)
    status = replace(RUNNING, events_processed=960)
    events_rate, copy_rate = rates(mark, 130.0, status, opened=(110.0, 900))
    assert events_rate == 60 / 20 and copy_rate is None
    # Just re-opened, nothing handled again yet: 0, not (900 - 1000) / 30.
    assert rates(mark, 130.0, replace(RUNNING, events_processed=900), opened=(129.0, 900))[0] == 0.0
    # No re-open since the mark: measured from the mark.
    assert rates(mark, 130.0, replace(RUNNING, events_processed=1300), opened=(50.0, 0))[0] == 10.0


async def test_progress_lines_never_show_a_negative_rate_after_a_reopen(caplog):
    caplog.set_level(logging.INFO, logger="flowwarden")
    runner = FakeRunner(replace(RUNNING, events_processed=1000))
    runner.opened = (time.monotonic(), 0)
    task = asyncio.create_task(progress(runner)._progress())
    try:
        await wait_until_async(lambda: len(lines(caplog)) >= 1, what="a first progress line")
        # A re-open: the count starts again from the checkpoint's, lower than before.
        runner.current = replace(RUNNING, events_processed=900)
        runner.opened = (time.monotonic(), 900)
        seen = len(lines(caplog))
        await wait_until_async(lambda: len(lines(caplog)) >= seen + 2, what="two lines after the re-open")
    finally:
        task.cancel()
    shown = [int(re.search(r"(-?\d+) events/s", line).group(1)) for line in lines(caplog)]
    assert all(rate >= 0 for rate in shown), lines(caplog)


async def test_while_the_snapshot_copies_the_line_reports_the_copy(caplog):
    caplog.set_level(logging.INFO, logger="flowwarden")
    starting = replace(RUNNING, state=StreamState.STARTING, lag_seconds=None)
    runner = FakeRunner(replace(starting, snapshot=copy(0)))

    async def copying() -> None:  # 1,000 documents more every 10 ms, as long as the test needs
        copied = 0
        while True:
            await asyncio.sleep(0.01)
            copied += 1000
            runner.current = replace(starting, snapshot=copy(copied, total=100_000_000))

    tasks = [asyncio.create_task(progress(runner)._progress()), asyncio.create_task(copying())]
    try:
        await wait_until_async(lambda: any("left" in line for line in lines(caplog)), what="a time left")
    finally:
        for task in tasks:
            task.cancel()
    line = next(line for line in lines(caplog) if "left" in line)
    assert re.fullmatch(
        r"stream orders: copying the existing documents \(initial snapshot\), [\d,]+ of about "
        r"100,000,000 copied \(\d+%\), [\d,]+ documents/s, about .+ left; the change stream opens once "
        r"the copy is done",
        line,
    ), line
    assert not any("not running" in line or "never opened" in line for line in lines(caplog)), lines(caplog)


def test_the_copy_line_in_words():
    assert copy_progress(12_000, 60_000, 1000.0) == (
        "copying the existing documents (initial snapshot), 12,000 of about 60,000 copied (20%), "
        "1,000 documents/s, about 48 s left; the change stream opens once the copy is done"
    )
    # More copied than estimated, and the first line, before a rate could be measured.
    assert copy_progress(61_000, 60_000, None) == (
        "copying the existing documents (initial snapshot), 61,000 copied; the change stream opens once "
        "the copy is done"
    )
    assert [duration(s) for s in (0.4, 59, 200, 7500)] == ["0 s", "59 s", "3 min 20 s", "2 h 5 min"]


def test_a_finished_copy_gives_the_usual_line():
    status = replace(RUNNING, events_processed=60_000, snapshot=copy(60_000, done=True))
    level, line = progress_line(status, ProgressMark(1.0, 59_000, None), 11.0, (0.0, 0), lambda: "here")
    assert level == logging.INFO
    assert line == "stream orders: RUNNING, 100 events/s, 60000 handled in all, 0.5 s behind; saved at here"
