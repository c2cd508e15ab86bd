"""get_or_create_session: Python workers run this interpreter, Arrow is on, timestamps show in UTC."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from flowwarden.errors import ConfigurationError
from flowwarden.spark import get_or_create_session, register

pytestmark = pytest.mark.spark


def test_the_session_is_shared_and_configured(spark: SparkSession) -> None:
    assert get_or_create_session() is spark  # an active session is returned, not a second one
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_a_running_session_keeps_the_interpreter_settings_it_started_with(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session the user built (a notebook's, a cluster's) is used as it is: flowwarden does
    not point its Python workers elsewhere."""
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/cluster/python")
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON")
    assert get_or_create_session("local[2]") is spark
    assert os.environ["PYSPARK_PYTHON"] == "/opt/cluster/python"
    assert "PYSPARK_DRIVER_PYTHON" not in os.environ


def test_the_streaming_source_names_the_pyspark_it_needs(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", "4.1.1")
    needs = r"needs PySpark 4\.2 or newer; this process runs PySpark 4\.1\.1"
    with pytest.raises(ConfigurationError, match=needs):
        register(spark)
    monkeypatch.setattr(pyspark, "__version__", "4.2.0.dev1")
    register(spark)


def test_python_workers_import_flowwarden(spark: SparkSession) -> None:
    def probe(_: object) -> list[str]:
        import flowwarden.spark.convert.arrow

        return [sys.executable, flowwarden.spark.convert.arrow.__name__]

    executable, module = spark.sparkContext.parallelize([0], 1).map(probe).first()
    assert executable == sys.executable
    assert module == "flowwarden.spark.convert.arrow"


@pytest.mark.slow
def test_jvm_log_takes_the_jvms_output_and_leaves_this_process_stderr_as_it_was(tmp_path: Path) -> None:
    # A JVM of its own, so in a process of its own (this run's JVM is already up).
    log = tmp_path / "logs" / "spark.log"
    script = f"""
import sys
from flowwarden.spark import get_or_create_session
spark = get_or_create_session("local[1]", conf={{"spark.ui.enabled": "false"}}, jvm_log={str(log)!r})
print("python still writes to stderr", file=sys.stderr)
assert spark.range(3).count() == 3
spark.sparkContext._jvm.System.err.println("the JVM writes to its log")
spark.stop()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "python still writes to stderr"
    jvm = log.read_text()
    assert "log4j" in jvm and "the JVM writes to its log" in jvm
