"""The conversion plan: a schema, mode and Extended JSON mode compiled once for every batch.

Owns what both conversion paths follow for one ``(schema, mode, json_mode)``: the table's
Arrow schema, the Python path's column builders of ``full_document`` and
``full_document_before_change`` (:mod:`flowwarden.spark.convert.columns`), the compiled converter's
program of the same document (:func:`flowwarden.spark.convert.native.compile_document`), and whether
the table carries ``_corrupt_record`` and ``_rescued_data`` (with the splitter that fills it).
Plans are cached per hashable schema, so a stream pays for compiling its schema once.

Hard rule: nothing here runs per event or per batch beyond the cache lookup; a schema that
cannot be compiled fails here, with the :class:`~flowwarden.errors.ConfigurationError` of
:func:`~flowwarden.spark.schema.document_spec`, before any event is read. This module imports
pyarrow (through the modules it compiles with), never pyspark.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from flowwarden.config import SchemaMode
from flowwarden.spark.convert import native
from flowwarden.spark.convert.columns import Column, compile_column
from flowwarden.spark.convert.extjson import JsonMode, encoder_for
from flowwarden.spark.convert.rescue import Rescuer
from flowwarden.spark.convert.spec_compiler import document_spec
from flowwarden.spark.schema import arrow_type, change_event_arrow_schema, has_corrupt_record

__all__ = ["ConversionPlan", "conversion_plan"]


class ConversionPlan(NamedTuple):
    """What converting a batch needs, compiled from its schema and modes."""

    schema: Any  # pyarrow.Schema of the table
    full_document: Column | None  # None: both document columns are Extended JSON
    before_change: Column | None
    native_document: native.Document | None  # the compiled converter's plan of a typed document
    corrupt_record: bool
    rescue: Rescuer | None = None  # rescued_data: splits documents into typed and rescued parts


def conversion_plan(
    schema: Any, mode: SchemaMode, json_mode: JsonMode, rescued_data: bool = False
) -> ConversionPlan:
    """The plan of ``schema`` (a full-document schema or None) in ``mode`` and ``json_mode``
    (with ``rescued_data``, a typed schema's table also has ``_rescued_data``), from the cache
    when the schema is hashable."""
    rescued_data = rescued_data and schema is not None
    try:
        return _cached_plan(schema, mode, json_mode, rescued_data)
    except TypeError:  # an unhashable schema object: compile it for this batch only
        return _make_plan(schema, mode, json_mode, rescued_data)


@functools.lru_cache(maxsize=64)
def _cached_plan(schema: Any, mode: SchemaMode, json_mode: JsonMode, rescued_data: bool) -> ConversionPlan:
    return _make_plan(schema, mode, json_mode, rescued_data)


def _make_plan(schema: Any, mode: SchemaMode, json_mode: JsonMode, rescued_data: bool) -> ConversionPlan:
    table_schema = change_event_arrow_schema(schema, mode=mode, rescued_data=rescued_data)
    if schema is None:
        return ConversionPlan(table_schema, None, None, None, False)
    spec = document_spec(schema)
    json = encoder_for(json_mode)
    return ConversionPlan(
        table_schema,
        compile_column(spec, "full_document", json),
        compile_column(spec, "full_document_before_change", json),
        native.compile_document(spec, arrow_type(spec)) if native.AVAILABLE else None,
        has_corrupt_record(schema, mode),
        Rescuer(spec, json) if rescued_data else None,
    )
