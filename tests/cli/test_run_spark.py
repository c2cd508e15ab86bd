"""`flowwarden run` of an @on_dataframe class keeps Spark's output out of its own: with JSON logs,
every line on stderr is a JSON object; Spark's lines go to the --spark-log file, or, without one,
through the log as the logger `spark`. Each test starts a JVM in a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import checkpoint_doc, wait_until

pytestmark = pytest.mark.spark

HANDLERS = """
import os
from pathlib import Path

from flowwarden import change_stream, checkpoint, on_dataframe


@change_stream("orders", os.environ["FW_TEST_DB"], name="orders", max_await_time_ms=50)
@checkpoint(save_every_n=1)
class Orders:
    @on_dataframe(max_events=100, max_wait_seconds=0.2)
    def handle(self, df, ctx):
        # A stage that runs 1.5 s: long enough for Spark's console progress bar, were it on.
        spark = df.sparkSession
        spark.range(1).selectExpr("reflect('java.lang.Thread', 'sleep', cast(1500 as bigint))").collect()
        Path(os.environ["FW_TEST_DONE"]).write_text(str(df.count()))
"""


def run_until_handled(tmp_path: Path, uri: str, db: str, client, *flags: str) -> list[str]:
    """Run the handler class with JSON logs until it handled a DataFrame, then stop it (SIGINT);
    the lines it wrote to stderr."""
    (tmp_path / "spark_handlers.py").write_text(HANDLERS)
    done = tmp_path / "done"
    stderr = tmp_path / "stderr"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLOWWARDEN_")}
    command = [sys.executable, "-m", "flowwarden.cli", "run", "spark_handlers:Orders", "--uri", uri]
    with stderr.open("w") as err:
        child = subprocess.Popen(
            [*command, "--log-format", "json", "--spark-conf", "spark.ui.enabled=false", *flags],
            cwd=tmp_path,
            env={**environment, "FW_TEST_DB": db, "FW_TEST_DONE": str(done)},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_until(lambda: checkpoint_doc(client, db) is not None, timeout=60, what="the stream to open")
        client[db].orders.insert_many([{"n": n} for n in range(5)])
        wait_until(done.exists, timeout=240, what="the handler to get its DataFrame")
    finally:
        child.send_signal(signal.SIGINT)
        code = child.wait(60)
    lines = stderr.read_text().splitlines()
    assert code == 0, "\n".join(lines)
    assert done.read_text() == "5"
    return lines


def not_json(lines: list[str]) -> list[str]:
    found = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            found.append(line)
    return found


def test_spark_writes_to_the_spark_log_file_and_stderr_holds_only_json(
    tmp_path, mongodb_uri, client, db_name
):
    lines = run_until_handled(tmp_path, mongodb_uri, db_name, client, "--spark-log", "logs/spark.log")
    assert not_json(lines) == [], "\n".join(not_json(lines))
    spark_log = (tmp_path / "logs" / "spark.log").read_text()
    assert "log4j" in spark_log and " WARN " in spark_log, spark_log  # Spark's own lines, as it writes them
    assert "[Stage" not in spark_log, "Spark's console progress bar is on"
    started = json.loads(next(line for line in lines if "flowwarden run with" in line))
    assert "spark_log=logs/spark.log" in started["message"]
    assert not any(json.loads(line)["logger"] == "spark" for line in lines)


def test_without_a_spark_log_sparks_lines_come_through_the_log_as_json(
    tmp_path, mongodb_uri, client, db_name
):
    lines = run_until_handled(tmp_path, mongodb_uri, db_name, client)
    assert not_json(lines) == [], "\n".join(not_json(lines))
    records = [json.loads(line) for line in lines]
    spark = [record for record in records if record["logger"] == "spark"]
    assert spark, "no line of Spark's came through the log"
    # WARN and above, each without log4j's own time and level; Spark's start-up notes are INFO.
    assert {record["level"] for record in spark} <= {"WARNING", "ERROR", "CRITICAL"}, spark
    assert not any(record["message"].startswith("Setting default log level") for record in spark)
    assert not any("[Stage" in record["message"] for record in spark), spark
