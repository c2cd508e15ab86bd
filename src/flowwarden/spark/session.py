"""The SparkSession flowwarden uses when it is not handed one.

Python workers that Spark starts must import flowwarden (the streaming source runs in them), so
when this call starts Spark for a local master, ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``
are set to the interpreter running this code. For a cluster master they are only filled in when
unset: there the workers' interpreter is the cluster's business. When Spark already runs (a
session the user built, a notebook's), neither is touched.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowwarden.errors import JavaNotFoundError
from flowwarden.spark._extra import require

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_CONF", "find_java", "get_or_create_session", "require_java"]

DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Change events carry UTC instants; showing them in UTC avoids reading a shifted wall clock.
    "spark.sql.session.timeZone": "UTC",
}
"""Settings applied before ``conf`` (which overrides them)."""


def find_java() -> str | None:
    """The java Spark would start: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else the one on
    PATH; None when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def require_java(purpose: str, without: str | None = None) -> str:
    """The java for Spark, or :class:`~flowwarden.errors.JavaNotFoundError` naming ``purpose``
    and how to install one (and ``without``: how to go on without Spark)."""
    java = find_java()
    if java is None:
        home = os.environ.get("JAVA_HOME")
        where = f"JAVA_HOME={home} holds no bin/java" if home else "JAVA_HOME is unset and no java is on PATH"
        raise JavaNotFoundError(f"{purpose} needs Spark, which needs Java 17: {where}", without)
    return java


def get_or_create_session(
    master: str = "local[*]",
    app_name: str = "flowwarden",
    conf: Mapping[str, Any] | None = None,
    jvm_log: str | Path | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one for ``master``.

    As with ``SparkSession.builder.getOrCreate()``, an already running session is returned
    (with ``conf`` applied to it where Spark allows changing a setting at runtime); ``master``
    and ``app_name`` only matter when a new session starts.

    ``jvm_log``: a file that gets what the JVM this call starts writes to its stderr (Spark's
    log4j console lines, the JVM's start-up warnings), appended, instead of this process's
    stderr. Only the JVM is redirected, for its whole life; this process's own stderr is as it
    was once the call returns (a line another thread writes during the call lands in the file
    too). Ignored when the JVM already runs.
    """
    sql = require("pyspark.sql", "a Spark session")
    context = require("pyspark", "a Spark session").SparkContext
    running = sql.SparkSession.getActiveSession() is not None or context._active_spark_context is not None
    java = None
    if not running and not master.startswith("sc://"):  # Spark Connect starts no JVM here
        java = require_java("a Spark session")
    if running:
        pass  # the workers' interpreter was settled when Spark started
    elif master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = sql.SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, str(value).lower() if isinstance(value, bool) else str(value))
    try:
        with _stderr_to(jvm_log):
            session: SparkSession = builder.getOrCreate()
    except Exception as error:
        if running or "JAVA_GATEWAY_EXITED" not in str(error):
            raise
        # PySpark's own message is a Python traceback's worth of text; the cause is in the JVM's
        # output (jvm_log, else this process's stderr).
        where = f"; its output is in {jvm_log}" if jvm_log is not None else "; its output is above"
        raise JavaNotFoundError(
            f"Spark's JVM exited before it started ({java}){where}. Spark needs Java 17 or 21"
        ) from None
    return session


@contextmanager
def _stderr_to(path: str | Path | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the block runs: a JVM started in the block
    inherits it. Python's ``sys.stderr`` writes to the same descriptor, so it is flushed first."""
    if path is None:
        yield
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with target.open("ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
