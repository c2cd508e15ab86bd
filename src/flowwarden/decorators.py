"""Decorators that turn a class into a change-stream handler, and the spec the runtime reads.

Class decorators (``@change_stream``, ``@checkpoint``, ``@pipeline``, ``@retry_policy``,
``@dead_letter_queue``) validate their options once, when applied, and store the frozen model on
the class; they stack in any order. Method decorators (``@on_insert`` ... ``@on_dataframe``) mark a
method and record, once, whether it is async and whether it takes a ``ctx`` parameter.

The runtime reads a class only through :func:`stream_spec`, computed once per class. Nothing in
this module runs per event, and it never imports the runtime, the checkpoint stores or pyspark.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, TypeVar, overload

from bson import Timestamp

from flowwarden.config import (
    BatchOptions,
    ChangeStreamOptions,
    CheckpointOptions,
    DataFrameOptions,
    DeadLetterOptions,
    OnError,
    OnHistoryLost,
    PipelineOptions,
    RetryPolicy,
    SchemaMode,
    StartPosition,
    validate_options,
)
from flowwarden.errors import ConfigurationError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

HandlerKind = Literal["event", "batch", "dataframe"]

_STREAM_ATTR = "__flowwarden_change_stream__"
_CHECKPOINT_ATTR = "__flowwarden_checkpoint__"
_PIPELINE_ATTR = "__flowwarden_pipeline__"
_RETRY_ATTR = "__flowwarden_retry_policy__"
_DEAD_LETTER_ATTR = "__flowwarden_dead_letter_queue__"
_SPEC_ATTR = "__flowwarden_stream_spec__"
_MARK_ATTR = "__flowwarden_handler__"

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
    """None, a pydantic model class or a pyspark StructType for ``full_document``."""
    mode: SchemaMode = SchemaMode.PERMISSIVE


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
    """Stages after ``$changeStream``: the operation-type ``$match`` first (when
    ``operation_types`` is set), then the ``@pipeline`` stages. Do not mutate."""
    retry: RetryPolicy
    dead_letter: DeadLetterOptions | None
    """``@dead_letter_queue`` options; defaults when on_exhausted is DEAD_LETTER without it."""
    event_handlers: Mapping[str, HandlerMethod]
    """Operation type -> method; the ``"*"`` key holds the ``@on_change`` method, if any."""
    fallback: HandlerMethod | None
    """The ``@on_change`` method, called for every operation type no other method claims."""
    batch: BatchHandler | None
    dataframe: DataFrameHandler | None

    @property
    def mode(self) -> HandlerKind:
        """``"event"``, ``"batch"`` or ``"dataframe"``."""
        if self.batch is not None:
            return "batch"
        if self.dataframe is not None:
            return "dataframe"
        return "event"

    def handler_for(self, operation_type: str) -> HandlerMethod | None:
        """The per-event method for ``operation_type``, or None (the event just completes)."""
        return self.event_handlers.get(operation_type, self.fallback)


# ----------------------------------------------------------------------------------------------
# Method decorators


@dataclass(frozen=True)
class _HandlerMark:
    """What a method decorator records on the function it marks."""

    kind: HandlerKind
    decorators: tuple[str, ...]
    operation_types: tuple[str, ...] | None
    is_async: bool
    wants_ctx: bool
    options: BatchOptions | None


def _owner_of(func: Callable[..., Any]) -> str:
    qualname = str(getattr(func, "__qualname__", None) or _method_name(func))
    owner, _, _ = qualname.rpartition(".")
    return owner or str(getattr(func, "__module__", None) or qualname)


def _method_name(func: Callable[..., Any]) -> str:
    return str(getattr(func, "__name__", None) or repr(func))


_PAYLOAD = {"event": "event", "batch": "events", "dataframe": "df"}


def _inspect_handler(func: Any, decorator: str, kind: HandlerKind) -> tuple[bool, bool]:
    """``(is_async, wants_ctx)`` of a handler function, or a ConfigurationError."""
    shape = f"def name(self, {_PAYLOAD[kind]}, ctx=None) or async def"
    if isinstance(func, (staticmethod, classmethod)):
        inner = func.__func__
        raise ConfigurationError(
            f"@{decorator} is applied to a {type(func).__name__} {_method_name(inner)!r}; handlers "
            "are instance methods",
            owner=_owner_of(inner),
            option=decorator,
            value=inner,
            allowed=shape,
        )
    if not inspect.isfunction(func) and not inspect.isfunction(inspect.unwrap(func)):
        raise ConfigurationError(
            f"@{decorator} marks methods, got {func!r}",
            owner=_owner_of(func) if callable(func) else "handler class",
            option=decorator,
            value=func,
            allowed=shape,
        )
    name = _method_name(func)
    owner = _owner_of(func)
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise ConfigurationError(
            f"@{decorator} method {name!r} is a generator: calling it would not run its body",
            owner=owner,
            option=decorator,
            value=func,
            allowed=shape,
        )
    unwrapped = inspect.unwrap(func)
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(unwrapped)
    parameters = list(inspect.signature(func).parameters.values())
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    required_keyword = [
        p.name
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    required_extra = [p.name for p in positional[3:] if p.default is inspect.Parameter.empty]
    if (len(positional) < 2 and not var_positional) or required_keyword or required_extra:
        raise ConfigurationError(
            f"@{decorator} method {name}{inspect.signature(func)} cannot be called as "
            f"(self, {_PAYLOAD[kind]}[, ctx])",
            owner=owner,
            option=decorator,
            value=func,
            allowed=shape,
        )
    wants_ctx = len(positional) >= 3 or var_positional
    return is_async, wants_ctx


def _mark(
    func: F,
    decorator: str,
    kind: HandlerKind,
    operation_types: tuple[str, ...] | None,
    options: BatchOptions | None,
) -> F:
    is_async, wants_ctx = _inspect_handler(func, decorator, kind)
    previous = getattr(func, _MARK_ATTR, None)
    if isinstance(previous, _HandlerMark):
        # Stacking is only meaningful for per-type event decorators: @on_insert @on_update.
        reason = None
        if decorator in previous.decorators:
            reason = f"@{decorator} is applied twice"
        elif kind != "event" or previous.kind != "event":
            reason = f"@{decorator} cannot be combined with @{', @'.join(previous.decorators)}"
        elif operation_types is None or previous.operation_types is None:
            reason = "@on_change already covers every operation type; it cannot be combined with @" + (
                ", @".join(d for d in (*previous.decorators, decorator) if d != "on_change")
            )
        if reason is not None:
            raise ConfigurationError(
                f"method {_method_name(func)!r}: {reason}",
                owner=_owner_of(func),
                option=decorator,
                value=(*previous.decorators, decorator),
                allowed="one of @on_batch, @on_dataframe, @on_change, or any of @on_insert, "
                "@on_update, @on_replace, @on_delete together",
            )
        assert operation_types is not None and previous.operation_types is not None
        operation_types = (*previous.operation_types, *operation_types)
        decorators = (*previous.decorators, decorator)
    else:
        decorators = (decorator,)
    mark = _HandlerMark(kind, decorators, operation_types, is_async, wants_ctx, options)
    setattr(func, _MARK_ATTR, mark)
    return func


def _event_handler(
    func: F | None, decorator: str, operation_types: tuple[str, ...] | None
) -> F | Callable[[F], F]:
    if func is None:

        def apply(target: F) -> F:
            return _mark(target, decorator, "event", operation_types, None)

        return apply
    return _mark(func, decorator, "event", operation_types, None)


@overload
def on_insert(func: F, /) -> F: ...
@overload
def on_insert() -> Callable[[F], F]: ...
def on_insert(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle ``insert`` events: ``(self, event: ChangeEvent[, ctx: StreamContext])``."""
    return _event_handler(func, "on_insert", ("insert",))


@overload
def on_update(func: F, /) -> F: ...
@overload
def on_update() -> Callable[[F], F]: ...
def on_update(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle ``update`` events: ``(self, event: ChangeEvent[, ctx: StreamContext])``.

    ``event.full_document`` is None unless ``@change_stream(full_document="updateLookup")`` (or
    whenAvailable/required) asks the server for it.
    """
    return _event_handler(func, "on_update", ("update",))


@overload
def on_replace(func: F, /) -> F: ...
@overload
def on_replace() -> Callable[[F], F]: ...
def on_replace(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle ``replace`` events: ``(self, event: ChangeEvent[, ctx: StreamContext])``."""
    return _event_handler(func, "on_replace", ("replace",))


@overload
def on_delete(func: F, /) -> F: ...
@overload
def on_delete() -> Callable[[F], F]: ...
def on_delete(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle ``delete`` events: ``(self, event: ChangeEvent[, ctx: StreamContext])``."""
    return _event_handler(func, "on_delete", ("delete",))


@overload
def on_change(func: F, /) -> F: ...
@overload
def on_change() -> Callable[[F], F]: ...
def on_change(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle every operation type that no ``@on_insert``/``update``/``replace``/``delete``
    method of the class claims (drop, rename, invalidate ... included)."""
    return _event_handler(func, "on_change", None)


def _batch_options(func: Callable[..., Any] | None, model: type[BatchOptions], values: dict[str, Any]) -> Any:
    decorator = model.decorator
    if func is not None and not callable(func):
        raise ConfigurationError(
            f"@{decorator} takes keyword options only, got the positional value {func!r}",
            owner="handler class",
            option=decorator,
            value=func,
            allowed=", ".join(f"{name}=" for name in model.allowed),
        )

    def apply(target: F) -> F:
        options = validate_options(model, f"{_owner_of(target)}.{_method_name(target)}", values)
        kind: HandlerKind = "dataframe" if isinstance(options, DataFrameOptions) else "batch"
        return _mark(target, decorator, kind, None, options)

    return apply(func) if func is not None else apply


@overload
def on_batch(func: F, /) -> F: ...
@overload
def on_batch(*, max_events: int = 1000, max_wait_seconds: float = 1.0) -> Callable[[F], F]: ...
def on_batch(
    func: F | None = None, /, *, max_events: int = 1000, max_wait_seconds: float = 1.0
) -> F | Callable[[F], F]:
    """Handle events in batches: ``(self, events: list[ChangeEvent][, ctx: StreamContext])``.

    A batch is handed over at ``max_events`` (>= 1) or ``max_wait_seconds`` (>= 0) after its
    first event. Its events complete together: the checkpoint moves past the batch only when
    the method returned. A class with ``@on_batch`` has no other handler method.
    """
    result: F | Callable[[F], F] = _batch_options(
        func, BatchOptions, {"max_events": max_events, "max_wait_seconds": max_wait_seconds}
    )
    return result


@overload
def on_dataframe(func: F, /) -> F: ...
@overload
def on_dataframe(
    *,
    max_events: int = 10_000,
    max_wait_seconds: float = 2.0,
    schema: Any = None,
    mode: SchemaMode | str = SchemaMode.PERMISSIVE,
) -> Callable[[F], F]: ...
def on_dataframe(
    func: F | None = None,
    /,
    *,
    max_events: int = 10_000,
    max_wait_seconds: float = 2.0,
    schema: Any = None,
    mode: SchemaMode | str = SchemaMode.PERMISSIVE,
) -> F | Callable[[F], F]:
    """Handle batches as Spark DataFrames: ``(self, df[, ctx: StreamContext])``.

    ``schema`` (None, a pydantic model class or a StructType) types ``full_document``; ``mode``
    says what happens to documents that do not fit it. pyspark is not imported here. A class
    with ``@on_dataframe`` has no other handler method.
    """
    result: F | Callable[[F], F] = _batch_options(
        func,
        DataFrameOptions,
        {"max_events": max_events, "max_wait_seconds": max_wait_seconds, "schema": schema, "mode": mode},
    )
    return result


# ----------------------------------------------------------------------------------------------
# Class decorators


def _attach(cls: Any, attribute: str, decorator: str, model: type[Any], values: Mapping[str, Any]) -> Any:
    if not isinstance(cls, type):
        raise ConfigurationError(
            f"@{decorator} decorates handler classes, got {cls!r}",
            owner=getattr(cls, "__qualname__", repr(cls)),
            option=decorator,
            value=cls,
            allowed="a class",
        )
    owner = cls.__qualname__
    if attribute in vars(cls):
        raise ConfigurationError(
            f"@{decorator} is applied twice; merge the two into one",
            owner=owner,
            option=decorator,
            value=values,
            allowed=f"one @{decorator} per class",
        )
    setattr(cls, attribute, validate_options(model, owner, values))
    try:
        _revalidate(cls)
    except ConfigurationError:
        # Leave the class as it was, so catching the error and decorating again starts clean.
        delattr(cls, attribute)
        raise
    return cls


def _revalidate(cls: type) -> None:
    # Decorators stack in any order, so each one re-checks the class once @change_stream is
    # there: errors between decorators surface at decoration time whichever is applied last.
    if _SPEC_ATTR in vars(cls):
        delattr(cls, _SPEC_ATTR)
    if getattr(cls, _STREAM_ATTR, None) is not None:
        setattr(cls, _SPEC_ATTR, _build_spec(cls))


@overload
def change_stream(collection: type[T], /) -> type[T]: ...
@overload
def change_stream(
    collection: str | None = None,
    database: str | None = None,
    *,
    name: str | None = None,
    full_document: str = "default",
    full_document_before_change: str = "off",
    operation_types: Iterable[str] | None = None,
    batch_size: int | None = None,
    max_await_time_ms: int = 1000,
    max_concurrency: int = 1,
    deployment: str = "all_instances",
    on_invalidate: str = "stop",
    lease_ttl_seconds: float = 30,
    restart_initial_delay_seconds: float = 1.0,
    restart_max_delay_seconds: float = 60.0,
    max_restarts: int | None = 10,
    show_expanded_events: bool = False,
) -> Callable[[type[T]], type[T]]: ...
def change_stream(
    collection: Any = None,
    database: str | None = None,
    *,
    name: str | None = None,
    full_document: str = "default",
    full_document_before_change: str = "off",
    operation_types: Iterable[str] | None = None,
    batch_size: int | None = None,
    max_await_time_ms: int = 1000,
    max_concurrency: int = 1,
    deployment: str = "all_instances",
    on_invalidate: str = "stop",
    lease_ttl_seconds: float = 30,
    restart_initial_delay_seconds: float = 1.0,
    restart_max_delay_seconds: float = 60.0,
    max_restarts: int | None = 10,
    show_expanded_events: bool = False,
) -> Any:
    """Make a class a change-stream handler.

    ``collection`` and ``database``: watch one collection; only ``database``: one database;
    neither (or bare ``@change_stream``): the whole cluster. ``name`` (default: the class name)
    keys the checkpoint, so renaming a class without ``name=`` starts a new checkpoint.
    ``operation_types`` filters server-side; ``invalidate`` always passes so the stream sees its
    own end. ``deployment="single_leader"`` runs one instance at a time through a lease of
    ``lease_ttl_seconds``. After an error a re-open may fix, the stream re-opens from its
    checkpoint, waiting ``restart_initial_delay_seconds`` doubling to
    ``restart_max_delay_seconds``: for as long as it takes after transient errors (the deployment
    out of reach), at most ``max_restarts`` times in a row after errors not known to be transient
    (None: forever). Errors no re-open can fix fail the stream at once.
    """
    values: dict[str, Any] = {
        "collection": collection,
        "database": database,
        "name": name,
        "full_document": full_document,
        "full_document_before_change": full_document_before_change,
        "operation_types": operation_types,
        "batch_size": batch_size,
        "max_await_time_ms": max_await_time_ms,
        "max_concurrency": max_concurrency,
        "deployment": deployment,
        "on_invalidate": on_invalidate,
        "lease_ttl_seconds": lease_ttl_seconds,
        "restart_initial_delay_seconds": restart_initial_delay_seconds,
        "restart_max_delay_seconds": restart_max_delay_seconds,
        "max_restarts": max_restarts,
        "show_expanded_events": show_expanded_events,
    }
    if isinstance(collection, type):
        # Bare @change_stream: a cluster stream with every default.
        return _attach(collection, _STREAM_ATTR, "change_stream", ChangeStreamOptions, {})
    return lambda cls: _attach(cls, _STREAM_ATTR, "change_stream", ChangeStreamOptions, values)


@overload
def checkpoint(save_every_n: type[T], /) -> type[T]: ...
@overload
def checkpoint(
    save_every_n: int = 1,
    save_interval_seconds: float = 5,
    start_position: StartPosition | str = StartPosition.RESUME,
    start_at: datetime | Timestamp | None = None,
    on_history_lost: OnHistoryLost | str = OnHistoryLost.FAIL,
    store: Any = None,
) -> Callable[[type[T]], type[T]]: ...
def checkpoint(
    save_every_n: Any = 1,
    save_interval_seconds: float = 5,
    start_position: StartPosition | str = StartPosition.RESUME,
    start_at: datetime | Timestamp | None = None,
    on_history_lost: OnHistoryLost | str = OnHistoryLost.FAIL,
    store: Any = None,
) -> Any:
    """How the stream's position is saved and where it starts.

    A save happens every ``save_every_n`` completed events or ``save_interval_seconds``,
    whichever comes first, and never past an event still in flight. ``start_position`` applies
    when there is no checkpoint (LATEST: always); AT_TIME needs ``start_at``, a timezone-aware
    datetime or a bson Timestamp. ``store``: a checkpoint store instance (default: the
    connector's). A class without ``@checkpoint`` gets these defaults.
    """
    if isinstance(save_every_n, type):
        return _attach(save_every_n, _CHECKPOINT_ATTR, "checkpoint", CheckpointOptions, {})
    values = {
        "save_every_n": save_every_n,
        "save_interval_seconds": save_interval_seconds,
        "start_position": start_position,
        "start_at": start_at,
        "on_history_lost": on_history_lost,
        "store": store,
    }
    return lambda cls: _attach(cls, _CHECKPOINT_ATTR, "checkpoint", CheckpointOptions, values)


def pipeline(stages: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> Callable[[type[T]], type[T]]:
    """Server-side stages run after ``$changeStream`` (filtering events costs no round trip).

    Only stages MongoDB allows in a change stream are accepted, and none may remove or rewrite
    ``_id``: it is the resume token. Events the pipeline filters out still move the stream's
    last-seen position, so a restart does not rescan them.
    """
    if isinstance(stages, type):
        raise ConfigurationError(
            "@pipeline needs its stages: @pipeline([{'$match': {...}}])",
            owner=stages.__qualname__,
            option="stages",
            value=None,
            allowed=PipelineOptions.allowed["stages"],
        )
    values = {"stages": stages}
    return lambda cls: _attach(cls, _PIPELINE_ATTR, "pipeline", PipelineOptions, values)


@overload
def retry_policy(max_attempts: type[T], /) -> type[T]: ...
@overload
def retry_policy(
    max_attempts: int = 3,
    initial_delay_seconds: float = 0.5,
    multiplier: float = 2.0,
    max_delay_seconds: float = 30,
    jitter: float = 0.2,
    retry_on: type[Exception] | tuple[type[Exception], ...] = (Exception,),
    no_retry_on: type[Exception] | tuple[type[Exception], ...] = (),
    on_exhausted: OnError | str = OnError.STOP,
) -> Callable[[type[T]], type[T]]: ...
def retry_policy(
    max_attempts: Any = 3,
    initial_delay_seconds: float = 0.5,
    multiplier: float = 2.0,
    max_delay_seconds: float = 30,
    jitter: float = 0.2,
    retry_on: type[Exception] | tuple[type[Exception], ...] = (Exception,),
    no_retry_on: type[Exception] | tuple[type[Exception], ...] = (),
    on_exhausted: OnError | str = OnError.STOP,
) -> Any:
    """How a failing handler is retried for one event, then what happens to the event.

    ``max_attempts`` counts every call, the first included. Errors in ``no_retry_on`` or not in
    ``retry_on`` go to ``on_exhausted`` at once: STOP (the stream fails, its checkpoint stays
    before the event), SKIP (log and move on) or DEAD_LETTER (store it, then move on).
    """
    if isinstance(max_attempts, type):
        return _attach(max_attempts, _RETRY_ATTR, "retry_policy", RetryPolicy, {})
    values = {
        "max_attempts": max_attempts,
        "initial_delay_seconds": initial_delay_seconds,
        "multiplier": multiplier,
        "max_delay_seconds": max_delay_seconds,
        "jitter": jitter,
        "retry_on": retry_on,
        "no_retry_on": no_retry_on,
        "on_exhausted": on_exhausted,
    }
    return lambda cls: _attach(cls, _RETRY_ATTR, "retry_policy", RetryPolicy, values)


@overload
def dead_letter_queue(retention_days: type[T], /) -> type[T]: ...
@overload
def dead_letter_queue(
    retention_days: int = 30, collection: str = "_fw_dlq", database: str | None = None
) -> Callable[[type[T]], type[T]]: ...
def dead_letter_queue(
    retention_days: Any = 30, collection: str = "_fw_dlq", database: str | None = None
) -> Any:
    """Where events that exhausted their retries are kept (with on_exhausted=DEAD_LETTER).

    Entries expire ``retention_days`` after they failed. If writing the entry fails, the
    checkpoint stays before the event.
    """
    if isinstance(retention_days, type):
        return _attach(retention_days, _DEAD_LETTER_ATTR, "dead_letter_queue", DeadLetterOptions, {})
    values = {"retention_days": retention_days, "collection": collection, "database": database}
    return lambda cls: _attach(cls, _DEAD_LETTER_ATTR, "dead_letter_queue", DeadLetterOptions, values)


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
    cached = vars(handler_class).get(_SPEC_ATTR)
    if isinstance(cached, StreamSpec) and cached.handler_class is handler_class:
        return cached
    spec = _build_spec(handler_class)
    setattr(handler_class, _SPEC_ATTR, spec)
    return spec


def _handler_marks(cls: type) -> list[tuple[str, _HandlerMark]]:
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            names.update(dict.fromkeys(vars(klass)))
    marks = []
    for name in names:
        # The attribute as the class resolves it: an undecorated override drops a base handler.
        attribute = inspect.getattr_static(cls, name)
        if isinstance(attribute, (staticmethod, classmethod)) and isinstance(
            getattr(attribute.__func__, _MARK_ATTR, None), _HandlerMark
        ):
            raise ConfigurationError(
                f"handler {name!r} is a {type(attribute).__name__}; handlers are instance methods",
                owner=cls.__qualname__,
                option=getattr(attribute.__func__, _MARK_ATTR).decorators[0],
                value=name,
                allowed="def name(self, event, ctx=None) or async def",
            )
        mark = getattr(attribute, _MARK_ATTR, None)
        if isinstance(mark, _HandlerMark):
            marks.append((name, mark))
    return marks


def _describe(name: str, mark: _HandlerMark) -> str:
    return f"{name!r} (@{', @'.join(mark.decorators)})"


def _build_spec(cls: type) -> StreamSpec:
    owner = cls.__qualname__
    marks = _handler_marks(cls)
    stream: ChangeStreamOptions | None = getattr(cls, _STREAM_ATTR, None)
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

    retry = getattr(cls, _RETRY_ATTR, None) or RetryPolicy()
    dead_letter: DeadLetterOptions | None = getattr(cls, _DEAD_LETTER_ATTR, None)
    if dead_letter is None and retry.on_exhausted is OnError.DEAD_LETTER:
        dead_letter = DeadLetterOptions()
    pipeline_options: PipelineOptions | None = getattr(cls, _PIPELINE_ATTR, None)
    stages: list[dict[str, Any]] = []
    type_stage = stream.operation_type_stage()
    if type_stage is not None:
        stages.append(type_stage)
    if pipeline_options is not None:
        stages.extend(pipeline_options.stages)

    batch: BatchHandler | None = None
    dataframe: DataFrameHandler | None = None
    handlers: dict[str, HandlerMethod] = {}
    fallback: HandlerMethod | None = None
    if batch_marks:
        name, mark = batch_marks[0]
        options = mark.options
        assert options is not None
        if isinstance(options, DataFrameOptions):
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
        checkpoint=getattr(cls, _CHECKPOINT_ATTR, None) or CheckpointOptions(),
        pipeline=tuple(stages),
        retry=retry,
        dead_letter=dead_letter,
        event_handlers=MappingProxyType(handlers),
        fallback=fallback,
        batch=batch,
        dataframe=dataframe,
    )


def _event_dispatch(
    owner: str,
    stream: ChangeStreamOptions,
    pipeline_options: PipelineOptions | None,
    event_marks: list[tuple[str, _HandlerMark]],
) -> tuple[HandlerMethod | None, dict[str, HandlerMethod]]:
    claimed: dict[str, tuple[str, _HandlerMark]] = {}
    fallback: tuple[str, _HandlerMark] | None = None
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

    if stream.operation_types is not None:
        passed = set(stream.operation_types) | {"invalidate"}
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

    def method(name: str, mark: _HandlerMark) -> HandlerMethod:
        return HandlerMethod(name, mark.is_async, mark.wants_ctx, "event", mark.operation_types)

    methods = {name: method(name, mark) for name, mark in event_marks}
    handlers = {operation_type: methods[name] for operation_type, (name, _) in claimed.items()}
    fallback_method = methods[fallback[0]] if fallback is not None else None
    if fallback_method is not None:
        handlers["*"] = fallback_method
    return fallback_method, handlers


__all__ = [
    "BatchHandler",
    "DataFrameHandler",
    "HandlerMethod",
    "StreamSpec",
    "change_stream",
    "checkpoint",
    "dead_letter_queue",
    "on_batch",
    "on_change",
    "on_dataframe",
    "on_delete",
    "on_insert",
    "on_replace",
    "on_update",
    "pipeline",
    "retry_policy",
    "stream_spec",
]
