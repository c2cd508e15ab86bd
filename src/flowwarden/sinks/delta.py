"""Batches of change events into a Delta table, exactly once, with delta-rs (no Spark jars).

:class:`DeltaSink` owns one table keyed by a document field (``key``, ``_id`` by default). Each
:meth:`DeltaSink.write` keeps the batch's last change per document
(:func:`~flowwarden.spark.latest.latest_per_key_arrow`) and MERGEs it into the table: a delete
deletes the row, any other change inserts or replaces it with the full document's fields (and
``_rescued_data`` when the batch has it). The table's rows are the documents as the stream last
saw them.

Exactly once: the MERGE commit also records a Delta application transaction ``(app_id,
version)`` (``app_id``: the stream's name unless given), and writes the batch id in the
commit's metadata. ``version`` grows with the batch's place in the stream: the cluster time
of the batch's first event (seconds << 32 | increment), or one more than the table's when a
transaction's events straddle two batches and both start at one cluster time. A batch the
table already has (the connector delivers a batch again after a crash between this commit and
its checkpoint save) is found by the table's transaction version and the batch id of its last
commit, and skipped: no second commit. Batches reach a sink in stream order, one at a time
(``@on_batch`` / ``@on_dataframe`` guarantee it), so an older batch than the table's last one was
committed already.

Hard rule: an update needs its full document (``full_document="updateLookup"``, or post-images);
an update that comes without one (its document was deleted before the lookup) is left out of
the batch, and its delete follows. This module imports deltalake and pyarrow when a sink is
created, never at import.
"""

from __future__ import annotations

import logging
from typing import Any

from bson import json_util
from bson.objectid import ObjectId

from flowwarden.errors import ConfigurationError, MissingDependencyError
from flowwarden.events import token_cluster_time

__all__ = ["BATCH_METADATA", "DeltaSink", "batch_version"]

log = logging.getLogger(__name__)

BATCH_METADATA = "flowwarden.batch"
"""The commit metadata key holding the id (first token ``_data``) of the batch a commit applied."""
STREAM_METADATA = "flowwarden.stream"
"""The commit metadata key holding the sink's app_id."""
_OPERATION = "__flowwarden_operation"
_HISTORY_DEPTH = 1000  # commits searched for the sink's last one (other writers may come between)


def batch_version(batch_id: str) -> int:
    """The base Delta transaction version of a batch: its first event's cluster time as
    ``seconds << 32 | increment``, which grows with the batch's place in the stream."""
    stamp = token_cluster_time({"_data": batch_id})
    return (stamp.time << 32) | stamp.inc


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:
        raise MissingDependencyError("DeltaSink", extra="delta", package="deltalake") from exc
    return deltalake


class DeltaSink:
    """A Delta table written by MERGE, one commit per batch, each batch exactly once.

    ``table_uri``: a path or any URI delta-rs opens (``s3://``, ``abfss://`` ... with
    ``storage_options``); the table is created by the first batch, from its columns. ``key``:
    the document field that identifies a row (``_id``); its values come from the events'
    ``documentKey``, so deletes find their row. ``app_id``: the application id of the table's
    transactions, the stream's name (``ctx.stream``) by default; two sinks writing one table
    need two.
    """

    def __init__(
        self,
        table_uri: str,
        key: str = "_id",
        *,
        app_id: str | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        if not isinstance(key, str) or not key or "." in key:
            raise ConfigurationError(
                f"key {key!r} is not a top-level document field",
                owner="DeltaSink",
                option="key",
                value=key,
                allowed="a field name such as '_id'",
            )
        self._deltalake = _deltalake()
        from flowwarden.spark._extra import require

        self._pa = require("pyarrow", "DeltaSink")
        self.table_uri = table_uri
        self.key = key
        self.app_id = app_id
        self.storage_options = storage_options

    # ------------------------------------------------------------------------------------------

    def write(self, batch: Any, ctx: Any) -> bool:
        """MERGE ``batch`` (a Spark DataFrame or a pyarrow Table of change-event columns) into
        the table, unless the table already has it; True when a commit was made. ``ctx`` is the
        batch method's StreamContext (its ``batch_id`` and ``stream`` name the batch)."""
        batch_id = getattr(ctx, "batch_id", None)
        if not batch_id:
            raise ConfigurationError(
                "DeltaSink.write needs the StreamContext of an @on_batch or @on_dataframe call "
                "(its batch_id makes the write exactly once)",
                owner="DeltaSink",
                option="ctx",
                value=ctx,
            )
        app_id = self.app_id or str(ctx.stream)
        rows = self._rows(_arrow(batch, self._pa))
        if rows.num_rows == 0:
            return False  # nothing to apply, nothing to record: a redelivery finds nothing either
        dl = self._deltalake
        table = self._table(rows)
        version = self._version(table, app_id, str(batch_id))
        if version is None:
            log.info("DeltaSink %s: batch %s is in the table already; skipped", self.table_uri, batch_id)
            return False
        properties = dl.CommitProperties(
            custom_metadata={BATCH_METADATA: str(batch_id), STREAM_METADATA: app_id},
            app_transactions=[dl.Transaction(app_id=app_id, version=version)],
        )
        columns = [name for name in rows.column_names if name != _OPERATION]
        assignments = {_quoted(name): f"s.{_quoted(name)}" for name in columns}
        (
            table.merge(
                rows,
                predicate=f"t.{_quoted(self.key)} = s.{_quoted(self.key)}",
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=properties,
            )
            .when_matched_delete(predicate=f"s.{_OPERATION} = 'delete'")
            .when_matched_update(assignments, predicate=f"s.{_OPERATION} <> 'delete'")
            .when_not_matched_insert(assignments, predicate=f"s.{_OPERATION} <> 'delete'")
            .execute()
        )
        return True

    # ------------------------------------------------------------------------------------------

    def _table(self, rows: Any) -> Any:
        dl = self._deltalake
        if dl.DeltaTable.is_deltatable(self.table_uri, storage_options=self.storage_options):
            return dl.DeltaTable(self.table_uri, storage_options=self.storage_options)
        schema = rows.schema.remove(rows.schema.get_field_index(_OPERATION))
        return dl.DeltaTable.create(
            self.table_uri, schema=schema, mode="ignore", storage_options=self.storage_options
        )

    def _version(self, table: Any, app_id: str, batch_id: str) -> int | None:
        """The transaction version this batch commits with, or None when the table has it."""
        base = batch_version(batch_id)
        stored = table.transaction_version(app_id)
        if stored is None or stored < base:
            return base
        # A version at or past this batch's: this batch again, or one that starts at the same
        # cluster time as the one before it. The last batch committed tells them apart.
        last = self._last_batch(table, app_id)
        if last is not None and batch_id <= last:
            return None
        return int(stored) + 1

    @staticmethod
    def _last_batch(table: Any, app_id: str) -> str | None:
        for commit in table.history(_HISTORY_DEPTH):
            if commit.get(STREAM_METADATA) == app_id and commit.get(BATCH_METADATA):
                return str(commit[BATCH_METADATA])
        return None

    def _rows(self, events: Any) -> Any:
        """The batch as the table's rows: the last change per document, the key column first,
        then the full document's fields (or the document as Extended JSON), ``_rescued_data``,
        and the operation the MERGE reads."""
        from flowwarden.spark.latest import latest_per_key_arrow

        pa, pc = self._pa, _compute()
        operation = events["operation_type"]
        documents = events["full_document"]
        # Updates whose lookup found no document: their delete follows (see the module docstring).
        orphan = pc.and_(pc.is_in(operation, pa.array(["update", "replace"])), pc.is_null(documents))
        orphans = pc.sum(orphan).as_py() or 0
        if orphans:
            log.warning(
                "DeltaSink %s: %d update(s) without a full document left out; a stream feeding a "
                "table needs full_document='updateLookup'",
                self.table_uri,
                orphans,
            )
            events = events.filter(pc.invert(orphan))
        events = events.filter(pc.is_in(events["operation_type"], pa.array(_DOCUMENT_OPERATIONS)))
        latest = latest_per_key_arrow(events)
        document = latest["full_document"].combine_chunks()
        columns: dict[str, Any] = {}
        key_type = None
        if pa.types.is_struct(document.type):
            fields = {document.type.field(i).name: i for i in range(document.type.num_fields)}
            if self.key in fields:
                key_type = document.type.field(self.key).type
            keys = self._keys(latest["document_key"].to_pylist(), key_type)
            columns[self.key] = keys
            for name, index in fields.items():
                if name != self.key:
                    columns[name] = document.field(index)
        else:
            columns[self.key] = self._keys(latest["document_key"].to_pylist(), None)
            columns["full_document"] = document
        if "_rescued_data" in latest.column_names:
            columns["_rescued_data"] = latest["_rescued_data"]
        columns[_OPERATION] = latest["operation_type"]
        return pa.table(columns)

    def _keys(self, document_keys: list[str], key_type: Any) -> Any:
        """The key field of each event's documentKey: ObjectIds as their hex (what a typed
        ``_id`` column holds), other strings and numbers as they are, anything else as Extended
        JSON."""
        pa = self._pa
        values: list[Any] = []
        for text in document_keys:
            value = json_util.loads(text).get(self.key)
            if isinstance(value, ObjectId):
                value = str(value)
            elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
                value = json_util.dumps(value)
            values.append(value)
        if key_type is not None:
            try:
                return pa.array(values, type=key_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            texts = [v if isinstance(v, str) else json_util.dumps(v) for v in values]
            return pa.array(texts, type=pa.string())


_DOCUMENT_OPERATIONS = ["insert", "update", "replace", "delete", "snapshot"]


def _compute() -> Any:
    import pyarrow.compute as pc

    return pc


def _arrow(batch: Any, pa: Any) -> Any:
    if isinstance(batch, pa.Table):
        return batch
    to_arrow = getattr(batch, "toArrow", None)  # a Spark DataFrame (PySpark 4)
    if callable(to_arrow):
        return to_arrow()
    raise ConfigurationError(
        f"DeltaSink.write takes a Spark DataFrame or a pyarrow Table, got {type(batch).__name__}",
        owner="DeltaSink",
        option="batch",
        value=batch,
    )


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
