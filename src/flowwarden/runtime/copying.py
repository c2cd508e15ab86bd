"""Reading a stream's existing documents for a copy: which collections, their bounds, chunks in
``_id`` order, and the snapshot rows the documents become.

Shared by the initial snapshot (:mod:`flowwarden.runtime.snapshot`) and incremental snapshots
(:mod:`flowwarden.runtime.incremental`). The rule it keeps: a copy reads only what the stream's
changes would deliver (the stream's ``$match`` stages that read the document, a partitioned
stream's bucket among them: :func:`flowwarden.mongo.initial_copy.copy_filter`), narrowed by the
copy's own filter when it has one, and each document as raw BSON, so that one document that
cannot be decoded is given up alone. Nothing here hands a row to a method or saves progress.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson import MinKey
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from flowwarden.config.spec import StreamSpec
from flowwarden.mongo.initial_copy import (
    all_of,
    copied_collection,
    copied_database,
    copy_filter,
    plain_id,
    snapshot_row,
)
from flowwarden.mongo.sensitive_fields import snapshot_projection
from flowwarden.runtime.exhausted import GivingUp
from flowwarden.runtime.opening import StreamOpener


class CopyReader:
    """Reads one stream's documents for a copy; ``query`` narrows the copy filter further."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        client: Any,
        opener: StreamOpener,
        giving_up: GivingUp,
        query: Mapping[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self._client = client
        self._opener = opener
        self._giving_up = giving_up
        self.query: dict[str, Any] = all_of(copy_filter(spec.pipeline), query or {})
        """The find filter every read of the copy applies."""

    def narrowed(self, query: Mapping[str, Any] | None) -> CopyReader:
        """The same reader with ``query`` (a copy's own filter) applied as well."""
        return CopyReader(
            self.spec, client=self._client, opener=self._opener, giving_up=self._giving_up, query=query
        )

    def collection(self, namespace: str, read_concern: Any = None) -> Any:
        """``namespace``'s collection, read as raw BSON always: DataFrame streams keep it, the
        others decode each document on its own, so one that cannot be decoded is given up alone
        (see :meth:`rows`)."""
        database, _, collection = namespace.partition(".")
        target = self._client[database][collection]
        # surrogateescape: reading a raw document's _id inflates all of it, and text that is not
        # UTF-8 must not stop the copy there (the bytes themselves stay as the server sent them).
        reading = (self._opener.read_options() or CodecOptions(document_class=RawBSONDocument)).with_options(
            unicode_decode_error_handler="surrogateescape"
        )
        if read_concern is not None:
            return target.with_options(codec_options=reading, read_concern=read_concern)
        return target.with_options(codec_options=reading)

    async def find(
        self,
        namespace: str,
        ids: Mapping[str, Any],
        limit: int = 0,
        *,
        session: Any = None,
        read_concern: Any = None,
    ) -> list[Any]:
        """The documents of ``namespace`` in the ``_id`` range ``ids`` that the copy filter
        matches, in ``_id`` order (at most ``limit``; 0: all)."""
        cursor = self.collection(namespace, read_concern).find(
            all_of(self.query, ids),
            projection=snapshot_projection(self.spec.stream.exclude_fields),
            sort=[("_id", 1)],
            limit=limit,
            batch_size=limit or self.spec.stream.snapshot_chunk_size,
            session=session,
        )
        documents: list[Any] = await cursor.to_list(None)
        return documents

    async def bound(self, namespace: str) -> Any:
        """The highest ``_id`` of ``namespace`` the copy filter matches (MinKey: none)."""
        if not namespace:
            return MinKey()
        cursor = self.collection(namespace).find(
            self.query, projection={"_id": 1}, sort=[("_id", -1)], limit=1
        )
        found = await cursor.to_list(None)
        return plain_id(found[0]["_id"]) if found else MinKey()

    async def rows(self, documents: list[Any], namespace: str, cluster_time: Any) -> list[Any]:
        """The snapshot rows of raw ``documents``: kept raw for DataFrame streams, else decoded
        with the collection's codec options. A document that cannot be decoded gets
        ``on_exhausted`` at once, alone: decoding it again cannot help (STOP fails the stream
        before it; SKIP and DEAD_LETTER go on without it)."""
        database, _, collection = namespace.partition(".")
        decode: CodecOptions[Any] | None = None
        if self._opener.read_options() is None:
            decode = self._client[database][collection].codec_options
        rows = []
        for document in documents:
            if decode is None:
                rows.append(snapshot_row(document, database, collection, cluster_time, raw=True))
                continue
            try:
                decoded = bson.decode(document.raw, codec_options=decode)
            except Exception as error:  # whatever the codec raised: this document cannot be read
                row = snapshot_row(document, database, collection, cluster_time, raw=True)
                await self._giving_up.undecodable(row.raw, error, in_batch=False)
                continue
            rows.append(snapshot_row(decoded, database, collection, cluster_time, raw=False))
        return rows

    async def namespaces(self) -> list[str]:
        """The collections the stream covers (those ``collections`` and ``exclude_collections``
        select, as for its changes), in name order."""
        options = self.spec.stream
        if options.collection is not None:
            return [f"{options.database}.{options.collection}"]
        databases = [options.database] if options.database is not None else await self._databases()
        selection = options.selection
        namespaces: list[str] = []
        for database in databases:
            names = await self._client[database].list_collection_names(filter={"type": "collection"})
            namespaces.extend(
                f"{database}.{name}"
                for name in sorted(names)
                if copied_collection(name) and selection.selects(database, name)
            )
        return namespaces

    async def _databases(self) -> list[str]:
        names = await self._client.list_database_names()
        return sorted(name for name in names if copied_database(name))

    async def estimate(self, namespaces: list[str]) -> int:
        """The documents of ``namespaces``, as the collections' metadata estimates them."""
        total = 0
        for namespace in namespaces:
            database, _, collection = namespace.partition(".")
            total += await self._client[database][collection].estimated_document_count()
        return total


__all__ = ["CopyReader"]
