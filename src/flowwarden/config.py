"""Validated options of every flowwarden decorator.

This module owns the option models (frozen pydantic v2 models), their enums, the change-stream
pipeline rules and the retry backoff arithmetic. Every model is validated once, when a decorator
is applied; nothing here runs per event. A bad value never escapes as a pydantic error:
:func:`validate_options` turns it into a :class:`~flowwarden.errors.ConfigurationError` naming the
class, the option, the value and what is allowed.
"""

from __future__ import annotations

import copy
import math
import random
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from enum import Enum
from typing import Any, ClassVar, Literal, TypeVar

from bson import Timestamp
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from flowwarden.errors import ConfigurationError


class _Choice(str, Enum):
    """A str-valued enum that also accepts its member names and values in any letter case."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def _missing_(cls, value: object) -> _Choice | None:
        if isinstance(value, str):
            folded = value.casefold()
            for member in cls:
                if folded in (member.value.casefold(), member.name.casefold()):
                    return member
        return None


class StartPosition(_Choice):
    """Where a stream starts when it has no checkpoint (LATEST: even when it has one)."""

    RESUME = "RESUME"
    """The checkpoint if there is one, else now."""
    LATEST = "LATEST"
    """Now, ignoring any checkpoint."""
    EARLIEST = "EARLIEST"
    """The oldest entry still in the oplog."""
    AT_TIME = "AT_TIME"
    """The cluster time given as ``start_at``."""


class OnHistoryLost(_Choice):
    """What a stream does when its resume position has fallen out of the oplog."""

    FAIL = "FAIL"
    RESUME_FROM_OPLOG_START = "RESUME_FROM_OPLOG_START"
    RESUME_FROM_NOW = "RESUME_FROM_NOW"


class OnError(_Choice):
    """What happens to an event once its handler exhausted the retry policy."""

    STOP = "STOP"
    SKIP = "SKIP"
    DEAD_LETTER = "DEAD_LETTER"


class SchemaMode(_Choice):
    """How ``on_dataframe`` treats a full document that does not fit the declared schema."""

    PERMISSIVE = "PERMISSIVE"
    DROPMALFORMED = "DROPMALFORMED"
    FAILFAST = "FAILFAST"


class Deployment(_Choice):
    """How many connector instances process one stream at a time."""

    ALL_INSTANCES = "all_instances"
    SINGLE_LEADER = "single_leader"


class OnInvalidate(_Choice):
    """What a stream does after its collection or database was dropped or renamed."""

    STOP = "stop"
    RESTART = "restart"


# Operation types a change stream reports without showExpandedEvents.
STANDARD_OPERATION_TYPES: tuple[str, ...] = (
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "rename",
    "dropDatabase",
    "invalidate",
)
# DDL operation types the server reports only with showExpandedEvents=true (MongoDB 6.0+).
EXPANDED_OPERATION_TYPES: tuple[str, ...] = (
    "create",
    "createIndexes",
    "dropIndexes",
    "modify",
    "shardCollection",
    "reshardCollection",
    "refineCollectionShardKey",
)
OPERATION_TYPES: tuple[str, ...] = STANDARD_OPERATION_TYPES + EXPANDED_OPERATION_TYPES

# Stages MongoDB accepts after $changeStream; anything else fails when the stream opens.
ALLOWED_PIPELINE_STAGES: tuple[str, ...] = (
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
    "$changeStreamSplitLargeEvent",
)

# The server refuses change streams on its internal databases.
_INTERNAL_DATABASES = frozenset({"admin", "local", "config"})
_DATABASE_FORBIDDEN_CHARS = '/\\. "$*<>:|?\x00'
_MAX_DATABASE_NAME_BYTES = 63
# MongoDB stores expireAfterSeconds as a 32-bit signed int.
_MAX_TTL_SECONDS = 2**31 - 1
_MAX_RETENTION_DAYS = _MAX_TTL_SECONDS // 86_400

STORE_METHODS: tuple[str, ...] = ("load", "save", "save_seen", "delete", "list", "rewind")
"""Methods a checkpoint store must have (sync or async), checked by duck typing."""

KEEP_ID_HINT = 'keep the resume token: leave _id alone, or keep it as `"_id": "$_id"` in a new root'


class OptionProblem(ValueError):
    """A rejected option value, raised inside validators and turned into a ConfigurationError.

    Carries the option, the value and the allowed values so the error names them precisely even
    when the check spans several fields.
    """

    def __init__(self, message: str, *, option: str, value: Any, allowed: str) -> None:
        super().__init__(message)
        self.message = message
        self.option = option
        self.value = value
        self.allowed = allowed


class _Options(BaseModel):
    """Base of every option model: frozen, strict (no silent coercion), unknown options rejected."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True)

    decorator: ClassVar[str] = ""
    allowed: ClassVar[Mapping[str, str]] = {}


def _choices(enum: type[_Choice]) -> str:
    return ", ".join(repr(member.value) for member in enum)


def _coerce_choice(enum: type[_Choice], value: Any, option: str) -> _Choice:
    # Strict mode would refuse the string "single_leader" for Deployment; accept names and values.
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            pass
    raise OptionProblem(
        f"{value!r} is not a {enum.__name__}",
        option=option,
        value=value,
        allowed=_choices(enum) + f" (or {enum.__name__}.<NAME>)",
    )


def _check_database_name(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    allowed = (
        'a non-empty database name of at most 63 bytes without /\\. "$*<>:|? and not admin, local or config'
    )
    if not value:
        raise OptionProblem("the database name is empty", option=option, value=value, allowed=allowed)
    bad = sorted({char for char in value if char in _DATABASE_FORBIDDEN_CHARS})
    if bad:
        raise OptionProblem(
            f"the database name {value!r} contains {''.join(bad)!r}",
            option=option,
            value=value,
            allowed=allowed,
        )
    if len(value.encode()) > _MAX_DATABASE_NAME_BYTES:
        raise OptionProblem(
            f"the database name {value!r} is longer than 63 bytes",
            option=option,
            value=value,
            allowed=allowed,
        )
    if value in _INTERNAL_DATABASES:
        raise OptionProblem(
            f"MongoDB does not open change streams on its internal database {value!r}",
            option=option,
            value=value,
            allowed=allowed,
        )
    return value


def _check_collection_name(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    allowed = "a non-empty collection name without '$' or NUL that does not start with 'system.'"
    if not value:
        raise OptionProblem("the collection name is empty", option=option, value=value, allowed=allowed)
    if "$" in value or "\x00" in value:
        raise OptionProblem(
            f"the collection name {value!r} contains '$' or NUL", option=option, value=value, allowed=allowed
        )
    if value.startswith("system."):
        raise OptionProblem(
            f"{value!r} is a system collection; MongoDB does not open change streams on those",
            option=option,
            value=value,
            allowed=allowed,
        )
    return value


def backoff_delay(
    attempt: int,
    *,
    initial: float,
    multiplier: float,
    maximum: float,
    jitter: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after the ``attempt``-th failure (1-based) before trying again.

    ``initial * multiplier ** (attempt - 1)``, capped at ``maximum``, then spread by up to
    ``±jitter`` of itself with ``rng()`` (a float in [0, 1)). The result is never negative and
    never above ``maximum``, however large ``attempt`` grows.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    try:
        base = initial * multiplier ** (attempt - 1)
    except OverflowError:
        base = maximum
    delay = min(base, maximum)
    if jitter:
        delay *= 1.0 - jitter + 2.0 * jitter * rng()
    return min(max(delay, 0.0), maximum)


# ----------------------------------------------------------------------------------------------
# @change_stream


class ChangeStreamOptions(_Options):
    """Options of ``@change_stream``: what to watch and how to run the cursor.

    ``collection`` and ``database``: a collection stream; only ``database``: a database stream;
    neither: a cluster stream. ``name`` keys the checkpoint and the lease; when it is None the
    handler class name is used (resolved by :func:`flowwarden.decorators.stream_spec`).
    """

    decorator: ClassVar[str] = "change_stream"
    allowed: ClassVar[Mapping[str, str]] = {
        "collection": "None or a collection name (with database=)",
        "database": "None or a database name",
        "name": "None (the class name) or a non-empty string without surrounding spaces",
        "full_document": "'default', 'updateLookup', 'whenAvailable', 'required'",
        "full_document_before_change": "'off', 'whenAvailable', 'required'",
        "operation_types": "None or a non-empty list of: " + ", ".join(OPERATION_TYPES),
        "batch_size": "None or an int >= 1",
        "max_await_time_ms": "an int > 0",
        "max_concurrency": "an int >= 1",
        "deployment": _choices(Deployment),
        "on_invalidate": _choices(OnInvalidate),
        "lease_ttl_seconds": "a finite number > 0",
        "restart_initial_delay_seconds": "a finite number > 0",
        "restart_max_delay_seconds": "a finite number >= restart_initial_delay_seconds",
        "max_restarts": "None (unlimited) or an int >= 0 (re-opens in a row after unknown errors)",
        "show_expanded_events": "True or False",
    }

    collection: str | None = None
    database: str | None = None
    name: str | None = None
    full_document: Literal["default", "updateLookup", "whenAvailable", "required"] = "default"
    full_document_before_change: Literal["off", "whenAvailable", "required"] = "off"
    operation_types: tuple[str, ...] | None = None
    batch_size: int | None = Field(default=None, ge=1)
    max_await_time_ms: int = Field(default=1000, gt=0)
    max_concurrency: int = Field(default=1, ge=1)
    deployment: Deployment = Deployment.ALL_INSTANCES
    on_invalidate: OnInvalidate = OnInvalidate.STOP
    lease_ttl_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    restart_initial_delay_seconds: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    restart_max_delay_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    max_restarts: int | None = Field(default=10, ge=0)
    show_expanded_events: bool = False

    @field_validator("collection")
    @classmethod
    def _collection_name(cls, value: str | None) -> str | None:
        return _check_collection_name(value, "collection")

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str | None) -> str | None:
        return _check_database_name(value, "database")

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
        return _coerce_choice(Deployment, value, info.field_name or "")

    @field_validator("on_invalidate", mode="before")
    @classmethod
    def _on_invalidate(cls, value: Any, info: ValidationInfo) -> Any:
        return _coerce_choice(OnInvalidate, value, info.field_name or "")

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
        if self.restart_max_delay_seconds < self.restart_initial_delay_seconds:
            raise OptionProblem(
                f"restart_max_delay_seconds={self.restart_max_delay_seconds} is below "
                f"restart_initial_delay_seconds={self.restart_initial_delay_seconds}",
                option="restart_max_delay_seconds",
                value=self.restart_max_delay_seconds,
                allowed=self.allowed["restart_max_delay_seconds"],
            )
        return self

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


# ----------------------------------------------------------------------------------------------
# @checkpoint


class CheckpointOptions(_Options):
    """Options of ``@checkpoint``: when positions are saved and where a stream starts.

    The saved position is the token of the newest event handled with no gap before it; resuming
    from it delivers the next event. ``save_every_n`` events or ``save_interval_seconds``,
    whichever comes first, trigger a save; both 0 saves every event before its commit returns.
    """

    decorator: ClassVar[str] = "checkpoint"
    allowed: ClassVar[Mapping[str, str]] = {
        "save_every_n": "an int >= 0",
        "save_interval_seconds": "a finite number >= 0",
        "start_position": _choices(StartPosition),
        "start_at": "None, or with start_position=AT_TIME a timezone-aware datetime or a bson Timestamp",
        "on_history_lost": _choices(OnHistoryLost),
        "store": "None or a checkpoint store instance with methods " + ", ".join(STORE_METHODS),
    }

    save_every_n: int = Field(default=1, ge=0)
    save_interval_seconds: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    start_position: StartPosition = StartPosition.RESUME
    start_at: datetime | Timestamp | None = None
    on_history_lost: OnHistoryLost = OnHistoryLost.FAIL
    store: Any = None

    @field_validator("start_position", mode="before")
    @classmethod
    def _start_position(cls, value: Any, info: ValidationInfo) -> Any:
        return _coerce_choice(StartPosition, value, info.field_name or "")

    @field_validator("on_history_lost", mode="before")
    @classmethod
    def _on_history_lost(cls, value: Any, info: ValidationInfo) -> Any:
        return _coerce_choice(OnHistoryLost, value, info.field_name or "")

    @field_validator("start_at")
    @classmethod
    def _start_at(cls, value: datetime | Timestamp | None) -> datetime | Timestamp | None:
        if isinstance(value, datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise OptionProblem(
                    f"start_at={value.isoformat()} has no timezone, so the instant it names is "
                    "ambiguous; pass an aware datetime such as datetime(..., tzinfo=timezone.utc)",
                    option="start_at",
                    value=value,
                    allowed=cls.allowed["start_at"],
                )
            return value.astimezone(timezone.utc)
        return value

    @field_validator("store")
    @classmethod
    def _store(cls, value: Any) -> Any:
        if value is None:
            return None
        allowed = cls.allowed["store"]
        if isinstance(value, type):
            raise OptionProblem(
                f"store is the class {value.__name__}; pass an instance, e.g. store={value.__name__}(...)",
                option="store",
                value=value,
                allowed=allowed,
            )
        missing = [name for name in STORE_METHODS if not callable(getattr(value, name, None))]
        if missing:
            raise OptionProblem(
                f"{type(value).__name__} is not a checkpoint store: it lacks {', '.join(missing)}",
                option="store",
                value=value,
                allowed=allowed,
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CheckpointOptions:
        if self.start_position is StartPosition.AT_TIME and self.start_at is None:
            raise OptionProblem(
                "start_position=AT_TIME needs start_at= (the cluster time to start from)",
                option="start_at",
                value=None,
                allowed="a timezone-aware datetime or a bson Timestamp",
            )
        if self.start_position is not StartPosition.AT_TIME and self.start_at is not None:
            raise OptionProblem(
                f"start_at is only read with start_position=AT_TIME, not {self.start_position.name}; "
                "set start_position=StartPosition.AT_TIME or drop start_at",
                option="start_at",
                value=self.start_at,
                allowed="None with start_position=" + self.start_position.name,
            )
        return self

    @property
    def start_at_operation_time(self) -> Timestamp | None:
        """``start_at`` as a cluster time for ``start_at_operation_time``.

        A datetime is floored to its second (increment 0), so the stream starts at or before the
        instant given and never skips an event of that second.
        """
        if self.start_at is None or isinstance(self.start_at, Timestamp):
            return self.start_at
        return Timestamp(math.floor(self.start_at.timestamp()), 0)


# ----------------------------------------------------------------------------------------------
# @pipeline


FieldFate = Literal["keeps", "removes", "rewrites", "unknown"]

_ROOT_VARIABLES = ("$$ROOT", "$$CURRENT")


def _is_path(key: str, field: str) -> bool:
    return key == field or key.startswith(field + ".")


def _field_reference(value: Any, field: str) -> bool:
    return isinstance(value, str) and value in (
        f"${field}",
        f"$$ROOT.{field}",
        f"$$CURRENT.{field}",
    )


def _literal_fate(document: Mapping[str, Any], field: str) -> FieldFate:
    if field not in document:
        return "removes"
    return "keeps" if _field_reference(document[field], field) else "rewrites"


def new_root_fate(expression: Any, field: str) -> FieldFate:
    """What a ``$replaceRoot``/``$replaceWith`` expression does to a top-level ``field``.

    Proves "keeps" only for shapes it can read: ``$$ROOT``, a document literal holding
    ``field: "$field"``, or ``$mergeObjects`` whose last argument defining ``field`` does so and
    whose later arguments are literals without it. Anything else is "unknown".
    """
    if isinstance(expression, str):
        return "keeps" if expression in _ROOT_VARIABLES else "unknown"
    if not isinstance(expression, Mapping):
        return "unknown"
    operators = [key for key in expression if isinstance(key, str) and key.startswith("$")]
    if not operators:
        return _literal_fate(expression, field)
    if list(expression) != ["$mergeObjects"]:
        return "unknown"
    arguments = expression["$mergeObjects"]
    if not isinstance(arguments, list):
        arguments = [arguments]
    # $mergeObjects keeps the value from the last argument that defines the field.
    fate: FieldFate = "removes"
    for argument in arguments:
        if isinstance(argument, str) and argument in _ROOT_VARIABLES:
            fate = "keeps"
        elif isinstance(argument, Mapping) and not any(
            isinstance(key, str) and key.startswith("$") for key in argument
        ):
            argument_fate = _literal_fate(argument, field)
            if argument_fate != "removes":
                fate = argument_fate
        elif argument is None:
            continue
        else:
            fate = "unknown"
    return fate


def _is_exclusion(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not value


def _is_inclusion(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and bool(value)


def _stage_field_fate(name: str, spec: Any, field: str) -> FieldFate:
    """What one validated stage does to a top-level field of the change event."""
    if name == "$project":
        if field in spec:
            value = spec[field]
            if _is_exclusion(value):
                return "removes"
            return "keeps" if _is_inclusion(value) else "rewrites"
        if any(key.startswith(field + ".") for key in spec):
            return "rewrites"
        inclusion = any(not _is_exclusion(value) for key, value in spec.items() if key != "_id")
        # An inclusion projection keeps _id unless it says otherwise, and drops everything else.
        return "removes" if inclusion and field != "_id" else "keeps"
    if name == "$unset":
        paths = [spec] if isinstance(spec, str) else spec
        if field in paths:
            return "removes"
        return "rewrites" if any(_is_path(path, field) for path in paths) else "keeps"
    if name in ("$addFields", "$set"):
        return "rewrites" if any(_is_path(key, field) for key in spec) else "keeps"
    if name == "$replaceRoot":
        return new_root_fate(spec["newRoot"], field)
    if name == "$replaceWith":
        return new_root_fate(spec, field)
    if name == "$redact":
        return "unknown"
    return "keeps"


class PipelineOptions(_Options):
    """Stages of ``@pipeline``, run by the server after ``$changeStream``.

    Hard rule: the event ``_id`` is the resume token, so no stage may remove or rewrite it; a
    pipeline that could is refused here rather than failing at the first event. ``$redact`` is
    accepted as MongoDB allows it, but it can prune ``_id``; the server then fails the stream.
    The stages are deep-copied: changing the list after decoration changes nothing.
    """

    decorator: ClassVar[str] = "pipeline"
    allowed: ClassVar[Mapping[str, str]] = {
        "stages": "a list of one-key stage documents, each one of " + ", ".join(ALLOWED_PIPELINE_STAGES),
    }

    stages: tuple[dict[str, Any], ...] = ()

    @field_validator("stages", mode="before")
    @classmethod
    def _stages(cls, value: Any) -> Any:
        allowed = cls.allowed["stages"]
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            raise OptionProblem(
                "stages must be a list of stage documents, e.g. [{'$match': {...}}]",
                option="stages",
                value=value,
                allowed=allowed,
            )
        stages = tuple(copy.deepcopy(dict(stage)) if isinstance(stage, Mapping) else stage for stage in value)
        for index, stage in enumerate(stages):
            cls._check_stage(index, stage, last=index == len(stages) - 1)
        return stages

    @classmethod
    def _check_stage(cls, index: int, stage: Any, *, last: bool) -> None:
        allowed = ", ".join(ALLOWED_PIPELINE_STAGES)

        def problem(message: str, hint: str = allowed) -> OptionProblem:
            return OptionProblem(f"stage {index} {message}", option="stages", value=stage, allowed=hint)

        if not isinstance(stage, dict) or len(stage) != 1:
            raise problem("must be a document with exactly one key naming the stage, e.g. {'$match': {...}}")
        ((name, spec),) = stage.items()
        if not isinstance(name, str) or not name.startswith("$"):
            raise problem(f"key {name!r} is not a stage name (stage names start with '$')")
        if name == "$changeStream":
            raise problem("is $changeStream, which flowwarden adds itself; list only the stages after it")
        if name not in ALLOWED_PIPELINE_STAGES:
            raise problem(f"{name} is not allowed in a change stream pipeline")
        if name == "$match" and not isinstance(spec, Mapping):
            raise problem("$match takes a query document")
        if name == "$project" and (
            not isinstance(spec, Mapping) or not spec or not all(isinstance(k, str) for k in spec)
        ):
            raise problem("$project takes a non-empty document of field specifications")
        if name in ("$addFields", "$set") and (
            not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec)
        ):
            raise problem(f"{name} takes a document of new fields")
        if name == "$unset" and not (
            isinstance(spec, str)
            or (isinstance(spec, list) and spec and all(isinstance(path, str) for path in spec))
        ):
            raise problem("$unset takes a field path or a non-empty list of field paths")
        if name == "$replaceRoot" and (not isinstance(spec, Mapping) or list(spec) != ["newRoot"]):
            raise problem("$replaceRoot takes {'newRoot': <expression>}")
        if name == "$changeStreamSplitLargeEvent":
            if spec != {}:
                raise problem("$changeStreamSplitLargeEvent takes an empty document: {}")
            if not last:
                raise problem("$changeStreamSplitLargeEvent must be the last stage")
        fate = _stage_field_fate(name, spec, "_id")
        if fate == "keeps" or (fate == "unknown" and name == "$redact"):
            return
        verb = {"removes": "removes", "rewrites": "rewrites", "unknown": "may remove or rewrite"}[fate]
        raise problem(f"({name}) {verb} _id, the resume token flowwarden checkpoints", KEEP_ID_HINT)

    def field_fate(self, field: str) -> FieldFate:
        """What the whole pipeline provably does to a top-level field of the change event.

        Stages compose in order: a stage that keeps the field leaves the previous verdict, any
        other verdict replaces it.
        """
        fate: FieldFate = "keeps"
        for stage in self.stages:
            ((name, spec),) = stage.items()
            stage_fate = _stage_field_fate(name, spec, field)
            if stage_fate != "keeps":
                fate = stage_fate
        return fate


# ----------------------------------------------------------------------------------------------
# @retry_policy


def _exception_classes(value: Any, option: str, allowed: str) -> Any:
    items = [value] if isinstance(value, type) else value
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise OptionProblem(
            f"{option} must be a tuple of exception classes", option=option, value=value, allowed=allowed
        )
    items = tuple(items)
    for item in items:
        if not isinstance(item, type) or not issubclass(item, BaseException):
            raise OptionProblem(
                f"{option} holds {item!r}, which is not an exception class",
                option=option,
                value=value,
                allowed=allowed,
            )
        if not issubclass(item, Exception):
            # Retrying KeyboardInterrupt, SystemExit or a task cancellation would keep a stopping
            # process alive.
            raise OptionProblem(
                f"{option} holds {item.__name__}, which signals a stop, not a handler failure",
                option=option,
                value=value,
                allowed=allowed,
            )
    return items


class RetryPolicy(_Options):
    """Options of ``@retry_policy``: how often a failing handler is called again for one event.

    An error is retried when it is an instance of ``retry_on`` and not of ``no_retry_on``; after
    ``max_attempts`` calls in all, ``on_exhausted`` decides (the checkpoint never moves past an
    event whose outcome is STOP).
    """

    decorator: ClassVar[str] = "retry_policy"
    allowed: ClassVar[Mapping[str, str]] = {
        "max_attempts": "an int >= 1 (calls in all, the first included)",
        "initial_delay_seconds": "a finite number >= 0",
        "multiplier": "a finite number >= 1",
        "max_delay_seconds": "a finite number >= initial_delay_seconds",
        "jitter": "a number from 0 to 1",
        "retry_on": "a tuple of Exception subclasses",
        "no_retry_on": "a tuple of Exception subclasses",
        "on_exhausted": _choices(OnError),
    }

    max_attempts: int = Field(default=3, ge=1)
    initial_delay_seconds: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    multiplier: float = Field(default=2.0, ge=1, allow_inf_nan=False)
    max_delay_seconds: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    jitter: float = Field(default=0.2, ge=0, le=1)
    retry_on: tuple[type[Exception], ...] = (Exception,)
    no_retry_on: tuple[type[Exception], ...] = ()
    on_exhausted: OnError = OnError.STOP

    @field_validator("retry_on", "no_retry_on", mode="before")
    @classmethod
    def _classes(cls, value: Any, info: ValidationInfo) -> Any:
        option = info.field_name or "retry_on"
        return _exception_classes(value, option, cls.allowed[option])

    @field_validator("on_exhausted", mode="before")
    @classmethod
    def _on_exhausted(cls, value: Any, info: ValidationInfo) -> Any:
        return _coerce_choice(OnError, value, info.field_name or "")

    @model_validator(mode="after")
    def _consistent(self) -> RetryPolicy:
        if self.max_delay_seconds < self.initial_delay_seconds:
            raise OptionProblem(
                f"max_delay_seconds={self.max_delay_seconds} is below "
                f"initial_delay_seconds={self.initial_delay_seconds}",
                option="max_delay_seconds",
                value=self.max_delay_seconds,
                allowed=self.allowed["max_delay_seconds"],
            )
        return self

    def should_retry(self, error: BaseException) -> bool:
        """True when ``error`` is one this policy retries (attempts left aside)."""
        return (
            isinstance(error, Exception)
            and isinstance(error, self.retry_on)
            and not isinstance(error, self.no_retry_on)
        )

    def delay_for(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``attempt``-th failed call (1-based) before the next one.

        ``initial_delay_seconds * multiplier ** (attempt - 1)`` capped at ``max_delay_seconds``,
        spread by ±``jitter`` of itself with ``rng()`` in [0, 1); never above the cap.
        """
        return backoff_delay(
            attempt,
            initial=self.initial_delay_seconds,
            multiplier=self.multiplier,
            maximum=self.max_delay_seconds,
            jitter=self.jitter,
            rng=rng,
        )


# ----------------------------------------------------------------------------------------------
# @dead_letter_queue


class DeadLetterOptions(_Options):
    """Options of ``@dead_letter_queue``: where events that exhausted their retries are kept.

    ``database=None`` means the stream's own database (for cluster streams the runtime picks the
    checkpoint database). Entries expire ``retention_days`` after they failed (TTL index).
    """

    decorator: ClassVar[str] = "dead_letter_queue"
    allowed: ClassVar[Mapping[str, str]] = {
        "retention_days": f"an int from 1 to {_MAX_RETENTION_DAYS}",
        "collection": "a collection name without '$' that does not start with 'system.'",
        "database": "None or a database name",
    }

    retention_days: int = Field(default=30, ge=1, le=_MAX_RETENTION_DAYS)
    collection: str = "_fw_dlq"
    database: str | None = None

    @field_validator("collection")
    @classmethod
    def _collection_name(cls, value: str) -> str:
        _check_collection_name(value, "collection")
        return value

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str | None) -> str | None:
        return _check_database_name(value, "database")

    @property
    def retention_seconds(self) -> int:
        """``expireAfterSeconds`` of the TTL index."""
        return self.retention_days * 86_400


# ----------------------------------------------------------------------------------------------
# @on_batch / @on_dataframe


class BatchOptions(_Options):
    """Options of ``@on_batch``: a batch is handed over at ``max_events`` or after
    ``max_wait_seconds`` since its first event, whichever comes first."""

    decorator: ClassVar[str] = "on_batch"
    allowed: ClassVar[Mapping[str, str]] = {
        "max_events": "an int >= 1",
        "max_wait_seconds": "a finite number >= 0",
    }

    max_events: int = Field(default=1000, ge=1)
    max_wait_seconds: float = Field(default=1.0, ge=0, allow_inf_nan=False)


def _is_struct_type(value: Any) -> bool:
    # A StructType instance can only exist once pyspark is imported, so looking in sys.modules
    # checks it exactly without importing pyspark here.
    types_module = sys.modules.get("pyspark.sql.types")
    struct_type = getattr(types_module, "StructType", None)
    return isinstance(struct_type, type) and isinstance(value, struct_type)


class DataFrameOptions(BatchOptions):
    """Options of ``@on_dataframe``: batch limits, the full-document schema and its mode."""

    decorator: ClassVar[str] = "on_dataframe"
    allowed: ClassVar[Mapping[str, str]] = {
        **BatchOptions.allowed,
        "schema": "None, a pydantic BaseModel subclass, or a pyspark StructType instance",
        "mode": _choices(SchemaMode),
    }

    max_events: int = Field(default=10_000, ge=1)
    max_wait_seconds: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    schema_: Any = Field(default=None, alias="schema")
    mode: SchemaMode = SchemaMode.PERMISSIVE

    @property
    def schema(self) -> Any:
        """The declared full-document schema (None: extended-JSON strings)."""
        return self.schema_

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: Any) -> Any:
        if value is None or _is_struct_type(value):
            return value
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value
        if isinstance(value, BaseModel):
            hint = f"pass the class {type(value).__name__}, not an instance"
        elif isinstance(value, type) and value.__name__ == "StructType":
            hint = "pass a StructType instance, e.g. StructType([...]), not the class"
        else:
            hint = f"{type(value).__name__} is neither a pydantic model class nor a StructType"
        raise OptionProblem(
            f"schema is not usable: {hint}", option="schema", value=value, allowed=cls.allowed["schema"]
        )

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any, info: ValidationInfo) -> Any:
        return _coerce_choice(SchemaMode, value, info.field_name or "")


# ----------------------------------------------------------------------------------------------
# Turning pydantic errors into ConfigurationError

OptionsT = TypeVar("OptionsT", bound=_Options)


def validate_options(model: type[OptionsT], owner: str, values: Mapping[str, Any]) -> OptionsT:
    """Build ``model`` from ``values``, or raise a ConfigurationError naming ``owner``.

    The error names the option, the value given and the allowed values; a pydantic
    ValidationError never escapes.
    """
    try:
        return model(**values)
    except ValidationError as exc:
        raise _configuration_error(model, owner, values, exc) from None


def _configuration_error(
    model: type[_Options], owner: str, values: Mapping[str, Any], exc: ValidationError
) -> ConfigurationError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    more = f" ({len(errors) - 1} more problem(s) after this one)" if len(errors) > 1 else ""
    context = first.get("ctx") or {}
    cause = context.get("error")
    decorator = f"@{model.decorator}" if model.decorator else model.__name__
    if isinstance(cause, OptionProblem):
        return ConfigurationError(
            f"{decorator}: {cause.message}{more}",
            owner=owner,
            option=cause.option,
            value=cause.value,
            allowed=cause.allowed,
        )
    location = first.get("loc") or ()
    option = str(location[0]) if location else "options"
    if option == "schema_":
        option = "schema"
    value = values.get(option, first.get("input"))
    if first.get("type") == "extra_forbidden":
        known = [name for name in model.allowed]
        return ConfigurationError(
            f"{decorator} has no option {option!r}{more}",
            owner=owner,
            option=option,
            value=value,
            allowed="options " + ", ".join(known),
        )
    return ConfigurationError(
        f"{decorator}({option}={value!r}) is not accepted: {first.get('msg', 'invalid value')}{more}",
        owner=owner,
        option=option,
        value=value,
        allowed=model.allowed.get(option, "see the docstring of " + decorator),
    )


__all__ = [
    "ALLOWED_PIPELINE_STAGES",
    "EXPANDED_OPERATION_TYPES",
    "OPERATION_TYPES",
    "STANDARD_OPERATION_TYPES",
    "STORE_METHODS",
    "BatchOptions",
    "ChangeStreamOptions",
    "CheckpointOptions",
    "DataFrameOptions",
    "DeadLetterOptions",
    "Deployment",
    "OnError",
    "OnHistoryLost",
    "OnInvalidate",
    "OptionProblem",
    "PipelineOptions",
    "RetryPolicy",
    "SchemaMode",
    "StartPosition",
    "backoff_delay",
    "new_root_fate",
    "validate_options",
]
