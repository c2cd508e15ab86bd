"""The streaming source's ``uri`` option, which holds the MongoDB password, never shows in a plan:
``register()`` and the session helper make Spark redact it (its own default redacts ``url``)."""

from __future__ import annotations

import contextlib
import io

import pytest
from pyspark.sql import SparkSession

from flowwarden.spark import get_or_create_session, register
from flowwarden.spark.session import REDACTION_OPTIONS, redact_uri_options

pytestmark = pytest.mark.spark

REDACTED = "uri=*********(redacted)"


def printed(call) -> str:
    """What ``call()`` printed (PySpark's explain() prints)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    return out.getvalue()


def test_explain_prints_the_uri_redacted(spark: SparkSession) -> None:
    uri = "mongodb://app:hunter2xyz@db1.example.net:27017/?replicaSet=rs0"
    df = spark.readStream.format("flowwarden").option("uri", uri).option("database", "shop").load()
    plan = printed(lambda: df.explain(True))
    assert "hunter2xyz" not in plan and "db1.example.net" not in plan, plan
    assert REDACTED in plan, plan


def test_a_running_querys_plans_and_progress_hold_no_uri(
    spark: SparkSession, mongodb_uri, client, db_name, tmp_path
) -> None:
    # A query that reads: its URI carries a stand-in for a secret in an option the server ignores.
    uri = mongodb_uri + ("&" if "?" in mongodb_uri else "/?") + "appname=canary-7f3a"
    client[db_name].orders.insert_many([{"n": n} for n in range(3)])
    events = (
        spark.readStream.format("flowwarden")
        .option("uri", uri)
        .option("database", db_name)
        .option("collection", "orders")
        .option("start_position", "EARLIEST")
        .load()
    )
    query = (
        events.writeStream.format("memory")
        .queryName("redaction_probe")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        assert sum(p["numInputRows"] for p in query.recentProgress) >= 3
        execution = query._jsq.streamingQuery()  # the JVM's StreamExecution: its plans as text
        plans = printed(lambda: query.explain(True)) + "\n".join(
            [str(execution.logicalPlan().toString()), str(execution.lastExecution().toString())]
        )
        progress = str(query.recentProgress)
    finally:
        query.stop()
    assert "canary-7f3a" not in plans + progress, plans


def test_a_redaction_the_session_had_is_kept_and_extended_once(spark: SparkSession) -> None:
    before = spark.conf.get(REDACTION_OPTIONS)
    try:
        spark.conf.set(REDACTION_OPTIONS, "(?i)token")
        register(spark)
        assert spark.conf.get(REDACTION_OPTIONS) == "(?:(?i)token)|(?i:uri)"
        redact_uri_options(spark)
        assert spark.conf.get(REDACTION_OPTIONS) == "(?:(?i)token)|(?i:uri)"
        spark.conf.set(REDACTION_OPTIONS, "(?i)token")
        assert get_or_create_session() is spark  # the session helper does the same
        assert spark.conf.get(REDACTION_OPTIONS) == "(?:(?i)token)|(?i:uri)"
    finally:
        spark.conf.set(REDACTION_OPTIONS, before)
