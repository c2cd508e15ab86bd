"""The options of the ``flowwarden`` streaming source, as every process of a query holds them.

:class:`SourceOptions` is what the source reads once, on the driver, from Spark's option strings
(:mod:`flowwarden.spark.source.parsing` checks them with the decorators' option models), and what
Spark's planner and executor processes unpickle with the reader: this module and what it imports
load without pydantic, which those processes never need.

A query keeps its offsets itself, so ``RESUME`` (the default) and ``LATEST`` both start a new
query at the stream's current position.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from bson import Timestamp

from flowwarden.config.choices import OnHistoryLost, SchemaMode, Snapshot, StartPosition
from flowwarden.mongo.initial_copy import own_collections_stage
from flowwarden.mongo.large_events import with_split_stage
from flowwarden.mongo.namespaces import NamespaceSelection
from flowwarden.mongo.sensitive_fields import FieldHasher, exclusion_stages, snapshot_projection
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.convert.valuespec import ValueSpec

log = logging.getLogger(__name__)

OWNER = "flowwarden streaming source"
DEFAULT_MAX_EVENTS_PER_TRIGGER = 10_000


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """The source's options, validated once when the source is created."""

    uri: str
    database: str | None = None
    collection: str | None = None
    pipeline: tuple[dict[str, Any], ...] = ()
    full_document: str = "default"
    full_document_before_change: str = "off"
    start_position: StartPosition = StartPosition.RESUME
    start_at: Timestamp | None = None
    max_events_per_trigger: int | None = DEFAULT_MAX_EVENTS_PER_TRIGGER
    on_history_lost: OnHistoryLost = OnHistoryLost.FAIL
    schema_ddl: str | None = None
    mode: SchemaMode = SchemaMode.PERMISSIVE
    json_mode: JsonMode = JsonMode.CANONICAL
    max_await_time_ms: int = 1000
    partitions: int = 1
    split_large_events: bool = False
    snapshot: Snapshot = Snapshot.NEVER
    infer_schema: bool = False
    """schema=infer: the document schema is sampled when the source is created."""
    sample_size: int = 1000
    schema_hints: str | None = None
    document_spec: ValueSpec | None = None
    """The inferred document schema (set by :meth:`with_inferred_schema`), which also keeps
    where values are Extended JSON, which a DDL string cannot say."""
    collections: tuple[str, ...] | None = None
    exclude_collections: tuple[str, ...] = ()
    exclude_fields: tuple[str, ...] = ()
    hash_fields: tuple[str, ...] = ()
    hasher: FieldHasher | None = dataclasses.field(default=None, repr=False, compare=False)
    """Hashes ``hash_fields`` with the salt read from ``hash_salt_env`` when the source was
    created (on the driver); it travels to the executors with the reader."""
    name: str | None = None
    """The stream name snapshot requests address; None: the query takes none."""
    signals_database: str = "flowwarden"
    """The database of the ``_fw_signals`` collection the query reads its requests from."""

    def with_inferred_schema(self) -> SourceOptions:
        """These options with the document schema sampled from the collection (schema=infer),
        or as they are. Runs once, when the query's source is created."""
        if not self.infer_schema or self.document_spec is not None:
            return self
        from flowwarden.spark.infer import document_ddl, infer_document_spec

        assert self.database is not None and self.collection is not None
        spec = infer_document_spec(
            self.uri, self.database, self.collection, sample_size=self.sample_size, hints=self.schema_hints
        )
        ddl = document_ddl(spec)
        log.info(
            "%s %s: full_document schema inferred from a sample of up to %d documents: %s",
            OWNER,
            self.namespace,
            self.sample_size,
            ddl,
        )
        return dataclasses.replace(self, schema_ddl=ddl, document_spec=spec)

    @property
    def selection(self) -> NamespaceSelection:
        """The collections a database or cluster query covers (every one for a collection)."""
        return NamespaceSelection(self.collections, self.exclude_collections, cluster=self.database is None)

    @property
    def stream_pipeline(self) -> tuple[dict[str, Any], ...]:
        """The stages the source's change streams run after ``$changeStream``: for a database or
        cluster, the one leaving out flowwarden's own collections and the one keeping the
        selected collections; ``pipeline``; the stages removing ``exclude_fields``; then
        ``$changeStreamSplitLargeEvent`` with ``split_large_events``."""
        return self._stages(exclusion_stages(self.exclude_fields))

    @property
    def counting_pipeline(self) -> tuple[dict[str, Any], ...]:
        """:attr:`stream_pipeline` for a stream that only finds where a micro-batch ends and does
        not split large events: without the stages removing fields, which never leave an event
        out (and would have it look up documents it does not bring back)."""
        return self._stages([])

    def _stages(self, exclusion: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
        stages = [] if self.collection is not None else [own_collections_stage()]
        selection = self.selection.stage()
        if selection is not None:
            stages.append(selection)
        stages.extend(self.pipeline)
        stages.extend(exclusion)
        return tuple(with_split_stage(stages)) if self.split_large_events else tuple(stages)

    @property
    def snapshot_projection(self) -> dict[str, int] | None:
        """The find projection of the copy: ``exclude_fields`` left out."""
        return snapshot_projection(self.exclude_fields)

    @property
    def namespace(self) -> str:
        if self.collection is not None:
            return f"{self.database}.{self.collection}"
        return self.database if self.database is not None else "*"

    def schema_ddl_of_events(self) -> str:
        """The DDL of the source's rows (Spark parses it; the source never needs a JVM)."""
        from flowwarden.spark.schema import change_event_ddl

        return change_event_ddl(
            self.schema_ddl,
            corrupt_record=bool(self.schema_ddl) and self.mode is SchemaMode.PERMISSIVE,
            rescued_data=self.infer_schema,
        )


__all__ = ["DEFAULT_MAX_EVENTS_PER_TRIGGER", "OWNER", "SourceOptions"]
