"""The SparkSession flowwarden uses when it is not handed one.

Python workers that Spark starts must import flowwarden (the streaming source runs in them), so
when this call starts Spark for a local master, ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``
are set to the interpreter running this code. For a cluster master they are only filled in when
unset: there the workers' interpreter is the cluster's business. When Spark already runs (a
session the user built, a notebook's), neither is touched.

The JVM's own output (log4j lines, its Python workers' stderr) can go to a file or, one record
per line, to a logger instead of this process's stderr: ``jvm_log``. A MongoDB URI given to the
streaming source as its ``uri`` option never shows in a query plan: the session's option redaction
(``spark.sql.redaction.options.regex``) covers ``uri`` (:func:`redact_uri_options`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from flowwarden.errors import JavaNotFoundError
from flowwarden.spark._extra import require

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_CONF",
    "REDACTION_OPTIONS",
    "find_java",
    "get_or_create_session",
    "redact_uri_options",
    "require_java",
]

DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Change events carry UTC instants; showing them in UTC avoids reading a shifted wall clock.
    "spark.sql.session.timeZone": "UTC",
    # A connector runs for days: a progress bar per stage is noise on a console, and worse in a log.
    "spark.ui.showConsoleProgress": "false",
}
"""Settings applied before ``conf`` (which overrides them)."""

REDACTION_OPTIONS = "spark.sql.redaction.options.regex"
"""The session setting naming the data source options whose values plans print as redacted
(Spark's default, ``(?i)url``, does not cover the streaming source's ``uri``)."""
_URI_OPTION = "(?i:uri)"


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
    jvm_log: str | Path | logging.Logger | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one for ``master``.

    As with ``SparkSession.builder.getOrCreate()``, an already running session is returned
    (with ``conf`` applied to it where Spark allows changing a setting at runtime); ``master``
    and ``app_name`` only matter when a new session starts. Unless ``conf`` sets
    ``spark.sql.redaction.options.regex``, the session's option redaction is made to cover the
    streaming source's ``uri`` (:func:`redact_uri_options`).

    ``jvm_log``: where what the JVM this call starts writes to its stderr goes (Spark's log4j
    console lines, the JVM's start-up warnings, its Python workers' stderr) instead of this
    process's stderr: a file, appended; or a logger, one record per line at the line's log4j
    level (WARN: WARNING; a line that is not log4j's takes the level of the log4j line before it
    when it continues it, such as a stack trace, else WARNING; Spark's start-up notes are INFO).
    Only the JVM is redirected, for its whole life; this process's ``sys.stderr`` writes where it
    wrote before, during the call as after it. Ignored when the JVM already runs.
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
        if isinstance(jvm_log, logging.Logger):
            where = f"; its output is in the log (logger {jvm_log.name!r})"
        else:
            where = f"; its output is in {jvm_log}" if jvm_log is not None else "; its output is above"
        raise JavaNotFoundError(
            f"Spark's JVM exited before it started ({java}){where}. Spark needs Java 17 or 21"
        ) from None
    if REDACTION_OPTIONS not in (conf or {}):
        redact_uri_options(session)
    return session


def redact_uri_options(spark: SparkSession) -> None:
    """Make ``spark``'s plans (``explain()``, the streaming query's plan) print the value of an
    option named ``uri`` (the streaming source's MongoDB URI) as redacted, keeping whatever the
    redaction regex covered before. Idempotent."""
    current = spark.conf.get(REDACTION_OPTIONS, None) or ""
    try:
        covered = re.search(current, "uri") is not None if current else False
    except re.error:  # a Java regex Python does not read: extend it all the same
        covered = False
    if not covered and _URI_OPTION not in current:
        spark.conf.set(REDACTION_OPTIONS, f"(?:{current})|{_URI_OPTION}" if current else _URI_OPTION)


@contextmanager
def _stderr_to(target: str | Path | logging.Logger | None) -> Iterator[None]:
    """Point file descriptor 2 at ``target`` (a file, or a pipe read into a logger) while the
    block runs: a JVM started in the block inherits it.

    Meanwhile a ``sys.stderr`` on descriptor 2 is swapped for one on a copy of the descriptor as
    it was, so this process's own lines (log records above all) stay where they belong; and the
    JVM's lines are logged only once the block is over, so that a line logged to a handler that
    still writes to descriptor 2 cannot come back through the pipe as the JVM's."""
    if target is None:
        yield
        return
    if isinstance(target, logging.Logger):
        read, write = os.pipe()
        lines = _JvmLines(read, target)
        lines.start()
        reader: _JvmLines | None = lines
    else:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as log:
            write = os.dup(log.fileno())
        reader = None
    python_stderr = sys.stderr
    if python_stderr is not None:
        python_stderr.flush()
    saved = os.dup(2)
    try:
        if _on_descriptor_2(python_stderr):
            sys.stderr = os.fdopen(
                os.dup(saved), "w", encoding=python_stderr.encoding, errors="backslashreplace", buffering=1
            )
        os.dup2(write, 2)
        os.close(write)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        if sys.stderr is not python_stderr:
            replaced, sys.stderr = sys.stderr, python_stderr
            replaced.close()
        if reader is not None:
            reader.release()


def _on_descriptor_2(stream: Any) -> bool:
    try:
        return stream is not None and stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a replaced stderr with no descriptor
        return False


# "26/11/26 23:16:40 WARN Utils: ..." as Spark's default log4j2 console pattern writes it.
_LOG4J_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
_LOG4J_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
# The first line of a Java exception that a log4j line goes on with: "java.io.IOException: ..."
_EXCEPTION_LINE = re.compile(r"^[\w$]+(\.[\w$]+)+(Exception|Error)\b")
# What Spark writes to stderr at start-up outside log4j: notes, not warnings.
_START_UP_NOTES = (
    "Using Spark's default log4j profile",
    "Setting default log level to",
    "To adjust logging level use",
)


def jvm_line_level(line: str, previous: int) -> tuple[int, str]:
    """The level of one line of the JVM's stderr, and its message (a log4j line without its own
    time and level). ``previous``: the level of the line before, which a continuation keeps."""
    found = _LOG4J_LINE.match(line)
    if found is not None:
        return _LOG4J_LEVELS[found.group(1)], line[found.end() :]
    if line[:1].isspace() or line.startswith("Caused by:") or _EXCEPTION_LINE.match(line):
        return previous, line
    if line.startswith(_START_UP_NOTES):
        return logging.INFO, line
    return logging.WARNING, line


class _JvmLines(threading.Thread):
    """Reads the JVM's stderr (a pipe) until the JVM and its children exit, and logs each line;
    the lines read before :meth:`release` are held (the pipe is read all the same, so the JVM
    never waits on it), then logged in order."""

    def __init__(self, read: int, logger: logging.Logger) -> None:
        super().__init__(name="flowwarden-spark-log", daemon=True)
        self._pipe: IO[bytes] = os.fdopen(read, "rb")
        self._logger = logger
        self._level = logging.WARNING
        self._lock = threading.Lock()
        self._held: list[bytes] | None = []

    def run(self) -> None:
        with self._pipe:
            for raw in self._pipe:
                with self._lock:
                    if self._held is not None:
                        self._held.append(raw)
                    else:
                        self._log(raw)

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
            for raw in held:
                self._log(raw)

    def _log(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            self._level, message = jvm_line_level(line, self._level)
            self._logger.log(self._level, "%s", message)
