"""``flowwarden demo``: live progress on a terminal, one line per run elsewhere, a summary table,
and the check by id that every change written arrived once."""

from __future__ import annotations

import io
import logging
import re

import pytest
from rich.console import Console

from flowwarden.cli.demo import PANEL_WIDTH, _Demo, _Run, run_demo

# Two runs of 300 inserts, 100 updates and 30 deletes each.
PER_RUN = 430


def test_without_a_terminal_each_run_gets_its_lines_and_the_summary_a_table(tmp_path, capsys):
    assert run_demo(events=300, output=str(tmp_path / "demo"), use_spark=False) == 0
    out, err = capsys.readouterr()
    for run in (1, 2):
        lines = re.search(rf"^run {run}: (.*)\n(.*)$", err, flags=re.M)
        assert lines, err
        counts = rf"{PER_RUN} written, {PER_RUN} delivered, [\d,]+/s, \d+ batch(es)?"
        assert re.fullmatch(counts, lines.group(1)), lines.group(1)
        saved = rf"caught up; checkpoint saved: {run * PER_RUN} changes, at \d\d:\d\d:\d\d"
        assert re.fullmatch(rf" +{saved}", lines.group(2)), lines.group(2)
    rows = [line for line in out.splitlines() if line.startswith("│")]
    first, second = ([cell.strip() for cell in row.strip("│").split("│")] for row in rows)
    assert first[:3] == ["1", "no: new", f"{PER_RUN}"] and first[5].startswith(f"{PER_RUN} at ")
    assert second[:3] == ["2", f"after {PER_RUN}", f"{PER_RUN}"]
    assert second[5].startswith(f"{2 * PER_RUN} at ")
    assert f"ok: every one of {2 * PER_RUN} changes delivered exactly once" in out


def test_on_a_terminal_a_live_panel_shows_the_runs_and_the_metrics_endpoint(
    tmp_path, capsys, monkeypatch, caplog
):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats the captured stderr as a terminal
    monkeypatch.setenv("COLUMNS", "200")
    caplog.set_level(logging.INFO, logger="flowwarden")
    handlers = logging.getLogger().handlers[:]
    assert run_demo(events=300, output=str(tmp_path / "demo"), use_spark=False) == 0
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().err)  # without the terminal codes
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", err)
    assert f"run 2: {PER_RUN} written, {PER_RUN} delivered" in err
    assert "stopped gracefully" in err  # log lines print above the panel
    assert logging.getLogger().handlers == handlers  # and go back to where they were afterwards


def panel_text(demo: _Demo, width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(demo.panel())
    return console.export_text()


def test_the_panel_fits_80_columns_and_says_where_each_run_is():
    demo = _Demo("mongodb://127.0.0.1:27017/", None, None, spark=object())  # type: ignore[arg-type]
    demo.metrics = "http://127.0.0.1:45678/metrics"
    starting = _Run(1, "no: new", written=100_000, delivered=0, seconds=14.0, behind=13.2, batches=0)
    demo.runs = [starting]
    text = panel_text(demo, PANEL_WIDTH)
    assert "Spark is starting" in text and "behind" not in text, text  # not "0 delivered, 13 s behind"

    first = _Run(1, "no: new", written=100_000, delivered=100_000, seconds=9.5, behind=0.4, batches=1_000)
    first.writing, first.saved = False, (100_000, "12:00:01")
    second = _Run(2, "after 100,000", written=123_456, delivered=99_999, seconds=0.5, behind=123.4, batches=7)
    second.saved = (199_999, "12:00:09")
    third = _Run(3, "after 199,999", written=10, delivered=0, seconds=0.1, behind=None, batches=0)
    demo.runs = [first, second, third]
    text = panel_text(demo, PANEL_WIDTH)
    assert text == panel_text(demo, 400), "a line was wrapped at 80 columns"
    assert max(len(line) for line in text.splitlines()) <= PANEL_WIDTH, text
    assert text.splitlines() == [
        "metrics: http://127.0.0.1:45678/metrics",
        "run 1: 100,000 written, 100,000 delivered, 10,526/s, 1,000 batches",
        "       caught up; checkpoint saved: 100,000 changes, at 12:00:01",
        "run 2: 123,456 written, 99,999 delivered, 199,998/s, 7 batches",
        "       123.4 s behind; checkpoint saved: 199,999 changes, at 12:00:09",
        "run 3: 10 written, 0 delivered, 0/s, 0 batches",
        "       not reading yet; checkpoint: none saved yet",
    ]


@pytest.mark.parametrize("events", [1, 9])
def test_few_orders_still_make_two_checked_runs(tmp_path, capsys, events):
    assert run_demo(events=events, output=str(tmp_path / "demo"), use_spark=False) == 0
    assert "ok: every one of" in capsys.readouterr().out
