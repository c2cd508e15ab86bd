"""What the PySpark a test run uses allows: run by scripts/oldest-pyspark on PySpark 4.0, and by
the default suite on the newest."""

from __future__ import annotations

import pyspark
import pytest
from pyspark.sql import SparkSession

from flowwarden.errors import ConfigurationError
from flowwarden.spark import register
from flowwarden.spark._extra import STREAMING_SOURCE_PYSPARK

pytestmark = pytest.mark.spark


def _version() -> tuple[int, int]:
    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


def test_the_streaming_source_registers_exactly_from_the_pyspark_it_needs(spark: SparkSession) -> None:
    if _version() >= STREAMING_SOURCE_PYSPARK:
        register(spark)
        assert (
            spark.readStream.format("flowwarden").option("uri", "mongodb://h/?replicaSet=rs0").load().columns
        )
    else:
        with pytest.raises(ConfigurationError, match=f"this process runs PySpark {pyspark.__version__}"):
            register(spark)
