"""Collection and database statistics: the ``$collStats`` stage, the ``collStats`` command
(deprecated in MongoDB, still answered) and ``dbStats``, in mongod 7.0's reply shapes.

Sizes are honest where a test can check them and nominal where nothing is on disk: ``size`` and
``dataSize`` are the BSON sizes of the documents, ``count`` and ``objects`` the documents;
``storageSize`` is that size in 4 KiB pages (WiredTiger's allocation unit, one page at least, as
an empty collection has), and each index's size the bytes of its keys (plus an 8-byte record id
each) in pages too. So the sizes of a database are the sums of its collections', and grow as
documents and indexes do. There is no ``wiredTiger`` section, ``indexDetails`` is empty and no
index is ever being built.

Through a mongos, ``$collStats`` answers one document per shard that holds the collection (with
``shard``): its primary shard, or every shard for a collection sharded by ``{_id: "hashed"}``,
each with its own documents. The latency statistics, which the embedded cluster keeps for the
collection as a whole, are in the primary shard's document. ``collStats`` through a mongos adds
the shards' numbers up, with each shard's under ``shards``.
"""

from __future__ import annotations

import socket
from typing import Any

from bson import Int64

from flowwarden_embedded import views
from flowwarden_embedded.commands.arguments import bson_type_name
from flowwarden_embedded.commands.handshake import utcnow
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import format_value
from flowwarden_embedded.rawstrings import encode
from flowwarden_embedded.storage import Collection, Document, IndexSpec
from flowwarden_embedded.topology import Process, hash_share

PAGE_BYTES = 4096
_RECORD_ID_BYTES = 8
_COLL_STATS_FIELDS = ("latencyStats", "storageStats", "count", "queryExecStats")


def pages(size: int) -> int:
    """``size`` bytes rounded up to whole pages, one page at least."""
    return max(PAGE_BYTES, -(-size // PAGE_BYTES) * PAGE_BYTES)


def _index_bytes(index: IndexSpec, docs: list[Document]) -> int:
    total = 0
    for doc in docs:
        for _, values in index.keys_of(doc):
            try:
                key = encode({str(i): v for i, v in enumerate(values)})
            except Exception:  # a key value only this index's kind reads (undefined, ...)
                key = b"\x00" * 16
            total += len(key) + _RECORD_ID_BYTES
    return total


class Sizes:
    """The sizes of a set of documents of one collection, unscaled."""

    __slots__ = ("count", "data", "index_sizes", "storage")

    def __init__(self, coll: Collection, docs: list[Document]) -> None:
        self.count = len(docs)
        self.data = sum(len(encode(doc)) for doc in docs)
        self.storage = pages(self.data)
        self.index_sizes = {name: pages(_index_bytes(index, docs)) for name, index in coll.indexes.items()}

    @property
    def index_total(self) -> int:
        return sum(self.index_sizes.values())


def storage_stats(coll: Collection, docs: list[Document], scale: int) -> Document:
    """``storageStats`` of ``$collStats`` (and the body of ``collStats``) for ``docs`` of ``coll``,
    sizes divided by ``scale``, fields in mongod's order."""
    sizes = Sizes(coll, docs)
    stats: Document = {"size": sizes.data // scale, "count": sizes.count}
    if sizes.count:
        stats["avgObjSize"] = sizes.data // sizes.count
    stats["numOrphanDocs"] = 0
    stats["storageSize"] = sizes.storage // scale
    stats["freeStorageSize"] = 0
    capped = bool(coll.options.get("capped", False))
    stats["capped"] = capped
    if capped:
        stats["max"] = int(coll.options.get("max") or 0)
        stats["maxSize"] = int(coll.options.get("size") or 0) // scale
    stats["nindexes"] = len(coll.indexes)
    stats["indexDetails"] = {}
    stats["indexBuilds"] = []
    stats["totalIndexSize"] = sizes.index_total // scale
    stats["indexSizes"] = {name: size // scale for name, size in sizes.index_sizes.items()}
    stats["totalSize"] = (sizes.storage + sizes.index_total) // scale
    stats["scaleFactor"] = scale
    return stats


def _missing_storage_stats(scale: int) -> Document:
    """What ``collStats`` reports of a collection that does not exist, as mongod does."""
    return {
        "size": 0,
        "count": 0,
        "numOrphanDocs": 0,
        "storageSize": 0,
        "totalSize": 0,
        "nindexes": 0,
        "totalIndexSize": 0,
        "indexDetails": {},
        "indexSizes": {},
        "scaleFactor": scale,
    }


def _scale(value: Any, field_name: str) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(
            14,
            f"BSON field '{field_name}' is the wrong type '{bson_type_name(value)}', expected types "
            "'[long, int, decimal, double]'",
            code_name="TypeMismatch",
        )
    scale = int(value)
    if scale < 1:
        raise CommandError(51024, f"BSON field '{field_name}' value must be >= 1, actual value '{scale}'")
    return scale


def shard_documents(ctx: Context, coll: Collection | None, name: str) -> list[tuple[Process, list[Document]]]:
    """The processes that hold collection ``name`` and the documents each holds: the member that
    was asked; through a mongos, the collection's primary shard, or each shard its share of a
    collection sharded by ``{_id: "hashed"}``."""
    docs = list(coll.docs.values()) if coll is not None else []
    placement = ctx.host.placement
    if not ctx.conn.process.is_mongos or placement is None:
        return [(ctx.conn.process, docs)]
    if not placement.is_sharded(ctx.db, name):
        return [(placement.primary(ctx.db), docs)]
    shards = placement.shards
    parts: list[list[Document]] = [[] for _ in shards]
    for doc in docs:
        parts[hash_share(doc.get("_id"), len(shards))].append(doc)
    return list(zip(shards, parts, strict=True))


def _not_a_collection(ns: str) -> CommandError:
    return CommandError(
        166, f"Namespace {ns} is a view, not a collection", code_name="CommandNotSupportedOnView"
    )


def _not_found(what: str, ns: str) -> CommandError:
    return CommandError(
        26, f"Unable to retrieve {what} in $collStats stage :: caused by :: Collection [{ns}] not found."
    )


def coll_stats_documents(ctx: Context, name: str, spec: Any) -> list[Document]:
    """What a ``$collStats`` stage with ``spec`` outputs for collection ``name``."""
    if not isinstance(spec, dict):
        raise CommandError(
            40166, f"$collStats must take a nested object but found: $collStats: {format_value(spec)}"
        )
    for key, value in spec.items():
        if key not in _COLL_STATS_FIELDS:
            raise CommandError(
                40415, f"BSON field '$collStats.{key}' is an unknown field.", code_name="Location40415"
            )
        if not isinstance(value, dict):
            raise CommandError(
                14,
                f"BSON field '$collStats.{key}' is the wrong type '{bson_type_name(value)}', "
                "expected type 'object'",
                code_name="TypeMismatch",
            )
    ns = f"{ctx.db}.{name}"
    catalog = ctx.host.catalog
    if views.is_view(catalog, ctx.db, name) and any(k in spec for k in _COLL_STATS_FIELDS[1:]):
        raise _not_a_collection(ns)
    coll = catalog.get(ctx.db, name)
    latency = spec.get("latencyStats")
    histograms = False
    if latency is not None:
        histograms = latency.get("histograms", False)
        if not isinstance(histograms, bool):
            raise CommandError(
                14,
                f"BSON field '$collStats.latencyStats.histograms' is the wrong type "
                f"'{bson_type_name(histograms)}', expected type 'bool'",
                code_name="TypeMismatch",
            )
    storage = spec.get("storageStats")
    scale = _scale(storage.get("scale"), "$collStats.storageStats.scale") if storage is not None else 1
    usage = ctx.host.operations.usage_of(ns, coll.uuid if coll is not None else None)
    primary = ctx.host.placement.primary(ctx.db) if ctx.host.placement is not None else None
    out: list[Document] = []
    for process, docs in shard_documents(ctx, coll, name):
        doc: Document = {"ns": ns}
        if ctx.conn.process.is_mongos:
            doc["shard"] = process.set_name
        doc["host"] = f"{socket.gethostname()}:{process.port}"
        doc["localTime"] = utcnow()
        if latency is not None:
            counted = usage if (usage is not None and (primary is None or process is primary)) else None
            doc["latencyStats"] = (
                counted.latency_stats(histograms) if counted is not None else _no_latency(histograms)
            )
        if storage is not None:
            if coll is None:
                raise _not_found("storageStats", ns)
            doc["storageStats"] = storage_stats(coll, docs, scale)
        if "count" in spec:
            if coll is None:
                raise _not_found("count", ns)
            doc["count"] = len(docs)
        if "queryExecStats" in spec:
            if coll is None:
                raise _not_found("queryExecStats", ns)
            scans = Int64(usage.collection_scans if usage is not None else 0)
            doc["queryExecStats"] = {"collectionScans": {"total": scans, "nonTailable": scans}}
        out.append(doc)
    return out


def _no_latency(histograms: bool) -> Document:
    zero: Document = {"latency": Int64(0), "ops": Int64(0)}
    if histograms:
        zero = {"histogram": [], **zero}
    return {kind: dict(zero) for kind in ("reads", "writes", "commands", "transactions")}


@command("collStats")
async def cmd_coll_stats(ctx: Context) -> Document:
    name = ctx.collection_name()
    ns = f"{ctx.db}.{name}"
    scale = _scale(ctx.cmd.get("scale"), "collStats.scale")
    catalog = ctx.host.catalog
    if views.is_view(catalog, ctx.db, name):
        raise _not_a_collection(ns)
    coll = catalog.get(ctx.db, name)
    if coll is None:
        return {"ns": ns, **_missing_storage_stats(scale), "ok": 1.0}
    parts = shard_documents(ctx, coll, name)
    if not ctx.conn.process.is_mongos:
        return {"ns": ns, **storage_stats(coll, parts[0][1], scale), "ok": 1.0}
    per_shard = {process.set_name: storage_stats(coll, docs, scale) for process, docs in parts}
    count = sum(s["count"] for s in per_shard.values())
    size = sum(len(encode(doc)) for _, docs in parts for doc in docs)
    placement = ctx.host.placement
    reply: Document = {"sharded": placement is not None and placement.is_sharded(ctx.db, name)}
    if not reply["sharded"]:
        reply["primary"] = parts[0][0].set_name
    reply.update(
        {
            "capped": bool(coll.options.get("capped", False)),
            "ns": ns,
            "count": count,
            "size": size // scale,
            "storageSize": sum(s["storageSize"] for s in per_shard.values()),
            "totalIndexSize": sum(s["totalIndexSize"] for s in per_shard.values()),
            "totalSize": sum(s["totalSize"] for s in per_shard.values()),
            "indexSizes": {
                index: sum(s["indexSizes"][index] for s in per_shard.values()) for index in coll.indexes
            },
            "avgObjSize": size // count if count else 0,
            "nindexes": len(coll.indexes),
            "nchunks": len(per_shard),
            "scaleFactor": scale,
            "shards": per_shard,
            "ok": 1.0,
        }
    )
    return reply


@command("dbStats")
async def cmd_db_stats(ctx: Context) -> Document:
    scale = _scale(ctx.cmd.get("scale"), "dbStats.scale")
    catalog = ctx.scope.catalog
    colls = catalog.collections(ctx.db)
    objects = data = storage = index_size = indexes = 0
    for coll in colls:
        sizes = Sizes(coll, list(coll.docs.values()))
        objects += sizes.count
        data += sizes.data
        storage += sizes.storage
        index_size += sizes.index_total
        indexes += len(coll.indexes)
    reply: Document = {
        "db": ctx.db,
        "collections": len(colls),
        "views": len(views.definitions(catalog, ctx.db)),
        "objects": objects,
        "avgObjSize": data / objects if objects else 0.0,
        "dataSize": data // scale,
        "storageSize": storage // scale,
    }
    free = bool(ctx.cmd.get("freeStorage"))
    if free:
        reply["freeStorageSize"] = 0
    reply["indexes"] = indexes
    reply["indexSize"] = index_size // scale
    if free:
        reply["indexFreeStorageSize"] = 0
    reply["totalSize"] = (storage + index_size) // scale
    if free:
        reply["totalFreeStorageSize"] = 0
    reply["scaleFactor"] = scale
    reply["ok"] = 1.0
    return reply
