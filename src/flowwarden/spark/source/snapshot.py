"""The streaming source's initial snapshot: ``.option("snapshot", "initial")``.

A new query first takes the stream's position ``T`` (as ``RESUME``/``LATEST`` do), then its
first micro-batches are the existing documents, read in ``_id`` order, collection after
collection; once they are all read, the micro-batches are the change events after ``T``. The
offsets cover both phases: during the copy an offset is

    {"snapshot": {"token": <T's _data>, "namespaces": [..], "at": <index>,
                  "endId": <canonical Extended JSON of the bound of namespace ``at``; MinKey: none>,
                  "lastId": <canonical Extended JSON of the last _id read; MinKey: none>,
                  "copied": <documents read so far>}}

The copy is bounded: when a collection's copy begins (after ``T`` was taken; the first one's in
the initial offset, each later one's when planning moves on to it), its highest ``_id`` under
the copy filter is read and carried in the offsets (``endId``), and no ``_id`` past it is read;
documents inserted later with a higher ``_id`` are changes after ``T`` and arrive as such, so
the copy ends however fast documents are inserted, and a restarted query copies to the bound
its offsets carry. A micro-batch from such an offset to the next one holds the documents of
namespace ``at`` of the end offset with ``_id`` in (start ``lastId``, end ``lastId``] (from the
first ``_id`` when the start offset is of an earlier namespace). Once every document was read,
one empty micro-batch ends at the same offset with ``"done": true``, so the copy ends at a fixed
point whatever is inserted later; a change-stream offset after it holds the events after ``T``
(with ``snapshot=initial_only`` nothing follows it). Planning reads a micro-batch's documents and
carries them to the executor; a micro-batch Spark replays without planning it again reads that
``_id`` range again, as the documents are then (their changes since ``T`` follow as change
events anyway). Rows are :func:`~flowwarden.mongo.initial_copy.snapshot_row`\\ s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from bson import MinKey, json_util
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

Offset = dict[str, Any]
_JSON = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True)


def is_snapshot(offset: Mapping[str, Any]) -> bool:
    return isinstance(offset.get("snapshot"), Mapping)


def snapshot_token(offset: Mapping[str, Any]) -> dict[str, Any]:
    """The position the changes follow from, ``T``."""
    return {"_data": offset["snapshot"]["token"]}


def is_done(offset: Mapping[str, Any]) -> bool:
    return is_snapshot(offset) and bool(offset["snapshot"].get("done"))


def done_offset(offset: Offset) -> Offset:
    """The offset that closes the copy after ``offset``."""
    return {"snapshot": {**offset["snapshot"], "done": True}}


def first_offset(token: Mapping[str, Any], namespaces: list[str], end_id: Any) -> Offset:
    """The offset a new query starts at: ``end_id`` is the first namespace's bound (see
    :func:`bound`), read after ``token`` was taken."""
    return {
        "snapshot": {
            "token": token["_data"],
            "namespaces": namespaces,
            "at": 0,
            "endId": _dump_id(end_id),
            "lastId": _dump_id(MinKey()),
            "copied": 0,
        }
    }


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


def namespaces(client: Any, database: str | None, collection: str | None) -> list[str]:
    """The collections a source copies, in order (as the connector's snapshot chooses them)."""
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
        found.extend(f"{name}.{each}" for each in sorted(collections) if copied_collection(each))
    return found


def plan_chunk(
    raw_client: Any, start: Offset, max_rows: int, max_bytes: int, query: Mapping[str, Any]
) -> tuple[Offset, bytes] | None:
    """The next micro-batch of the copy after ``start``: its end offset and its rows' BSON back
    to back; None when every document was read."""
    state = start["snapshot"]
    cluster_time = token_cluster_time(snapshot_token(start))
    at = state["at"]
    last = _load_id(state["lastId"])
    end_id = _load_id(state["endId"])
    names: list[str] = state["namespaces"]
    while at < len(names):
        rows: list[bytes] = []
        size = 0
        last_id: Any = None
        database, collection = names[at].split(".", 1)
        empty = isinstance(end_id, MinKey)
        for document in () if empty else _documents(raw_client, names[at], query, last, end_id, max_rows):
            row = snapshot_row(document, database, collection, cluster_time, raw=True)
            rows.append(row.raw)
            size += len(row.raw)
            last_id = document["_id"]
            if size >= max_bytes:
                break
        if rows:
            end = {
                "snapshot": {
                    **state,
                    "at": at,
                    "endId": _dump_id(end_id),
                    "lastId": _dump_id(plain_id(last_id)),
                    "copied": state["copied"] + len(rows),
                }
            }
            return end, b"".join(rows)
        at += 1
        last = MinKey()
        end_id = bound(raw_client, names[at] if at < len(names) else None, query)
    return None


def replay_chunk(
    raw_client: Any, start: Offset, end: Offset, query: Mapping[str, Any]
) -> Iterator[RawBSONDocument]:
    """The rows of the range (start, end] of the copy, read again (see the module docstring)."""
    state = end["snapshot"]
    namespace = state["namespaces"][state["at"]]
    same = start["snapshot"]["at"] == state["at"]
    lower = _load_id(start["snapshot"]["lastId"]) if same else MinKey()
    upper = _load_id(state["lastId"])
    cluster_time = token_cluster_time(snapshot_token(end))
    database, collection = namespace.split(".", 1)
    for document in _documents(raw_client, namespace, query, lower, upper, None):
        yield snapshot_row(document, database, collection, cluster_time, raw=True)


def _documents(
    raw_client: Any, namespace: str, query: Mapping[str, Any], after: Any, through: Any, limit: int | None
) -> Iterator[RawBSONDocument]:
    """The documents of ``namespace`` matching ``query`` with ``_id`` after ``after`` (MinKey:
    from the first) and up to ``through`` (an ``_id`` read before), in ``_id`` order."""
    database, collection = namespace.split(".", 1)
    filter_ = all_of(query, id_range(after, through))
    cursor = raw_client[database][collection].find(filter_, sort=[("_id", 1)], limit=limit or 0)
    with cursor:
        yield from cursor


def _dump_id(value: Any) -> str:
    # Wrapped: a bare null would read back as "no value"; any value, null included, may be an _id.
    return json_util.dumps({"v": value}, json_options=_JSON)


def _load_id(text: str) -> Any:
    return json_util.loads(text, json_options=_JSON)["v"]


__all__ = [
    "bound",
    "done_offset",
    "first_offset",
    "is_done",
    "is_snapshot",
    "namespaces",
    "plan_chunk",
    "replay_chunk",
    "snapshot_token",
]
