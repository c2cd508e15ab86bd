"""Change events to an Arrow table: :func:`events_to_arrow`, the one entry point.

:func:`events_to_arrow` turns a batch of change events (the documents PyMongo decoded, i.e.
``ChangeEvent.raw``, or the raw BSON a raw-reading stream delivers) into a ``pyarrow.Table``
with the change-event columns. It owns the order of the conversion, and the schema mode:

1. the conversion plan of the schema, compiled once (:mod:`flowwarden.spark.convert.plan`);
2. raw events through the compiled converter (:mod:`flowwarden.spark.convert.native`), which leaves
   to Python the events it does not convert exactly;
3. every other batch, and those events, through the Python path
   (:mod:`flowwarden.spark.convert.python`: values by :mod:`~flowwarden.spark.convert.values`, columns
   by :mod:`~flowwarden.spark.convert.columns`, misfits in :mod:`~flowwarden.spark.convert.misfits`);
4. the events left to Python reinserted in their places (:mod:`flowwarden.spark.convert.reinsert`);
5. the mode applied to the events whose document did not fit: keep, drop, or fail.

BSON values map exactly or not at all: a value that would change in the conversion does not
fit, and the schema mode decides what happens to its row (docs/spark.md, "Which values fit").
Both paths give the same table for the same events. The logger of this module says at DEBUG
how many raw events of a batch were converted in Python, and why the first one was; it never
logs per event. This module imports pyarrow, never pyspark.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from flowwarden.config import SchemaMode
from flowwarden.errors import SchemaMismatchError
from flowwarden.events import ChangeEvent
from flowwarden.spark._extra import require
from flowwarden.spark.convert import native
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.convert.misfits import MalformedRow
from flowwarden.spark.convert.plan import ConversionPlan, conversion_plan
from flowwarden.spark.convert.python import decode_events, python_table, unwrap_events
from flowwarden.spark.convert.reinsert import reinsert_rows

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

__all__ = ["ArrowBatch", "MalformedRow", "events_to_arrow"]

log = logging.getLogger(__name__)


class ArrowBatch(NamedTuple):
    """The table of a converted batch, and the rows that did not fit the schema.

    In PERMISSIVE mode the malformed rows are in the table (nulls where values did not fit, the
    document's Extended JSON in ``_corrupt_record``); in DROPMALFORMED mode they are not, and
    ``malformed`` is the list to dead-letter. Either way ``malformed`` is in event order.
    """

    table: Any
    """A ``pyarrow.Table`` with :data:`~flowwarden.spark.schema.EVENT_COLUMNS` (and
    ``_corrupt_record`` in PERMISSIVE mode with a typed schema)."""
    malformed: tuple[MalformedRow, ...]


def _native_table(
    events: Sequence[Mapping[str, Any] | ChangeEvent], plan: ConversionPlan, json_mode: JsonMode
) -> tuple[Any, tuple[int, ...]] | None:
    """The table of a batch of RawBSONDocuments (or ChangeEvents over them) from the compiled
    converter, without the events it leaves to Python (every event with a document that does
    not fit the schema: the Python path reports those), and their positions; None when it is
    not built, not every event is raw, or it leaves every event to Python."""
    if not native.AVAILABLE or (plan.full_document is not None and plan.native_document is None):
        return None
    # With rescued data, an event with a key its schema does not name is left to Python too.
    closed = plan.rescue is not None
    # A list of RawBSONDocuments, what a raw-reading stream delivers, goes as it is; ChangeEvents
    # are unwrapped first, which costs a pass in Python.
    converted = None
    if type(events) is list:
        converted = native.convert(events, json_mode, plan.native_document, closed=closed)
    if converted is None:
        if type(events) is list and not any(isinstance(event, ChangeEvent) for event in events):
            return None  # not every event is raw: nothing to convert here
        converted = native.convert(unwrap_events(events), json_mode, plan.native_document, closed=closed)
    if isinstance(converted, str):
        log.debug("%d raw events converted in Python: %s", len(events), converted)
        return None
    if converted is None:
        return None
    columns, left = converted
    if left:
        index, reason = left[0]
        log.debug(
            "%d of %d raw events converted in Python; event %d: %s", len(left), len(events), index, reason
        )
    if plan.corrupt_record:
        columns.append(pa.nulls(len(events) - len(left), type=pa.string()))
    if plan.rescue is not None:  # nothing to rescue in the events converted here
        columns.append(pa.nulls(len(events) - len(left), type=pa.string()))
    return pa.Table.from_arrays(columns, schema=plan.schema), tuple(index for index, _ in left)


def events_to_arrow(
    events: Sequence[Mapping[str, Any] | ChangeEvent],
    *,
    schema: Any = None,
    mode: SchemaMode | str = SchemaMode.PERMISSIVE,
    json_mode: JsonMode | str = JsonMode.CANONICAL,
    rescued_data: bool = False,
) -> ArrowBatch:
    """Convert a batch of change events into an Arrow table with the change-event columns.

    ``events`` are raw change documents as PyMongo decodes them (``ChangeEvent.raw``),
    ``bson.raw_bson.RawBSONDocument`` events as a raw-reading change stream delivers them, or
    :class:`~flowwarden.events.ChangeEvent` objects over either. A batch of RawBSONDocuments
    goes through the compiled converter when it is built
    (:mod:`flowwarden.spark.convert.native`); every other batch, and any batch the compiled converter
    leaves to Python, is decoded with :data:`~flowwarden.spark.convert.native.DECODE_OPTIONS` and
    converted in Python, to the same table. Bytes PyMongo cannot decode raise
    :class:`UndecodableEventError`. ``schema`` types ``full_document`` and
    ``full_document_before_change``: a pydantic model class, a pyspark ``StructType`` or a
    pyarrow ``Schema``; None keeps both as Extended JSON strings (``json_mode``, canonical by
    default: lossless).

    ``mode`` decides the fate of an event whose document does not fit ``schema``:
    PERMISSIVE keeps the row with nulls where values did not fit and the document's Extended
    JSON in ``_corrupt_record``; DROPMALFORMED leaves the row out; FAILFAST raises
    :class:`~flowwarden.errors.SchemaMismatchError` naming the field and the event's token,
    for the first such event in batch order. Both other modes report the rows in
    :attr:`ArrowBatch.malformed`. Table rows keep the order of ``events``.

    ``rescued_data`` (with a typed ``schema``) adds ``_rescued_data``: a key the schema does not
    name and a value that does not fit its field go there as Extended JSON instead of making
    the row malformed (:mod:`flowwarden.spark.convert.rescue`); the mode then decides only rows
    rescue cannot help (a missing required field, a document that is not a document).
    """
    mode = SchemaMode(mode)
    json_mode = JsonMode(json_mode)
    plan = conversion_plan(schema, mode, json_mode, rescued_data)
    converted = _native_table(events, plan, json_mode)
    if converted is None:
        table, malformed = python_table(decode_events(unwrap_events(events)), plan, json_mode)
    else:
        table, positions = converted
        malformed = ()
        if positions:
            rest, rest_malformed = python_table(
                decode_events(unwrap_events([events[i] for i in positions]), positions), plan, json_mode
            )
            table = reinsert_rows(table, rest, positions)
            malformed = tuple(dataclasses.replace(row, index=positions[row.index]) for row in rest_malformed)
    if malformed and mode is SchemaMode.FAILFAST:
        first = malformed[0]
        raise SchemaMismatchError(field=first.field, token=first.token, index=first.index, reason=first.error)
    if malformed and mode is SchemaMode.DROPMALFORMED:
        dropped = {row.index for row in malformed}
        keep = [i for i in range(table.num_rows) if i not in dropped]
        table = table.take(pa.array(keep, type=pa.int64()))
    return ArrowBatch(table, malformed)
