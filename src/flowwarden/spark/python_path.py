"""The Python path: decoded change events to the change-event table, column by column.

Owns converting events in Python: raw events decoded with
:data:`~flowwarden.spark.native.DECODE_OPTIONS` (:func:`decode_events`), then
:func:`python_table` reads every event once for its top-level keys, turns each column into
one Python list handed to pyarrow whole, and types the two document columns with the plan's
builders (:mod:`flowwarden.spark.columns`). This is the path of every batch the compiled
converter does not take (decoded dicts, mixed batches, no compiled module) and of the single
events it leaves to Python.

Hard rules: a row is never assembled as a dict, and the output equals the compiled
converter's for the same events (the differential tests hold the two to it). Every event
stays in the table, the malformed ones too; the schema mode is applied by
:func:`flowwarden.spark.arrow.events_to_arrow`, never here. This module imports pyarrow,
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

from flowwarden.errors import FlowWardenError
from flowwarden.events import ChangeEvent, InvalidTokenError
from flowwarden.spark import native
from flowwarden.spark._extra import require
from flowwarden.spark.columns import columns_reader
from flowwarden.spark.extjson import Encoder, JsonMode, encoder_for
from flowwarden.spark.misfits import FirstMisfits, MalformedRow
from flowwarden.spark.plan import ConversionPlan

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

__all__ = ["UndecodableEventError", "decode_events", "python_table", "unwrap_events"]

_EVENT_KEYS = (
    "operationType",
    "clusterTime",
    "wallTime",
    "ns",
    "documentKey",
    "updateDescription",
    "fullDocument",
    "fullDocumentBeforeChange",
)


class UndecodableEventError(FlowWardenError, ValueError):
    """A raw event of the batch is not BSON that PyMongo can decode."""

    def __init__(self, index: int, reason: str) -> None:
        self.index = index
        self.reason = reason
        super().__init__(
            f"event {index} of the batch is not valid BSON ({reason}); the bytes were damaged "
            "between the server and here. Dead-letter that event's raw bytes or read the stream "
            "with PyMongo's decoding to see which field is affected"
        )


def unwrap_events(events: Sequence[Mapping[str, Any] | ChangeEvent]) -> list[Mapping[str, Any]]:
    """Each event as its raw mapping: a ChangeEvent's ``raw``, anything else as it is."""
    return [event.raw if isinstance(event, ChangeEvent) else event for event in events]


def decode_events(
    raws: list[Mapping[str, Any]], positions: Sequence[int] | None = None
) -> list[Mapping[str, Any]]:
    """Every RawBSONDocument decoded with :data:`~flowwarden.spark.native.DECODE_OPTIONS`
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


def _token_data(raws: list[Mapping[str, Any]]) -> list[str]:
    try:
        return [raw["_id"]["_data"] for raw in raws]
    except (KeyError, TypeError):
        for index, raw in enumerate(raws):
            token = raw.get("_id") if isinstance(raw, Mapping) else None
            if not isinstance(token, Mapping) or not isinstance(token.get("_data"), str):
                raise InvalidTokenError(
                    f"event {index} of the batch has no resume token _id._data (got {token!r}); "
                    "a pipeline stage must not remove or rewrite _id"
                ) from None
        raise


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


def python_table(
    raws: list[Mapping[str, Any]], plan: ConversionPlan, json_mode: JsonMode
) -> tuple[Any, tuple[MalformedRow, ...]]:
    """The table of decoded events, with every row (the malformed ones with nulls where values
    did not fit and, when the plan has one, their Extended JSON in ``_corrupt_record``), and
    the malformed rows in event order."""
    json = encoder_for(json_mode)
    count = len(raws)

    ids = _token_data(raws)
    operation, cluster, wall, ns, keys, updates, full, before = columns_reader(_EVENT_KEYS)(raws, None)
    cluster_us = [ts.time * 1_000_000 if type(ts) is Timestamp else None for ts in cluster]
    namespaces = [n if n is not None else {} for n in ns]

    misfits = FirstMisfits()
    owners = range(count)
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
        pa.array(cluster_us, type=pa.timestamp("us", tz="UTC")),
        pa.array([w if isinstance(w, datetime) else None for w in wall], type=pa.timestamp("us", tz="UTC")),
        pa.array([ns.get("db") for ns in namespaces], type=pa.string()),
        pa.array([ns.get("coll") for ns in namespaces], type=pa.string()),
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
    return pa.Table.from_arrays(arrays, schema=plan.schema), malformed
