"""flowwarden.spark: change events as Arrow tables and Spark DataFrames, and the
Structured Streaming source ``flowwarden``.

Importing this package imports neither pyspark nor pyarrow (they are the ``spark`` extra); each
name below loads its module on first use, and a missing package fails with
``pip install "flowwarden[spark]"``.

- :func:`events_to_arrow` / :func:`events_to_dataframe`: a batch of change events, column-wise.
- :func:`model_to_struct_type`, :func:`change_event_struct_type` ...: the schemas involved.
- :func:`infer_schema`: a collection's document schema, inferred from a ``$sample``.
- :func:`latest_per_key` / :func:`latest_per_key_arrow`: the last change of each document in a
  batch, ready for a MERGE into a Delta, Iceberg or Hudi table.
- :func:`get_or_create_session`: a SparkSession whose Python workers can import flowwarden.
- :func:`register`: make ``spark.readStream.format("flowwarden")`` available.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowwarden._lazy import lazy_attributes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from flowwarden.spark.convert.arrow import ArrowBatch as ArrowBatch
    from flowwarden.spark.convert.arrow import MalformedRow as MalformedRow
    from flowwarden.spark.convert.arrow import events_to_arrow as events_to_arrow
    from flowwarden.spark.convert.extjson import JsonMode as JsonMode
    from flowwarden.spark.dataframe import DataFrameBatch as DataFrameBatch
    from flowwarden.spark.dataframe import events_to_dataframe as events_to_dataframe
    from flowwarden.spark.infer import infer_schema as infer_schema
    from flowwarden.spark.latest import latest_per_key as latest_per_key
    from flowwarden.spark.latest import latest_per_key_arrow as latest_per_key_arrow
    from flowwarden.spark.schema import CORRUPT_RECORD_COLUMN as CORRUPT_RECORD_COLUMN
    from flowwarden.spark.schema import EVENT_COLUMNS as EVENT_COLUMNS
    from flowwarden.spark.schema import RESCUED_DATA_COLUMN as RESCUED_DATA_COLUMN
    from flowwarden.spark.schema import ObjectIdStr as ObjectIdStr
    from flowwarden.spark.schema import change_event_arrow_schema as change_event_arrow_schema
    from flowwarden.spark.schema import change_event_struct_type as change_event_struct_type
    from flowwarden.spark.schema import model_to_arrow_schema as model_to_arrow_schema
    from flowwarden.spark.schema import model_to_struct_type as model_to_struct_type
    from flowwarden.spark.schema import struct_type_to_arrow_schema as struct_type_to_arrow_schema
    from flowwarden.spark.session import get_or_create_session as get_or_create_session
    from flowwarden.spark.source.reader import FlowWardenDataSource as FlowWardenDataSource

_LAZY = {
    "ArrowBatch": "flowwarden.spark.convert.arrow",
    "MalformedRow": "flowwarden.spark.convert.arrow",
    "events_to_arrow": "flowwarden.spark.convert.arrow",
    "DataFrameBatch": "flowwarden.spark.dataframe",
    "events_to_dataframe": "flowwarden.spark.dataframe",
    "JsonMode": "flowwarden.spark.convert.extjson",
    "infer_schema": "flowwarden.spark.infer",
    "latest_per_key": "flowwarden.spark.latest",
    "latest_per_key_arrow": "flowwarden.spark.latest",
    "RESCUED_DATA_COLUMN": "flowwarden.spark.schema",
    "CORRUPT_RECORD_COLUMN": "flowwarden.spark.schema",
    "EVENT_COLUMNS": "flowwarden.spark.schema",
    "ObjectIdStr": "flowwarden.spark.schema",
    "change_event_arrow_schema": "flowwarden.spark.schema",
    "change_event_struct_type": "flowwarden.spark.schema",
    "model_to_arrow_schema": "flowwarden.spark.schema",
    "model_to_struct_type": "flowwarden.spark.schema",
    "struct_type_to_arrow_schema": "flowwarden.spark.schema",
    "get_or_create_session": "flowwarden.spark.session",
    "FlowWardenDataSource": "flowwarden.spark.source.reader",
}

__all__ = [*sorted(_LAZY), "register"]


def register(spark: SparkSession) -> None:
    """Register the Python data source ``flowwarden`` with ``spark``.

    Afterwards ``spark.readStream.format("flowwarden").option("uri", ...)`` reads change events;
    see :class:`~flowwarden.spark.source.reader.FlowWardenDataSource` for the options. The
    session's option redaction (``spark.sql.redaction.options.regex``) is extended to cover
    ``uri``, so ``explain()`` and the query's plan print the URI as redacted.
    """
    from flowwarden.spark._extra import STREAMING_SOURCE_PYSPARK, require, require_pyspark

    pyspark = require("pyspark", "the flowwarden streaming source")
    require_pyspark(pyspark.__version__, STREAMING_SOURCE_PYSPARK, "the flowwarden streaming source")
    from flowwarden.spark.session import redact_uri_options
    from flowwarden.spark.source.reader import FlowWardenDataSource

    redact_uri_options(spark)
    spark.dataSource.register(FlowWardenDataSource)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
