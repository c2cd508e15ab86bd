"""The streaming source's options, read from Spark's strings.

An option the decorators also have (``database``, ``full_document``, ``split_large_events``,
``collections``, ``exclude_fields``, ``hash_fields``, ``start_position``, ``mode``...) has the same
name, values and default here (a list is a JSON array or names separated by commas), and is
checked by the same model: each string is turned into the field's type and validated by the option model
that declares it (:data:`SHARED`). The source's own options (``uri``, ``pipeline``,
``max_events_per_trigger``, ``schema``, ``json_mode``, ``partitions``) are declared in
:class:`SourceOnlyOptions`. ``schema=infer`` samples the collection once, when Spark asks the
source for its schema (:meth:`SourceOptions.with_inferred_schema`). Every problem is a
ConfigurationError naming the option and what it accepts.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from bson import json_util
from pydantic import TypeAdapter, ValidationError, field_validator

from flowwarden.config import (
    ChangeStreamOptions,
    CheckpointOptions,
    DataFrameOptions,
    Options,
    PipelineOptions,
    Snapshot,
    StartPosition,
    validate_options,
)
from flowwarden.config.base import OptionsT, option
from flowwarden.config.delivery import INFER
from flowwarden.config.problems import OptionProblem
from flowwarden.errors import ConfigurationError
from flowwarden.mongo.buckets import MAX_PARTITIONS
from flowwarden.mongo.sensitive_fields import salted_hasher
from flowwarden.mongo.signals import DEFAULT_CHECKPOINT_DATABASE
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.source.options import DEFAULT_MAX_EVENTS_PER_TRIGGER, OWNER, SourceOptions

LABEL = ""  # the owner names the source and the option

SHARED: dict[str, type[Options]] = {
    "database": ChangeStreamOptions,
    "collection": ChangeStreamOptions,
    "full_document": ChangeStreamOptions,
    "full_document_before_change": ChangeStreamOptions,
    "max_await_time_ms": ChangeStreamOptions,
    "split_large_events": ChangeStreamOptions,
    "snapshot": ChangeStreamOptions,
    "collections": ChangeStreamOptions,
    "exclude_collections": ChangeStreamOptions,
    "exclude_fields": ChangeStreamOptions,
    "hash_fields": ChangeStreamOptions,
    "hash_salt_env": ChangeStreamOptions,
    "start_position": CheckpointOptions,
    "start_at": CheckpointOptions,
    "on_history_lost": CheckpointOptions,
    "mode": DataFrameOptions,
    "sample_size": DataFrameOptions,
    "schema_hints": DataFrameOptions,
}
"""Options shared with a decorator, and the model that declares them."""


class SourceOnlyOptions(Options):
    """Options only the streaming source has."""

    decorator: ClassVar[str] = ""

    uri: str = option("", "The MongoDB connection string (required).", allowed="a MongoDB connection string")
    pipeline: str = option(
        "[]",
        "Stages after $changeStream, as a JSON array; they must keep _id.",
        allowed='a JSON array of stages, e.g. [{"$match": {"operationType": "insert"}}]',
    )
    max_events_per_trigger: int | None = option(
        DEFAULT_MAX_EVENTS_PER_TRIGGER,
        "Events per micro-batch at most; none: no limit.",
        allowed="an int >= 1, or none",
        ge=1,
    )
    schema_: str | None = option(
        None,
        "A DDL field list typing full_document (no NOT NULL); 'infer': inferred from a sample of "
        "the collection when the query starts, with _rescued_data; without it, Extended JSON strings.",
        allowed="a DDL field list such as 'sku STRING, qty INT', or infer",
        alias="schema",
    )
    json_mode: JsonMode = option(JsonMode.CANONICAL, "How documents are written as Extended JSON.")
    partitions: int = option(
        1,
        "Input partitions: more than 1 splits the change stream into that many streams, each "
        "filtered by the server to one hash bucket of documentKey._id, read in parallel by "
        "executors (MongoDB 7.0+).",
        ge=1,
        le=MAX_PARTITIONS,
    )
    name: str | None = option(
        None,
        "The stream name snapshot requests address (flowwarden snapshot request NAME): with it, "
        "the query takes incremental snapshots requested while it runs; without it, none.",
        allowed="a non-empty name without surrounding spaces",
    )
    signals_database: str | None = option(
        None,
        "Where the query looks for snapshot requests (_fw_signals): default, the database option, "
        "or 'flowwarden' for a query over the whole deployment.",
        allowed="a database name",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not value or value != value.strip()):
            raise OptionProblem(
                "the stream name snapshot requests address must be non-empty, without surrounding spaces",
                option="name",
                value=value,
                allowed=cls.allowed["name"],
            )
        return value

    @field_validator("json_mode", mode="before")
    @classmethod
    def _json_mode(cls, value: Any) -> Any:
        if isinstance(value, str) and not isinstance(value, JsonMode):
            for mode in JsonMode:
                if value.strip().lower() == mode.value:
                    return mode
            raise OptionProblem(
                f"json_mode {value!r} is not known",
                option="json_mode",
                value=value,
                allowed=", ".join(mode.value for mode in JsonMode),
            )
        return value


KNOWN = frozenset({*SHARED, *SourceOnlyOptions.option_names(), "path"})  # Spark passes load(path)


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Spark's option strings as :class:`SourceOptions`, each checked by the model declaring it;
    a problem is a ConfigurationError naming the option and what it accepts."""
    lowered = {key.lower(): value for key, value in options.items()}
    unknown = sorted(set(lowered) - KNOWN)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)}", owner=OWNER, allowed=", ".join(sorted(KNOWN))
        )
    own = _source_only(lowered)
    if not own.uri:
        raise ConfigurationError(
            "the option uri is required", owner=OWNER, option="uri", allowed=own.allowed["uri"]
        )
    shared = {name: _typed(name, SHARED[name], lowered[name]) for name in SHARED if name in lowered}
    stream = _validated(ChangeStreamOptions, shared)
    start = _validated(CheckpointOptions, shared)
    infer = (own.schema_ or "").strip().lower() == INFER
    frame = _validated(DataFrameOptions, shared, {"schema": INFER} if infer else {})
    _check_snapshot(stream.snapshot, start.start_position, own.partitions)
    if own.name is not None and own.partitions > 1:
        raise ConfigurationError(
            "a query taking snapshot requests (name) reads its copy and its changes as one partition",
            owner=OWNER,
            option="partitions",
            value=own.partitions,
            allowed="1 with name",
        )
    if infer and stream.collection is None:
        raise ConfigurationError(
            "schema=infer samples the watched collection; give the collection option",
            owner=OWNER,
            option="schema",
            value=own.schema_,
            allowed="schema=infer with database and collection",
        )
    return SourceOptions(
        uri=own.uri,
        database=stream.database,
        collection=stream.collection,
        pipeline=_pipeline(own.pipeline),
        full_document=stream.full_document,
        full_document_before_change=stream.full_document_before_change,
        start_position=start.start_position,
        start_at=start.start_at_operation_time,
        max_events_per_trigger=own.max_events_per_trigger,
        on_history_lost=start.on_history_lost,
        schema_ddl=None if infer else own.schema_,
        mode=frame.mode,
        json_mode=own.json_mode,
        max_await_time_ms=stream.max_await_time_ms,
        partitions=own.partitions,
        split_large_events=stream.split_large_events,
        snapshot=stream.snapshot,
        infer_schema=infer,
        sample_size=frame.sample_size,
        schema_hints=frame.schema_hints,
        collections=stream.collections,
        exclude_collections=stream.exclude_collections,
        exclude_fields=stream.exclude_fields,
        hash_fields=stream.hash_fields,
        hasher=salted_hasher(stream.hash_fields, stream.hash_salt_env, owner=OWNER),
        name=own.name,
        signals_database=own.signals_database or stream.database or _cluster_signals_database(),
    )


def _cluster_signals_database() -> str:
    """Where a query over the whole deployment looks for requests: where a connector's cluster
    streams keep their checkpoints (and signals) by default."""
    return DEFAULT_CHECKPOINT_DATABASE


def _check_snapshot(snapshot: Snapshot, start: StartPosition, partitions: int) -> None:
    """The snapshots a query can take: copied once, when the query is new, then its changes."""
    if snapshot is Snapshot.WHEN_NEEDED:
        raise ConfigurationError(
            "snapshot=when_needed copies again after lost history, which a query's offsets cannot "
            "express; a new query (a new checkpointLocation) with snapshot=initial does that",
            owner=OWNER,
            option="snapshot",
            value=snapshot.value,
            allowed="never, initial, initial_only",
        )
    if snapshot is not Snapshot.NEVER and start not in (StartPosition.RESUME, StartPosition.LATEST):
        raise ConfigurationError(
            f"snapshot={snapshot.value.lower()} streams the changes after the position it takes before "
            f"the copy, so start_position={start.value} cannot apply",
            owner=OWNER,
            option="start_position",
            value=start.value,
            allowed="RESUME or LATEST with a snapshot",
        )
    if snapshot is not Snapshot.NEVER and partitions > 1:
        raise ConfigurationError(
            "a query with a snapshot reads its copy and its changes as one partition",
            owner=OWNER,
            option="partitions",
            value=partitions,
            allowed="1 with snapshot",
        )


def _validated(
    model: type[OptionsT], shared: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> OptionsT:
    """The shared options ``model`` declares (and ``extra`` values of its own), checked by
    ``model`` itself."""
    mine = {name: value for name, value in shared.items() if SHARED[name] is model}
    return validate_options(model, OWNER, {**mine, **(extra or {})}, label=LABEL)


def _source_only(options: Mapping[str, str]) -> SourceOnlyOptions:
    values: dict[str, Any] = {}
    for name in SourceOnlyOptions.option_names():
        if name not in options:
            continue
        text = options[name]
        if name == "max_events_per_trigger":
            values[name] = (
                None
                if text.strip().lower() in ("none", "unlimited", "all")
                else _typed(name, SourceOnlyOptions, text)
            )
        elif name in ("schema", "name", "signals_database"):
            values[name] = text or None
        else:
            values[name] = _typed(name, SourceOnlyOptions, text)
    return validate_options(SourceOnlyOptions, OWNER, values, label=LABEL)


def _typed(name: str, model: type[Options], text: str) -> Any:
    """``text`` as a value of the option's type (a number, a flag, a date-time...), or as it is
    when the option's own validator reads strings (names, choices)."""
    field = model.option_field(name)
    if name == "start_at":
        return _start_at(text)
    annotation: Any = field.annotation
    if annotation in (int, float, bool, int | None, float | None):
        try:
            return TypeAdapter(annotation).validate_python(text.strip())
        except ValidationError:
            raise ConfigurationError(
                f"{name} {text!r} is not {model.allowed[name]}",
                owner=OWNER,
                option=name,
                value=text,
                allowed=model.allowed[name],
            ) from None
    if name in ("database", "collection", "hash_salt_env"):
        return text or None  # an empty option is no option
    if name in LIST_OPTIONS:
        return _names(name, text)
    return text


LIST_OPTIONS = frozenset({"collections", "exclude_collections", "exclude_fields", "hash_fields"})


def _names(name: str, text: str) -> tuple[str, ...] | None:
    """A list option: a JSON array of strings, or names separated by commas (a pattern holding a
    comma needs the JSON form); empty: none."""
    if text.strip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(
                f"{name} is not a JSON array: {exc}",
                owner=OWNER,
                option=name,
                value=text,
                allowed='a JSON array of strings such as ["orders", "re:inv_.*"], or names separated '
                "by commas",
            ) from exc
        return tuple(items) if isinstance(items, list) else items
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        return None if name == "collections" else ()
    return tuple(items)


def _start_at(text: str) -> Any:
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ConfigurationError(
            f"start_at {text!r} is not an ISO-8601 date-time",
            owner=OWNER,
            option="start_at",
            value=text,
            allowed="an ISO-8601 date-time, e.g. 2024-05-01T12:00:00Z",
        ) from None
    # A string names no time zone unless it says so: the source reads it as UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)


def _pipeline(text: str) -> tuple[dict[str, Any], ...]:
    try:
        stages = json_util.loads(text)
    except ValueError as exc:
        raise ConfigurationError(
            f"the pipeline is not JSON: {exc}",
            owner=OWNER,
            option="pipeline",
            allowed=SourceOnlyOptions.allowed["pipeline"],
        ) from exc
    return validate_options(PipelineOptions, OWNER, {"stages": stages}, label=LABEL).stages


__all__ = ["KNOWN", "LIST_OPTIONS", "SHARED", "SourceOnlyOptions", "parse_source_options"]
