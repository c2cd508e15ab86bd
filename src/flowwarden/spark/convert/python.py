"""The Python path: decoded change events to the change-event table, column by column.

Owns converting events in Python: raw events decoded with
:data:`~flowwarden.spark.convert.native.DECODE_OPTIONS` (:func:`decode_events`), then
:func:`python_table` reads every event once for its top-level keys, turns each column into
one Python list handed to pyarrow whole, and types the two document columns with the plan's
builders (:mod:`flowwarden.spark.convert.columns`). This is the path of every batch the compiled
converter does not take (decoded dicts, mixed batches, no compiled module) and of the single
events it leaves to Python.

Hard rules: a row is never assembled as a dict, and the output equals the compiled
converter's for the same events (the differential tests hold the two to it). Every event
stays in the table, the malformed ones too; the schema mode is applied by
:func:`flowwarden.spark.convert.arrow.events_to_arrow`, never here. This module imports pyarrow,
never pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import bson
from bson.errors import InvalidBSON
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from flowwarden.errors import InvalidTokenError, UndecodableEventError
from flowwarden.events import ChangeEvent
from flowwarden.spark._extra import require
from flowwarden.spark.convert import native
from flowwarden.spark.convert.columns import columns_reader
from flowwarden.spark.convert.extjson import Encoder, JsonMode, encoder_for
from flowwarden.spark.convert.misfits import FirstMisfits, MalformedRow
from flowwarden.spark.convert.plan import ConversionPlan
from flowwarden.spark.convert.rescue import NOTHING
from flowwarden.spark.schema import change_event_arrow_schema

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

__all__ = ["decode_events", "python_table", "unwrap_events"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_TRUNCATIONS_TYPE = change_event_arrow_schema().field("truncated_arrays").type

_EVENT_KEYS = (
    "operationType",
    "clusterTime",
    "wallTime",
    "ns",
    "to",
    "documentKey",
    "updateDescription",
    "fullDocument",
    "fullDocumentBeforeChange",
)


def unwrap_events(events: Sequence[Mapping[str, Any] | ChangeEvent]) -> list[Mapping[str, Any]]:
    """Each event as its raw mapping: a ChangeEvent's ``raw``, anything else as it is."""
    return [event.raw if isinstance(event, ChangeEvent) else event for event in events]


def decode_events(
    raws: list[Mapping[str, Any]], positions: Sequence[int] | None = None
) -> list[Mapping[str, Any]]:
    """Every RawBSONDocument decoded with :data:`~flowwarden.spark.convert.native.DECODE_OPTIONS`
    (whatever codec options it carries): the Python path's input, also for mixed batches.
    ``positions``: where each of ``raws`` is in the batch (default: ``raws`` is the batch)."""
    out: list[Mapping[str, Any]] = []
    for index, raw in enumerate(raws):
        if not isinstance(raw, RawBSONDocument):
            out.append(raw)
            continue
        try:
            decoded: dict[str, Any] = bson.decode(raw.raw, codec_options=native.DECODE_OPTIONS)
        except InvalidBSON as error:
            raise UndecodableEventError(positions[index] if positions else index, str(error)) from error
        out.append(decoded)
    return out


def _token_data(raws: list[Mapping[str, Any]]) -> list[str | None]:
    """Each event's resume token ``_data``; None for an event without ``_id`` (an
    initial-snapshot row, which is not a position)."""
    try:
        return [raw["_id"]["_data"] for raw in raws]
    except (KeyError, TypeError):
        for index, raw in enumerate(raws):
            token = raw.get("_id") if isinstance(raw, Mapping) else None
            if isinstance(raw, Mapping) and "_id" not in raw and raw.get("operationType") == "snapshot":
                continue
            if not isinstance(token, Mapping) or not isinstance(token.get("_data"), str):
                raise InvalidTokenError(
                    f"event {index} of the batch has no resume token _id._data (got {token!r}); "
                    "a pipeline stage must not remove or rewrite _id"
                ) from None
        return [raw["_id"]["_data"] if "_id" in raw else None for raw in raws]


def _document_keys(keys: list[Any], json: Encoder) -> list[str | None]:
    """Extended JSON of each documentKey; the common ``{_id: ObjectId}`` without the encoder
    (the text is the same: the tests compare both paths)."""
    out: list[str | None] = []
    append = out.append
    for key in keys:
        if type(key) is dict and len(key) == 1:
            oid = key.get("_id")
            if type(oid) is ObjectId:
                append(f'{{"_id":{{"$oid":"{oid.binary.hex()}"}}}}')
                continue
        append(json(key) if key is not None else None)
    return out


def _namespaces(values: list[Any]) -> tuple[list[Any], list[Any]]:
    """The ``db`` and ``coll`` of each namespace document (``ns``, a rename's ``to``): both
    null when the event has none, or a value that is not a document."""
    databases: list[Any] = []
    collections: list[Any] = []
    for value in values:
        if isinstance(value, Mapping):
            databases.append(value.get("db"))
            collections.append(value.get("coll"))
        else:
            databases.append(None)
            collections.append(None)
    return databases, collections


def _truncations(value: Any) -> list[tuple[str, int]] | None:
    """``updateDescription.truncatedArrays`` as (field, newSize) pairs: None when missing or of
    another shape than an array of documents with a string ``field`` and a 32-bit integer
    ``newSize`` (the compiled converter leaves those events here)."""
    if not isinstance(value, (list, tuple)):
        return None
    pairs = []
    for entry in value:
        if not isinstance(entry, Mapping):
            return None
        field, size = entry.get("field"), entry.get("newSize")
        # str, not its subclasses (bson.Code); int and Int64, not bool
        if type(field) is not str or not isinstance(size, int) or isinstance(size, bool):
            return None
        if not _INT32_MIN <= size <= _INT32_MAX:
            return None
        pairs.append((field, int(size)))
    return pairs


def _truncated_arrays(updates: list[Any]) -> Any:
    """The truncated_arrays column: a list<struct<field, new_size>> built from flat lists,
    without a dict per element."""
    offsets = [0]
    fields: list[str] = []
    sizes: list[int] = []
    nulls: list[bool] = []
    for update in updates:
        pairs = _truncations(update.get("truncatedArrays")) if update is not None else None
        nulls.append(pairs is None)
        for field, size in pairs or ():
            fields.append(field)
            sizes.append(size)
        offsets.append(len(fields))
    entries = pa.StructArray.from_arrays(
        [pa.array(fields, type=pa.string()), pa.array(sizes, type=pa.int32())],
        fields=list(_TRUNCATIONS_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, type=pa.int32()),
        entries,
        type=_TRUNCATIONS_TYPE,
        mask=pa.array(nulls, type=pa.bool_()) if True in nulls else None,
    )


def python_table(
    raws: list[Mapping[str, Any]], plan: ConversionPlan, json_mode: JsonMode
) -> tuple[Any, tuple[MalformedRow, ...]]:
    """The table of decoded events, with every row (the malformed ones with nulls where values
    did not fit and, when the plan has one, their Extended JSON in ``_corrupt_record``), and
    the malformed rows in event order. With the plan's ``rescue``, what the document columns
    cannot take goes to ``_rescued_data`` instead of making its row malformed."""
    json = encoder_for(json_mode)
    count = len(raws)

    ids = _token_data(raws)
    operation, cluster, wall, ns, to, keys, updates, full, before = columns_reader(_EVENT_KEYS)(raws, None)
    stamps = [ts if type(ts) is Timestamp else None for ts in cluster]
    databases, collections = _namespaces(ns)
    to_databases, to_collections = _namespaces(to)

    misfits = FirstMisfits()
    owners = range(count)
    rescued: list[str | None] | None = None
    if plan.rescue is not None:
        full, rescued_full = plan.rescue.split(full)
        before, rescued_before = plan.rescue.split(before)
        rescued = [_rescued(a, b, json) for a, b in zip(rescued_full, rescued_before, strict=True)]
    if plan.full_document is None or plan.before_change is None:
        full_array = pa.array([json(d) if d is not None else None for d in full], type=pa.string())
        before_array = pa.array([json(d) if d is not None else None for d in before], type=pa.string())
        full_misfits: set[int] = set()
    else:
        full_array = plan.full_document.build(full, owners, misfits)
        full_misfits = set(misfits.by_event)
        before_array = plan.before_change.build(before, owners, misfits)

    arrays = [
        pa.array(ids, type=pa.string()),
        pa.array(operation, type=pa.string()),
        pa.array(
            [ts.time * 1_000_000 if ts is not None else None for ts in stamps],
            type=pa.timestamp("us", tz="UTC"),
        ),
        pa.array([ts.inc if ts is not None else None for ts in stamps], type=pa.int64()),
        pa.array([w if isinstance(w, datetime) else None for w in wall], type=pa.timestamp("us", tz="UTC")),
        pa.array(databases, type=pa.string()),
        pa.array(collections, type=pa.string()),
        pa.array(to_databases, type=pa.string()),
        pa.array(to_collections, type=pa.string()),
        pa.array(_document_keys(keys, json), type=pa.string()),
        full_array,
        before_array,
        pa.array(
            [json(u.get("updatedFields")) if u is not None else None for u in updates],
            type=pa.string(),
        ),
        pa.array(
            [u.get("removedFields") if u is not None else None for u in updates],
            type=pa.list_(pa.field("element", pa.string())),
        ),
        _truncated_arrays(updates),
    ]

    malformed = tuple(
        MalformedRow(index, raws[index]["_id"], path, reason)
        for index, (path, reason) in sorted(misfits.by_event.items())
    )
    if plan.corrupt_record:
        corrupt: list[str | None] = [None] * count
        for row in malformed:
            document = full[row.index] if row.index in full_misfits else before[row.index]
            corrupt[row.index] = json(document)
        arrays.append(pa.array(corrupt, type=pa.string()))
    if rescued is not None:
        arrays.append(pa.array(rescued, type=pa.string()))
    return pa.Table.from_arrays(arrays, schema=plan.schema), malformed


def _rescued(full: Any, before: Any, json: Encoder) -> str | None:
    """The ``_rescued_data`` of one row: what each document column could not take."""
    if full is NOTHING and before is NOTHING:
        return None
    parts = {}
    if full is not NOTHING:
        parts["full_document"] = full
    if before is not NOTHING:
        parts["full_document_before_change"] = before
    return json(parts)
