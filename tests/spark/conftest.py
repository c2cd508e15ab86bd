"""One local SparkSession for the whole test run, shared by every Spark test.

Starting Spark costs seconds, so the session is session-scoped; tests must not stop it or
change its global settings. Spark tests are marked ``spark``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from flowwarden.spark import get_or_create_session, register

    session = get_or_create_session(
        "local[2]",
        app_name="flowwarden-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    import pyspark

    from flowwarden.spark._extra import STREAMING_SOURCE_PYSPARK

    if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= STREAMING_SOURCE_PYSPARK:
        register(session)  # scripts/oldest-pyspark runs the DataFrame tests on a PySpark without it
    yield session
    session.stop()
