"""The streaming source's initial snapshot: ``.option("snapshot", "initial")``.

A new query first takes the stream's position ``T`` (as ``RESUME``/``LATEST`` do), then its
first micro-batches are the existing documents, read in ``_id`` order, collection after
collection; once they are all read, the micro-batches are the change events after ``T``. The
offsets cover both phases: during the copy an offset is a
:class:`~flowwarden.spark.source.offsets.SnapshotOffset`: ``T``, the namespaces copied, the index
``at`` of the one being copied, its bound ``end_id``, the last ``_id`` read ``last_id``, and the
number of documents read so far.

The copy is bounded: when a collection's copy begins (after ``T`` was taken; the first one's in
the initial offset, each later one's when planning moves on to it), its highest ``_id`` under
the copy filter is read and carried in the offsets (``end_id``), and no ``_id`` past it is read;
documents inserted later with a higher ``_id`` are changes after ``T`` and arrive as such, so
the copy ends however fast documents are inserted, and a restarted query copies to the bound
its offsets carry. A micro-batch from such an offset to the next one holds the documents of
namespace ``at`` of the end offset with ``_id`` in (start ``last_id``, end ``last_id``] (from the
first ``_id`` when the start offset is of an earlier namespace). Once every document was read,
one empty micro-batch ends at the same offset with ``done``, so the copy ends at a fixed
point whatever is inserted later; a change-stream offset after it holds the events after ``T``
(with ``snapshot=initial_only`` nothing follows it). A database or cluster source copies the
collections its ``collections`` and ``exclude_collections`` select, and its ``exclude_fields``
are left out of the documents by the server (a projection). Planning reads a micro-batch's documents and
carries them to the executor; a micro-batch Spark replays without planning it again reads that
``_id`` range again, as the documents are then (their changes since ``T`` follow as change
events anyway). Rows are :func:`~flowwarden.mongo.initial_copy.snapshot_row`\\ s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from bson import MinKey
from bson.raw_bson import RawBSONDocument

from flowwarden.events import token_cluster_time
from flowwarden.mongo.initial_copy import (
    all_of,
    copied_collection,
    copied_database,
    id_range,
    plain_id,
    snapshot_row,
)
from flowwarden.mongo.namespaces import NamespaceSelection
from flowwarden.spark.source.offsets import SnapshotOffset, dump_id, load_id


def done_offset(offset: SnapshotOffset) -> SnapshotOffset:
    """The offset that closes the copy after ``offset``."""
    return dataclasses.replace(offset, done=True)


def first_offset(token: Mapping[str, Any], namespaces: list[str], end_id: Any) -> SnapshotOffset:
    """The offset a new query starts at: ``end_id`` is the first namespace's bound (see
    :func:`bound`), read after ``token`` was taken."""
    return SnapshotOffset(
        token=token["_data"],
        namespaces=tuple(namespaces),
        at=0,
        end_id=dump_id(end_id),
        last_id=dump_id(MinKey()),
        copied=0,
    )


def bound(raw_client: Any, namespace: str | None, query: Mapping[str, Any]) -> Any:
    """The highest ``_id`` of ``namespace`` that ``query`` matches, in MongoDB's sort order
    (MinKey: none, or no namespace)."""
    if namespace is None:
        return MinKey()
    database, collection = namespace.split(".", 1)
    cursor = raw_client[database][collection].find(
        dict(query), projection={"_id": 1}, sort=[("_id", -1)], limit=1
    )
    with cursor:
        for document in cursor:
            return plain_id(document["_id"])
    return MinKey()


def namespaces(
    client: Any, database: str | None, collection: str | None, selection: NamespaceSelection | None = None
) -> list[str]:
    """The collections a source copies, in order (as the connector's snapshot chooses them):
    for a database or cluster, those ``selection`` selects (every one without it)."""
    if database is not None and collection is not None:
        return [f"{database}.{collection}"]
    databases = (
        [database]
        if database is not None
        else sorted(name for name in client.list_database_names() if copied_database(name))
    )
    found: list[str] = []
    for name in databases:
        collections = client[name].list_collection_names(filter={"type": "collection"})
        found.extend(
            f"{name}.{each}"
            for each in sorted(collections)
            if copied_collection(each) and (selection is None or selection.selects(name, each))
        )
    return found


def plan_chunk(
    raw_client: Any,
    start: SnapshotOffset,
    max_rows: int,
    max_bytes: int,
    query: Mapping[str, Any],
    projection: Mapping[str, Any] | None = None,
) -> tuple[SnapshotOffset, bytes] | None:
    """The next micro-batch of the copy after ``start``: its end offset and its rows' BSON back
    to back; None when every document was read."""
    cluster_time = token_cluster_time({"_data": start.token})
    at = start.at
    last = load_id(start.last_id)
    end_id = load_id(start.end_id)
    names = start.namespaces
    while at < len(names):
        rows: list[bytes] = []
        size = 0
        last_id: Any = None
        database, collection = names[at].split(".", 1)
        empty = isinstance(end_id, MinKey)
        found = () if empty else _documents(raw_client, names[at], query, last, end_id, max_rows, projection)
        for document in found:
            row = snapshot_row(document, database, collection, cluster_time, raw=True)
            rows.append(row.raw)
            size += len(row.raw)
            last_id = document["_id"]
            if size >= max_bytes:
                break
        if rows:
            end = dataclasses.replace(
                start,
                at=at,
                end_id=dump_id(end_id),
                last_id=dump_id(plain_id(last_id)),
                copied=start.copied + len(rows),
            )
            return end, b"".join(rows)
        at += 1
        last = MinKey()
        end_id = bound(raw_client, names[at] if at < len(names) else None, query)
    return None


def replay_chunk(
    raw_client: Any,
    start: SnapshotOffset,
    end: SnapshotOffset,
    query: Mapping[str, Any],
    projection: Mapping[str, Any] | None = None,
) -> Iterator[RawBSONDocument]:
    """The rows of the range (start, end] of the copy, read again (see the module docstring)."""
    namespace = end.namespaces[end.at]
    lower = load_id(start.last_id) if start.at == end.at else MinKey()
    upper = load_id(end.last_id)
    cluster_time = token_cluster_time({"_data": end.token})
    database, collection = namespace.split(".", 1)
    for document in _documents(raw_client, namespace, query, lower, upper, None, projection):
        yield snapshot_row(document, database, collection, cluster_time, raw=True)


def _documents(
    raw_client: Any,
    namespace: str,
    query: Mapping[str, Any],
    after: Any,
    through: Any,
    limit: int | None,
    projection: Mapping[str, Any] | None,
) -> Iterator[RawBSONDocument]:
    """The documents of ``namespace`` matching ``query`` with ``_id`` after ``after`` (MinKey:
    from the first) and up to ``through`` (an ``_id`` read before), in ``_id`` order, with
    ``projection`` (the excluded fields left out by the server)."""
    database, collection = namespace.split(".", 1)
    filter_ = all_of(query, id_range(after, through))
    cursor = raw_client[database][collection].find(
        filter_, projection=projection, sort=[("_id", 1)], limit=limit or 0
    )
    with cursor:
        yield from cursor


__all__ = [
    "bound",
    "done_offset",
    "first_offset",
    "namespaces",
    "plan_chunk",
    "replay_chunk",
]
