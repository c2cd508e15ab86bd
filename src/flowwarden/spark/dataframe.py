"""Change events to a Spark DataFrame, through Arrow.

The table built by :func:`flowwarden.spark.convert.arrow.events_to_arrow` goes to
``spark.createDataFrame(table, schema)`` whole; rows never travel as Python objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from flowwarden.config import SchemaMode
from flowwarden.errors import ConfigurationError
from flowwarden.events import ChangeEvent
from flowwarden.spark._extra import require
from flowwarden.spark.convert.arrow import MalformedRow, events_to_arrow
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.schema import change_event_struct_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DataFrameBatch", "events_to_dataframe", "parse_schema"]


class DataFrameBatch(NamedTuple):
    """A batch as a DataFrame, and the events whose document did not fit the schema."""

    dataframe: DataFrame
    malformed: tuple[MalformedRow, ...]


def parse_schema(schema: Any) -> Any:
    """A DDL string (``"name STRING, qty INT"``) as a StructType; any other schema as it is."""
    if not isinstance(schema, str):
        return schema
    types = require("pyspark.sql.types", "a DDL schema")
    try:
        parsed = types.DataType.fromDDL(schema)
    except Exception as exc:  # Spark's parse errors come from the JVM with their own classes
        raise ConfigurationError(
            f"cannot parse the DDL schema {schema!r}: {exc}", option="schema", value=schema
        ) from exc
    if not isinstance(parsed, types.StructType):
        raise ConfigurationError(
            f"the DDL schema {schema!r} is a {parsed.simpleString()}, not a list of fields",
            option="schema",
            value=schema,
            allowed='fields like "name STRING, qty INT, items ARRAY<STRUCT<sku: STRING>>"',
        )
    return parsed


def events_to_dataframe(
    spark: SparkSession,
    events: Sequence[Mapping[str, Any] | ChangeEvent],
    *,
    schema: Any = None,
    mode: SchemaMode | str = SchemaMode.PERMISSIVE,
    json_mode: JsonMode | str = JsonMode.CANONICAL,
    rescued_data: bool = False,
) -> DataFrameBatch:
    """Convert a batch of change events into a DataFrame with the change-event columns.

    Same arguments and mode rules as :func:`~flowwarden.spark.convert.arrow.events_to_arrow`; ``schema``
    may also be a DDL string. The DataFrame's schema is
    :func:`~flowwarden.spark.schema.change_event_struct_type` of ``schema`` and ``mode``, also
    for an empty batch, so every batch of a stream has the same columns. ``schema`` may also
    be what :func:`~flowwarden.spark.infer.infer_schema` returns; ``rescued_data`` adds the
    ``_rescued_data`` column (see :func:`~flowwarden.spark.convert.arrow.events_to_arrow`).
    """
    schema = parse_schema(schema)
    batch = events_to_arrow(events, schema=schema, mode=mode, json_mode=json_mode, rescued_data=rescued_data)
    struct = change_event_struct_type(schema, mode=mode, rescued_data=rescued_data and schema is not None)
    return DataFrameBatch(spark.createDataFrame(batch.table, schema=struct), batch.malformed)
