"""The SparkSession flowwarden uses when it is not handed one.

Python workers that Spark starts must import flowwarden (the streaming source runs in them), so
for a local master ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to the interpreter
running this code. For a cluster master they are only filled in when unset: there the workers'
interpreter is the cluster's business.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flowwarden.spark._extra import require

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_CONF", "get_or_create_session"]

DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Change events carry UTC instants; showing them in UTC avoids reading a shifted wall clock.
    "spark.sql.session.timeZone": "UTC",
}
"""Settings applied before ``conf`` (which overrides them)."""


def get_or_create_session(
    master: str = "local[*]",
    app_name: str = "flowwarden",
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one for ``master``.

    As with ``SparkSession.builder.getOrCreate()``, an already running session is returned
    (with ``conf`` applied to it where Spark allows changing a setting at runtime); ``master``
    and ``app_name`` only matter when a new session starts.
    """
    sql = require("pyspark.sql", "a Spark session")
    if master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = sql.SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, str(value).lower() if isinstance(value, bool) else str(value))
    session: SparkSession = builder.getOrCreate()
    return session
