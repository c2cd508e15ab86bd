"""What the runtime reads of a handler class: its :class:`StreamSpec`, validated as a whole.

The decorators (:mod:`flowwarden.decorators`) leave their validated options and method marks on
the class; :func:`stream_spec` reads them once per class, checks that they fit together (one
handling mode, one method per operation type, handlers the stream's filters can reach) and
caches the result. Nothing here runs per event, and it never imports the runtime, the
checkpoint stores or pyspark.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from flowwarden.config import (
    BatchOptions,
    ChangeStreamOptions,
    CheckpointOptions,
    DataFrameOptions,
    DeadLetterOptions,
    OnError,
    PipelineOptions,
    RetryPolicy,
    SchemaMode,
    Snapshot,
)
from flowwarden.errors import ConfigurationError
from flowwarden.mongo.buckets import bucket_stage, partition_name

HandlerKind = Literal["event", "batch", "dataframe"]

# Where the decorators leave their work on a class or function.
STREAM_ATTR = "__flowwarden_change_stream__"
CHECKPOINT_ATTR = "__flowwarden_checkpoint__"
PIPELINE_ATTR = "__flowwarden_pipeline__"
RETRY_ATTR = "__flowwarden_retry_policy__"
DEAD_LETTER_ATTR = "__flowwarden_dead_letter_queue__"
SPEC_ATTR = "__flowwarden_stream_spec__"
MARK_ATTR = "__flowwarden_handler__"
FILTER_ATTR = "__flowwarden_event_filter__"

CLASS_DECORATORS = ("change_stream", "checkpoint", "pipeline", "retry_policy", "dead_letter_queue")
METHOD_DECORATORS = (
    "on_insert",
    "on_update",
    "on_replace",
    "on_delete",
    "on_change",
    "on_batch",
    "on_dataframe",
)
_HANDLER_HINT = "one of @" + ", @".join(METHOD_DECORATORS) + " on a method"


# ----------------------------------------------------------------------------------------------
# What the runtime reads


@dataclass(frozen=True)
class HandlerMethod:
    """A handler method of a class, resolved once.

    Call it as ``getattr(instance, name)(payload, ctx)`` when :attr:`wants_ctx`, else with the
    payload alone; await the result when :attr:`is_async`.
    """

    name: str
    """Attribute name of the method on the handler class."""
    is_async: bool
    wants_ctx: bool
    """The method takes a second parameter, which receives the ``StreamContext``."""
    kind: HandlerKind = "event"
    operation_types: tuple[str, ...] | None = None
    """Operation types the method claims; None for ``@on_change`` (every type not claimed)."""

    def bind(self, instance: object) -> Callable[..., Any]:
        """The bound method of ``instance``; resolve it once per instance, not per event."""
        method: Callable[..., Any] = getattr(instance, self.name)
        return method


@dataclass(frozen=True)
class BatchHandler(HandlerMethod):
    """An ``@on_batch`` method: called with ``list[ChangeEvent]`` at ``max_events`` or once
    ``max_wait_seconds`` passed since the batch's first event, whichever comes first."""

    max_events: int = 1000
    max_wait_seconds: float = 1.0


@dataclass(frozen=True)
class DataFrameHandler(BatchHandler):
    """An ``@on_dataframe`` method: called with a Spark DataFrame of a batch."""

    schema: Any = None
    """None, a pydantic model class, a pyspark StructType or ``"infer"`` for ``full_document``."""
    mode: SchemaMode = SchemaMode.PERMISSIVE
    sample_size: int = 1000
    """With ``schema="infer"``: the documents ``$sample`` draws."""
    schema_hints: Any = None
    """With ``schema="infer"``: a DDL field list or StructType laid over what sampling found."""


@dataclass(frozen=True, eq=False)
class StreamSpec:
    """Everything the runtime needs to run one handler class, validated as a whole.

    A class is in exactly one mode: per-event methods (:attr:`event_handlers`), one
    :attr:`batch` handler, or one :attr:`dataframe` handler. Events with no handler still
    complete: they advance the checkpoint.
    """

    name: str
    """The stream name: it keys the checkpoint and the lease."""
    handler_class: type
    stream: ChangeStreamOptions
    """Change stream options, with ``name`` filled in."""
    checkpoint: CheckpointOptions
    pipeline: tuple[dict[str, Any], ...]
    """Stages after ``$changeStream``: for database and cluster streams the ``$match`` leaving
    out flowwarden's own collections and the one keeping the selected collections
    (``collections``, ``exclude_collections``), the operation-type ``$match`` (when
    ``operation_types`` is set), the ``@pipeline`` stages, then the stages removing
    ``exclude_fields``. Do not mutate."""
    retry: RetryPolicy
    dead_letter: DeadLetterOptions | None
    """``@dead_letter_queue`` options; defaults when on_exhausted is DEAD_LETTER without it."""
    event_handlers: Mapping[str, HandlerMethod]
    """Operation type -> method; the ``"*"`` key holds the ``@on_change`` method, if any."""
    fallback: HandlerMethod | None
    """The ``@on_change`` method, called for every operation type no other method claims."""
    batch: BatchHandler | None
    dataframe: DataFrameHandler | None
    event_filter: str | None = None
    """The name of the ``@event_filter`` method, if the class has one: events it returns false
    for reach no method and complete as if handled."""

    @property
    def mode(self) -> HandlerKind:
        """``"event"``, ``"batch"`` or ``"dataframe"``."""
        if self.batch is not None:
            return "batch"
        if self.dataframe is not None:
            return "dataframe"
        return "event"

    def handler_for(self, operation_type: str) -> HandlerMethod | None:
        """The per-event method for ``operation_type``, or None (the event just completes).
        Snapshot rows go to ``@on_snapshot``, else ``@on_insert``, else ``@on_change``."""
        if operation_type == "snapshot" and "snapshot" not in self.event_handlers:
            return self.event_handlers.get("insert", self.fallback)
        return self.event_handlers.get(operation_type, self.fallback)


@dataclass(frozen=True)
class HandlerMark:
    """What a method decorator records on the function it marks."""

    kind: HandlerKind
    decorators: tuple[str, ...]
    operation_types: tuple[str, ...] | None
    is_async: bool
    wants_ctx: bool
    options: BatchOptions | None


# ----------------------------------------------------------------------------------------------
# The spec


def stream_spec(handler_class: type) -> StreamSpec:
    """The validated spec of a handler class, computed once per class and cached on it.

    Raises ConfigurationError when the class is not a complete handler: no ``@change_stream``,
    no handler method, two methods for one operation type, per-event methods mixed with
    ``@on_batch``/``@on_dataframe``, or a handler the stream's filters can never reach.
    """
    if not isinstance(handler_class, type):
        raise ConfigurationError(
            f"handlers are classes decorated with @change_stream, got {handler_class!r}",
            owner=repr(handler_class),
            option="handlers",
            value=handler_class,
            allowed="a class decorated with @change_stream",
        )
    cached = vars(handler_class).get(SPEC_ATTR)
    if isinstance(cached, StreamSpec) and cached.handler_class is handler_class:
        return cached
    spec = build_spec(handler_class)
    setattr(handler_class, SPEC_ATTR, spec)
    return spec


def _handler_marks(cls: type) -> list[tuple[str, HandlerMark]]:
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            names.update(dict.fromkeys(vars(klass)))
    marks = []
    for name in names:
        # The attribute as the class resolves it: an undecorated override drops a base handler.
        attribute = inspect.getattr_static(cls, name)
        if isinstance(attribute, (staticmethod, classmethod)) and isinstance(
            getattr(attribute.__func__, MARK_ATTR, None), HandlerMark
        ):
            raise ConfigurationError(
                f"handler {name!r} is a {type(attribute).__name__}; handlers are instance methods",
                owner=cls.__qualname__,
                option=getattr(attribute.__func__, MARK_ATTR).decorators[0],
                value=name,
                allowed="def name(self, event, ctx=None) or async def",
            )
        mark = getattr(attribute, MARK_ATTR, None)
        if isinstance(mark, HandlerMark):
            marks.append((name, mark))
    return marks


def _event_filter(cls: type) -> str | None:
    """The name of the class's ``@event_filter`` method (one at most), as the class resolves it."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            names.update(dict.fromkeys(vars(klass)))
    found = [name for name in names if getattr(inspect.getattr_static(cls, name), FILTER_ATTR, False)]
    if len(found) > 1:
        raise ConfigurationError(
            f"two @event_filter methods, {', '.join(map(repr, found))}; keep one (it may call the others)",
            owner=cls.__qualname__,
            option="event_filter",
            value=tuple(found),
            allowed="one @event_filter method per class",
        )
    return found[0] if found else None


def _describe(name: str, mark: HandlerMark) -> str:
    return f"{name!r} (@{', @'.join(mark.decorators)})"


def build_spec(cls: type) -> StreamSpec:
    owner = cls.__qualname__
    marks = _handler_marks(cls)
    stream: ChangeStreamOptions | None = getattr(cls, STREAM_ATTR, None)
    if stream is None:
        if marks:
            message = (
                f"has handler methods ({', '.join(_describe(n, m) for n, m in marks)}) but no "
                "@change_stream; add @change_stream(collection=..., database=...) above the class"
            )
        else:
            message = "is not a handler class: decorate it with @change_stream and mark handler methods"
        raise ConfigurationError(
            message,
            owner=owner,
            option="change_stream",
            value=None,
            allowed="@change_stream(collection, database, ...) on the class",
        )
    stream = stream.model_copy(update={"name": stream.name or cls.__name__})
    assert stream.name is not None

    event_marks = [(n, m) for n, m in marks if m.kind == "event"]
    batch_marks = [(n, m) for n, m in marks if m.kind != "event"]
    if not marks:
        raise ConfigurationError(
            "has no handler method, so it would consume events and do nothing",
            owner=owner,
            option="handlers",
            value=None,
            allowed=_HANDLER_HINT,
        )
    if batch_marks and len(marks) > 1:
        first_name, first = batch_marks[0]
        others = [(n, m) for n, m in marks if n != first_name]
        raise ConfigurationError(
            f"method {_describe(first_name, first)} cannot share the class with "
            f"{', '.join(_describe(n, m) for n, m in others)}: a class either handles events one by "
            f"one, or in one @on_batch, or in one @on_dataframe method",
            owner=owner,
            option=first.decorators[0],
            value=tuple(name for name, _ in marks),
            allowed="per-event methods only, or exactly one @on_batch, or exactly one @on_dataframe",
        )

    retry = getattr(cls, RETRY_ATTR, None) or RetryPolicy()
    dead_letter: DeadLetterOptions | None = getattr(cls, DEAD_LETTER_ATTR, None)
    if dead_letter is None and retry.on_exhausted is OnError.DEAD_LETTER:
        dead_letter = DeadLetterOptions()
    pipeline_options: PipelineOptions | None = getattr(cls, PIPELINE_ATTR, None)
    stages: list[dict[str, Any]] = []
    own_stage = stream.own_collections_stage()
    if own_stage is not None:
        stages.append(own_stage)
    selection_stage = stream.selection_stage()
    if selection_stage is not None:
        stages.append(selection_stage)
    type_stage = stream.operation_type_stage()
    if type_stage is not None:
        stages.append(type_stage)
    if pipeline_options is not None:
        stages.extend(pipeline_options.stages)
    # Last: the user's stages may still match on an excluded field, and the snapshot's copy
    # filter reads the $match stages up to the first stage of another kind.
    stages.extend(stream.exclusion_stages())

    batch: BatchHandler | None = None
    dataframe: DataFrameHandler | None = None
    handlers: dict[str, HandlerMethod] = {}
    fallback: HandlerMethod | None = None
    if batch_marks:
        name, mark = batch_marks[0]
        options = mark.options
        assert options is not None
        if isinstance(options, DataFrameOptions):
            if options.infers_schema and stream.collection is None:
                raise ConfigurationError(
                    "schema='infer' samples the watched collection, and a database or cluster "
                    "stream watches none; give @change_stream a collection, or a schema",
                    owner=owner,
                    option="schema",
                    value=options.schema,
                    allowed="schema='infer' on collection streams",
                )
            dataframe = DataFrameHandler(
                name,
                mark.is_async,
                mark.wants_ctx,
                "dataframe",
                None,
                options.max_events,
                options.max_wait_seconds,
                options.schema,
                options.mode,
                options.sample_size,
                options.schema_hints,
            )
        else:
            batch = BatchHandler(
                name,
                mark.is_async,
                mark.wants_ctx,
                "batch",
                None,
                options.max_events,
                options.max_wait_seconds,
            )
    else:
        fallback, handlers = _event_dispatch(owner, stream, pipeline_options, event_marks)

    return StreamSpec(
        name=stream.name,
        handler_class=cls,
        stream=stream,
        checkpoint=getattr(cls, CHECKPOINT_ATTR, None) or CheckpointOptions(),
        pipeline=tuple(stages),
        retry=retry,
        dead_letter=dead_letter,
        event_handlers=MappingProxyType(handlers),
        fallback=fallback,
        batch=batch,
        dataframe=dataframe,
        event_filter=_event_filter(cls),
    )


def _event_dispatch(
    owner: str,
    stream: ChangeStreamOptions,
    pipeline_options: PipelineOptions | None,
    event_marks: list[tuple[str, HandlerMark]],
) -> tuple[HandlerMethod | None, dict[str, HandlerMethod]]:
    claimed: dict[str, tuple[str, HandlerMark]] = {}
    fallback: tuple[str, HandlerMark] | None = None
    for name, mark in event_marks:
        if mark.operation_types is None:
            if fallback is not None:
                raise ConfigurationError(
                    f"two @on_change methods, {fallback[0]!r} and {name!r}; keep one",
                    owner=owner,
                    option="on_change",
                    value=(fallback[0], name),
                    allowed="one @on_change method per class",
                )
            fallback = (name, mark)
            continue
        for operation_type in mark.operation_types:
            if operation_type in claimed:
                other = claimed[operation_type]
                raise ConfigurationError(
                    f"two methods handle {operation_type!r} events: {_describe(*other)} and "
                    f"{_describe(name, mark)}; keep one",
                    owner=owner,
                    option=f"on_{operation_type}",
                    value=(other[0], name),
                    allowed="one handler method per operation type",
                )
            claimed[operation_type] = (name, mark)

    if "snapshot" in claimed and stream.snapshot == Snapshot.NEVER:
        name, mark = claimed["snapshot"]
        raise ConfigurationError(
            f"handler {_describe(name, mark)} can never run: the stream copies no existing "
            "documents (snapshot=NEVER)",
            owner=owner,
            option="snapshot",
            value=stream.snapshot,
            allowed="INITIAL, INITIAL_ONLY or WHEN_NEEDED with @on_snapshot",
        )
    if stream.operation_types is not None:
        # Snapshot rows do not come from the change stream: operation_types does not filter them.
        passed = set(stream.operation_types) | {"invalidate", "snapshot"}
        for operation_type, (name, mark) in claimed.items():
            if operation_type not in passed:
                raise ConfigurationError(
                    f"handler {_describe(name, mark)} can never run: "
                    f"operation_types={list(stream.operation_types)!r} filters {operation_type!r} "
                    f"events out; add {operation_type!r} or remove the handler",
                    owner=owner,
                    option="operation_types",
                    value=stream.operation_types,
                    allowed=f"operation types including {operation_type!r}",
                )
    if claimed and pipeline_options is not None and pipeline_options.field_fate("operationType") == "removes":
        names = sorted({name for name, _ in claimed.values()})
        raise ConfigurationError(
            f"the pipeline removes operationType, so methods {', '.join(map(repr, names))} "
            "could never be chosen; keep operationType in the event or use @on_change",
            owner=owner,
            option="stages",
            value=pipeline_options.stages,
            allowed="stages that keep the operationType field",
        )

    def method(name: str, mark: HandlerMark) -> HandlerMethod:
        return HandlerMethod(name, mark.is_async, mark.wants_ctx, "event", mark.operation_types)

    methods = {name: method(name, mark) for name, mark in event_marks}
    handlers = {operation_type: methods[name] for operation_type, (name, _) in claimed.items()}
    fallback_method = methods[fallback[0]] if fallback is not None else None
    if fallback_method is not None:
        handlers["*"] = fallback_method
    return fallback_method, handlers


def partition_specs(spec: StreamSpec) -> list[StreamSpec]:
    """The specs the connector runs for ``spec``: itself, or one per bucket when partitioned."""
    count = spec.stream.partitions
    if count == 1:
        return [spec]
    return [
        dataclasses.replace(
            spec,
            name=partition_name(spec.name, index, count),
            pipeline=(bucket_stage(index, count), *spec.pipeline),
        )
        for index in range(count)
    ]


__all__ = [
    "BatchHandler",
    "DataFrameHandler",
    "HandlerKind",
    "HandlerMethod",
    "StreamSpec",
    "partition_specs",
    "stream_spec",
]
