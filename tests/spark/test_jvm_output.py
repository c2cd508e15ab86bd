"""Where the output of a process Spark's session helper starts goes when it is given a logger: one
record per line, at the line's level, and this process's own stderr lines stay its own. A plain
child process stands in for the JVM (it inherits descriptor 2 the same way); no Spark starts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

from flowwarden.spark.session import jvm_line_level

# What a JVM and its Python workers write to stderr, in order.
JVM_OUTPUT = """WARNING: Using incubator modules: jdk.incubator.vector
Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
26/11/26 23:16:40 WARN Utils: Your hostname, vm, resolves to a loopback address
Setting default log level to "WARN".
26/11/26 23:16:41 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner...)
Caused by: java.io.IOException: broken pipe
26/11/26 23:16:42 INFO SparkContext: Running Spark version 4.0.0
"""

SCRIPT = """
import logging, subprocess, sys
from flowwarden.cli import logs
from flowwarden.spark.session import _stderr_to

logs.configure("INFO", "json")
logging.getLogger("spark").setLevel(logging.DEBUG)
with _stderr_to(logging.getLogger("spark")):
    jvm = "import os, sys; sys.stderr.write(os.environ['JVM_OUTPUT'])"
    child = subprocess.Popen([sys.executable, "-c", jvm])
    child.wait()
    logging.getLogger("flowwarden.runtime.stream").info("a line of flowwarden's while the JVM starts")
    print("a print to stderr while the JVM starts", file=sys.stderr)
print("a print to stderr afterwards", file=sys.stderr)
# The stand-in JVM has exited: its pipe ends, and the thread forwarding it finishes (a real JVM
# keeps it open for the process's life).
import threading
for thread in threading.enumerate():
    if thread.name == "flowwarden-spark-log":
        thread.join(30)
"""


def test_the_jvms_lines_are_logged_each_at_its_level_and_this_process_keeps_its_own():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**os.environ, "JVM_OUTPUT": JVM_OUTPUT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    prints = [line for line in lines if line.startswith("a print")]
    assert prints == ["a print to stderr while the JVM starts", "a print to stderr afterwards"], lines
    records = [json.loads(line) for line in lines if line not in prints]
    ours = [r for r in records if r["logger"] == "flowwarden.runtime.stream"]
    assert [r["message"] for r in ours] == ["a line of flowwarden's while the JVM starts"], records
    spark = [(r["level"], r["message"]) for r in records if r["logger"] == "spark"]
    assert spark == [
        ("WARNING", "WARNING: Using incubator modules: jdk.incubator.vector"),
        ("INFO", "Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties"),
        ("WARNING", "Utils: Your hostname, vm, resolves to a loopback address"),
        ("INFO", 'Setting default log level to "WARN".'),
        ("ERROR", "Executor: Exception in task 0.0 in stage 1.0 (TID 1)"),
        ("ERROR", "org.apache.spark.api.python.PythonException: Traceback (most recent call last):"),
        ("ERROR", "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner...)"),
        ("ERROR", "Caused by: java.io.IOException: broken pipe"),
        ("INFO", "SparkContext: Running Spark version 4.0.0"),
    ]


def test_a_line_that_is_not_log4j_and_continues_nothing_is_a_warning():
    assert jvm_line_level("Error: A JNI error has occurred", logging.INFO) == (
        logging.WARNING,
        "Error: A JNI error has occurred",
    )
    assert jvm_line_level("26/11/26 23:16:40 DEBUG X: y", logging.ERROR) == (logging.DEBUG, "X: y")
