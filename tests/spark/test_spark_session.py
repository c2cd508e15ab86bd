"""get_or_create_session: Python workers run this interpreter, Arrow is on, timestamps show in UTC."""

from __future__ import annotations

import os
import sys

import pytest
from pyspark.sql import SparkSession

from flowwarden.spark import get_or_create_session

pytestmark = pytest.mark.spark


def test_the_session_is_shared_and_configured(spark: SparkSession) -> None:
    assert get_or_create_session() is spark  # an active session is returned, not a second one
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_python_workers_import_flowwarden(spark: SparkSession) -> None:
    def probe(_: object) -> list[str]:
        import flowwarden.spark.arrow

        return [sys.executable, flowwarden.spark.arrow.__name__]

    executable, module = spark.sparkContext.parallelize([0], 1).map(probe).first()
    assert executable == sys.executable
    assert module == "flowwarden.spark.arrow"
