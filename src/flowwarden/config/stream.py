"""``@change_stream`` options: what a stream watches and how its cursor runs."""

from __future__ import annotations

import random
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from flowwarden.config.backoff import backoff_delay
from flowwarden.config.base import Options, option
from flowwarden.config.choices import Deployment, OnInvalidate, Snapshot, coerce_choice
from flowwarden.config.names import check_collection_name, check_database_name
from flowwarden.config.problems import OptionProblem
from flowwarden.mongo.buckets import MAX_PARTITIONS
from flowwarden.mongo.initial_copy import own_collections_stage
from flowwarden.mongo.namespaces import NamespaceSelection, is_pattern, pattern_problem
from flowwarden.mongo.sensitive_fields import exclusion_stages, path_problem

# Operation types a change stream reports without showExpandedEvents.
StandardOperationType = Literal[
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "rename",
    "dropDatabase",
    "invalidate",
]
# DDL operation types the server reports only with showExpandedEvents=true (MongoDB 6.0+).
ExpandedOperationType = Literal[
    "create",
    "createIndexes",
    "dropIndexes",
    "modify",
    "shardCollection",
    "reshardCollection",
    "refineCollectionShardKey",
]
OperationType = Literal[StandardOperationType, ExpandedOperationType]
"""An operation type ``@change_stream(operation_types=...)`` can filter on: ``insert``,
``update``, ``replace``, ``delete``, ``drop``, ``rename``, ``dropDatabase``, ``invalidate``, and
with ``show_expanded_events=True`` the DDL types ``create``, ``createIndexes``, ``dropIndexes``,
``modify``, ``shardCollection``, ``reshardCollection``, ``refineCollectionShardKey``."""

STANDARD_OPERATION_TYPES: tuple[str, ...] = typing.get_args(StandardOperationType)
EXPANDED_OPERATION_TYPES: tuple[str, ...] = typing.get_args(ExpandedOperationType)
OPERATION_TYPES: tuple[str, ...] = STANDARD_OPERATION_TYPES + EXPANDED_OPERATION_TYPES


class ChangeStreamOptions(Options):
    """Options of ``@change_stream``: what to watch and how to run the cursor.

    ``collection`` and ``database``: a collection stream; only ``database``: a database stream;
    neither: a cluster stream. ``name`` keys the checkpoint and the lease; when it is None the
    handler class name is used (resolved by :func:`flowwarden.decorators.stream_spec`).
    """

    decorator: ClassVar[str] = "change_stream"

    collection: str | None = option(
        None,
        "The collection to watch (with database); None watches a whole database or the cluster.",
        allowed="None or a collection name (with database=)",
    )
    database: str | None = option(
        None,
        "The database to watch; None (and no collection) watches the whole cluster.",
        allowed="None or a database name",
    )
    name: str | None = option(
        None,
        "The stream's name, which keys its checkpoint and lease; None uses the class name.",
        allowed="None (the class name) or a non-empty string without surrounding spaces",
    )
    full_document: Literal["default", "updateLookup", "whenAvailable", "required"] = option(
        "default", "Whether update events carry the document as it is now (updateLookup) or not."
    )
    full_document_before_change: Literal["off", "whenAvailable", "required"] = option(
        "off", "Whether events carry the document as it was before the change (pre-images)."
    )
    operation_types: tuple[str, ...] | None = option(
        None,
        "Only these operation types are delivered, filtered by the server; invalidate always passes.",
        allowed="None or a non-empty list of: " + ", ".join(OPERATION_TYPES),
    )
    batch_size: int | None = option(None, "Events per server batch; None leaves it to the server.", ge=1)
    max_await_time_ms: int = option(
        1000, "How long the server waits for new events before it answers an empty batch.", gt=0
    )
    max_concurrency: int = option(
        1, "Handler calls running at once; events of one document key always run in order.", ge=1
    )
    deployment: Deployment = option(
        Deployment.ALL_INSTANCES,
        "single_leader: one instance at a time handles the stream, through a lease.",
    )
    on_invalidate: OnInvalidate = option(
        OnInvalidate.STOP, "What the stream does after its collection or database was dropped or renamed."
    )
    lease_ttl_seconds: float = option(
        30.0, "How long a single_leader lease lasts without renewal.", gt=0, allow_inf_nan=False
    )
    restart_initial_delay_seconds: float = option(
        1.0,
        "The first wait before a re-open after an error; it doubles each time.",
        gt=0,
        allow_inf_nan=False,
    )
    restart_max_delay_seconds: float = option(
        60.0,
        "The longest wait between re-opens.",
        allowed="a finite number >= restart_initial_delay_seconds",
        gt=0,
        allow_inf_nan=False,
    )
    max_restarts: int | None = option(
        10,
        "Re-opens in a row after errors not known to be transient before the stream fails.",
        allowed="None (never give up) or an int >= 0",
        ge=0,
    )
    show_expanded_events: bool = option(
        False, "Also deliver DDL events (create, createIndexes, modify...), MongoDB 6.0+."
    )
    partitions: int = option(
        1,
        "More than 1 reads the stream as that many streams, each the hash bucket of "
        "documentKey._id the server filters, run side by side with checkpoints of their own "
        "(MongoDB 7.0+).",
        ge=1,
        le=MAX_PARTITIONS,
    )
    snapshot: Snapshot = option(
        Snapshot.NEVER,
        "Copy the documents that already exist before (or instead of) streaming their changes; "
        "rows reach the methods as operation_type 'snapshot'.",
    )
    snapshot_chunk_size: int = option(
        1000,
        "Documents the initial snapshot reads at a time (at most max_events for @on_batch and "
        "@on_dataframe: a chunk is one batch); each chunk is stored before it is handed over "
        "and again once it was handled.",
        ge=1,
    )
    split_large_events: bool = option(
        False,
        "Add $changeStreamSplitLargeEvent and join the fragments of events over 16 MB into one "
        "event before any method sees it (MongoDB 7.0+).",
    )
    collections: tuple[str, ...] | None = option(
        None,
        "Database and cluster streams: only these collections, by name or 're:' pattern matching "
        "the whole name (cluster streams name them db.coll), filtered by the server and by the "
        "snapshot; None: all.",
        allowed="None or a non-empty list of collection names (db.coll for cluster streams) and "
        "'re:<regular expression>' patterns",
    )
    exclude_collections: tuple[str, ...] = option(
        (),
        "Database and cluster streams: leave out these collections, names or 're:' patterns "
        "as for collections.",
        allowed="a list of collection names (db.coll for cluster streams) and 're:<regular "
        "expression>' patterns",
    )
    exclude_fields: tuple[str, ...] = option(
        (),
        "Dotted paths under the document the server removes from every event and snapshot row "
        "(full documents, pre-images, update descriptions).",
        allowed="a list of dotted field paths, not _id",
    )
    hash_fields: tuple[str, ...] = option(
        (),
        "Dotted paths under the document whose values reach the methods as the hex SHA-256 of "
        "the salt followed by the value (needs hash_salt_env).",
        allowed="a list of dotted field paths, not _id, none of them excluded",
    )
    hash_salt_env: str | None = option(
        None,
        "The environment variable holding the salt of hash_fields; it must be set when the "
        "stream starts.",
        allowed="None or an environment variable name",
    )

    @field_validator("collection")
    @classmethod
    def _collection_name(cls, value: str | None) -> str | None:
        return check_collection_name(value, "collection")

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str | None) -> str | None:
        return check_database_name(value, "database")

    @field_validator("name")
    @classmethod
    def _stream_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or value != value.strip()):
            raise OptionProblem(
                "the stream name keys its checkpoint and must be a non-empty string without "
                "surrounding spaces",
                option="name",
                value=value,
                allowed=cls.allowed["name"],
            )
        return value

    @field_validator("deployment", mode="before")
    @classmethod
    def _deployment(cls, value: Any, info: ValidationInfo) -> Any:
        return coerce_choice(Deployment, value, info.field_name or "")

    @field_validator("snapshot", mode="before")
    @classmethod
    def _snapshot(cls, value: Any, info: ValidationInfo) -> Any:
        return coerce_choice(Snapshot, value, info.field_name or "")

    @field_validator("on_invalidate", mode="before")
    @classmethod
    def _on_invalidate(cls, value: Any, info: ValidationInfo) -> Any:
        return coerce_choice(OnInvalidate, value, info.field_name or "")

    @field_validator("operation_types", mode="before")
    @classmethod
    def _operation_types(cls, value: Any) -> Any:
        if value is None:
            return None
        allowed = cls.allowed["operation_types"]
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise OptionProblem(
                "operation_types must be a list of operation type names, not a single value",
                option="operation_types",
                value=value,
                allowed=allowed,
            )
        items = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        if not items:
            raise OptionProblem(
                "an empty operation_types would filter out every event; pass None to receive all",
                option="operation_types",
                value=value,
                allowed=allowed,
            )
        unknown = [item for item in items if item not in OPERATION_TYPES]
        if unknown:
            raise OptionProblem(
                f"unknown operation type(s) {unknown!r} (names are case-sensitive)",
                option="operation_types",
                value=value,
                allowed=allowed,
            )
        return tuple(dict.fromkeys(items))

    @field_validator("collections", "exclude_collections", "exclude_fields", "hash_fields", mode="before")
    @classmethod
    def _names(cls, value: Any, info: ValidationInfo) -> Any:
        option_name = info.field_name or ""
        if value is None and option_name == "collections":
            return None
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise OptionProblem(
                f"{option_name} must be a list of names, not a single value",
                option=option_name,
                value=value,
                allowed=cls.allowed[option_name],
            )
        items = list(value)
        for item in items:
            if not isinstance(item, str):
                raise OptionProblem(
                    f"{option_name} holds {item!r}, which is not a string",
                    option=option_name,
                    value=value,
                    allowed=cls.allowed[option_name],
                )
            problem = pattern_problem(item) if option_name.endswith("collections") else path_problem(item)
            if problem is not None:
                allowed = cls.allowed[option_name]
                raise OptionProblem(problem, option=option_name, value=value, allowed=allowed)
        if option_name == "collections" and not items:
            raise OptionProblem(
                "an empty collections would select no collection; pass None to watch them all",
                option=option_name,
                value=value,
                allowed=cls.allowed[option_name],
            )
        return tuple(dict.fromkeys(items))

    @field_validator("hash_salt_env")
    @classmethod
    def _salt_variable(cls, value: str | None) -> str | None:
        if value is not None and (not value or "=" in value or "\x00" in value or value != value.strip()):
            raise OptionProblem(
                f"{value!r} cannot name an environment variable",
                option="hash_salt_env",
                value=value,
                allowed=cls.allowed["hash_salt_env"],
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChangeStreamOptions:
        if self.collection is not None and self.database is None:
            raise OptionProblem(
                f"collection={self.collection!r} needs database=: a collection stream watches "
                "<database>.<collection>",
                option="database",
                value=None,
                allowed="the database holding the collection, e.g. "
                f"@change_stream(collection={self.collection!r}, database='shop')",
            )
        expanded = [t for t in self.operation_types or () if t in EXPANDED_OPERATION_TYPES]
        if expanded and not self.show_expanded_events:
            raise OptionProblem(
                f"operation types {expanded!r} are only reported with show_expanded_events=True",
                option="operation_types",
                value=self.operation_types,
                allowed=", ".join(STANDARD_OPERATION_TYPES)
                + " (add show_expanded_events=True for "
                + ", ".join(EXPANDED_OPERATION_TYPES)
                + ")",
            )
        self._check_selection()
        self._check_sensitive_fields()
        if self.restart_max_delay_seconds < self.restart_initial_delay_seconds:
            raise OptionProblem(
                f"restart_max_delay_seconds={self.restart_max_delay_seconds} is below "
                f"restart_initial_delay_seconds={self.restart_initial_delay_seconds}",
                option="restart_max_delay_seconds",
                value=self.restart_max_delay_seconds,
                allowed=self.allowed["restart_max_delay_seconds"],
            )
        return self

    def _check_selection(self) -> None:
        """collections and exclude_collections choose among the collections of a database or
        cluster stream: a collection stream has one; a cluster stream names them db.coll."""
        for option_name in ("collections", "exclude_collections"):
            entries = getattr(self, option_name) or ()
            if entries and self.collection is not None:
                raise OptionProblem(
                    f"{option_name} chooses among the collections of a database or cluster stream; "
                    f"this stream watches the one collection {self.collection!r}",
                    option=option_name,
                    value=entries,
                    allowed="collection=... alone, or database=... with " + option_name,
                )
            for entry in entries:
                if is_pattern(entry):
                    continue
                if self.database is None:
                    database, dot, collection = entry.partition(".")
                    if not dot:
                        raise OptionProblem(
                            f"a cluster stream names collections with their database: {entry!r} "
                            f"has none (e.g. 'shop.{entry}')",
                            option=option_name,
                            value=entries,
                            allowed=self.allowed[option_name],
                        )
                    check_database_name(database, option_name)
                    check_collection_name(collection, option_name)
                else:
                    check_collection_name(entry, option_name)

    def _check_sensitive_fields(self) -> None:
        if self.hash_fields and self.hash_salt_env is None:
            raise OptionProblem(
                "hash_fields are hashed with a salt, read from an environment variable: name it "
                "with hash_salt_env",
                option="hash_salt_env",
                value=None,
                allowed="the name of an environment variable holding the salt, e.g. "
                "hash_salt_env='FLOWWARDEN_HASH_SALT'",
            )
        if self.hash_salt_env is not None and not self.hash_fields:
            raise OptionProblem(
                f"hash_salt_env={self.hash_salt_env!r} names the salt of hash_fields, and there are none",
                option="hash_salt_env",
                value=self.hash_salt_env,
                allowed="None, or hash_fields with it",
            )
        for hashed in self.hash_fields:
            for excluded in self.exclude_fields:
                if f"{hashed}.".startswith(f"{excluded}.") or f"{excluded}.".startswith(f"{hashed}."):
                    raise OptionProblem(
                        f"{hashed!r} is hashed and {excluded!r} excluded: a field is one or the other",
                        option="hash_fields",
                        value=self.hash_fields,
                        allowed=self.allowed["hash_fields"],
                    )

    @property
    def target(self) -> Literal["collection", "database", "cluster"]:
        """What the stream watches: one collection, one database, or the whole cluster."""
        if self.collection is not None:
            return "collection"
        if self.database is not None:
            return "database"
        return "cluster"

    @property
    def namespace(self) -> str:
        """``db.coll``, ``db`` or ``*`` (cluster), for logs and status."""
        if self.collection is not None:
            return f"{self.database}.{self.collection}"
        return self.database if self.database is not None else "*"

    def own_collections_stage(self) -> dict[str, Any] | None:
        """For a database or cluster stream, the stage leaving out flowwarden's own collections
        (:func:`~flowwarden.mongo.initial_copy.own_collections_stage`); None for a collection."""
        return None if self.collection is not None else own_collections_stage()

    @property
    def selection(self) -> NamespaceSelection:
        """The collections a database or cluster stream covers (every one of a collection stream)."""
        return NamespaceSelection(self.collections, self.exclude_collections, cluster=self.database is None)

    def selection_stage(self) -> dict[str, Any] | None:
        """The ``$match`` stage keeping the events of the ``collections`` not in
        ``exclude_collections`` (and events without a collection); None when all are kept."""
        return self.selection.stage()

    def exclusion_stages(self) -> list[dict[str, Any]]:
        """The stages removing ``exclude_fields`` from every event, run after the user's stages."""
        return exclusion_stages(self.exclude_fields)

    def operation_type_stage(self) -> dict[str, Any] | None:
        """The ``$match`` stage that keeps only ``operation_types``, or None when all are wanted.

        ``invalidate`` always passes: the stream must see its own invalidation to stop or to
        restart after it with ``startAfter``.
        """
        if self.operation_types is None:
            return None
        kept = list(self.operation_types)
        if "invalidate" not in kept:
            kept.append("invalidate")
        return {"$match": {"operationType": {"$in": kept}}}

    def watch_options(self) -> dict[str, Any]:
        """Keyword arguments for PyMongo's ``watch()`` (pipeline and resume options excluded).

        Options at the server's default are left out so the command stays minimal.
        """
        options: dict[str, Any] = {"max_await_time_ms": self.max_await_time_ms}
        if self.full_document != "default":
            options["full_document"] = self.full_document
        if self.full_document_before_change != "off":
            options["full_document_before_change"] = self.full_document_before_change
        if self.batch_size is not None:
            options["batch_size"] = self.batch_size
        if self.show_expanded_events:
            options["show_expanded_events"] = True
        if self.name is not None:
            options["comment"] = f"flowwarden:{self.name}"
        return options

    def restart_delay_for(self, restart: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds before the ``restart``-th re-open (1-based): doubling from the initial delay to
        the maximum, with ±20 % jitter so instances that failed together do not retry together."""
        return backoff_delay(
            restart,
            initial=self.restart_initial_delay_seconds,
            multiplier=2.0,
            maximum=self.restart_max_delay_seconds,
            jitter=0.2,
            rng=rng,
        )

