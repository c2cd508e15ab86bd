"""``flowwarden demo``: live progress on a terminal, one line per run elsewhere, a summary table,
and the check by id that every change written arrived once."""

from __future__ import annotations

import logging
import re

import pytest

from flowwarden.cli.demo import run_demo

# Two runs of 300 inserts, 100 updates and 30 deletes each.
PER_RUN = 430


def test_without_a_terminal_each_run_gets_one_line_and_the_summary_a_table(tmp_path, capsys):
    assert run_demo(events=300, output=str(tmp_path / "demo"), use_spark=False) == 0
    out, err = capsys.readouterr()
    for run in (1, 2):
        line = re.search(rf"^run {run}: (.*)$", err, flags=re.M)
        assert line, err
        assert line.group(1).startswith(f"{PER_RUN} written, {PER_RUN} delivered, ")
        assert re.search(r"\d+ batch(es)?, checkpoint [\d,]+ @ \d\d:\d\d:\d\d$", line.group(1))
    rows = [line for line in out.splitlines() if line.startswith("│")]
    first, second = ([cell.strip() for cell in row.strip("│").split("│")] for row in rows)
    assert first[:3] == ["1", "no: new", f"{PER_RUN}"] and first[5].startswith(f"{PER_RUN} @ ")
    assert second[:3] == ["2", f"after {PER_RUN}", f"{PER_RUN}"] and second[5].startswith(f"{2 * PER_RUN} @ ")
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


@pytest.mark.parametrize("events", [1, 9])
def test_few_orders_still_make_two_checked_runs(tmp_path, capsys, events):
    assert run_demo(events=events, output=str(tmp_path / "demo"), use_spark=False) == 0
    assert "ok: every one of" in capsys.readouterr().out
