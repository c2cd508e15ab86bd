"""Decorators that turn a class into a change-stream handler.

Class decorators (``@change_stream``, ``@checkpoint``, ``@pipeline``, ``@retry_policy``,
``@dead_letter_queue``) validate their options once, when applied, and store the frozen model on
the class; they stack in any order. Method decorators (``@on_insert`` ... ``@on_dataframe``) mark a
method and record, once, whether it is async and whether it takes a ``ctx`` parameter;
``@event_filter`` marks the one sync method that chooses the events they get.

Every decorator that takes options is written out with them as typed parameters, so type
checkers, IDEs and the API reference see each option; the option models of
:mod:`flowwarden.config` stay the one place their values are checked, and a test holds each
signature to its model (names, defaults, types). The runtime reads a class only through
:func:`flowwarden.config.spec.stream_spec`. Nothing in this module runs per event, and it never
imports the runtime, the checkpoint stores or pyspark.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from bson import Timestamp
from pydantic import BaseModel

from flowwarden.config import (
    BatchOptions,
    ChangeStreamOptions,
    CheckpointOptions,
    DataFrameOptions,
    DeadLetterOptions,
    Deployment,
    OnError,
    OnHistoryLost,
    OnInvalidate,
    OperationType,
    Options,
    PipelineOptions,
    RetryPolicy,
    SchemaMode,
    Snapshot,
    StartPosition,
    validate_options,
)
from flowwarden.config.base import unknown_option_error
from flowwarden.config.spec import (
    CHECKPOINT_ATTR,
    DEAD_LETTER_ATTR,
    FILTER_ATTR,
    MARK_ATTR,
    PIPELINE_ATTR,
    RETRY_ATTR,
    SPEC_ATTR,
    STREAM_ATTR,
    BatchHandler,
    DataFrameHandler,
    HandlerKind,
    HandlerMark,
    HandlerMethod,
    StreamSpec,
    build_spec,
    stream_spec,
)
from flowwarden.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from flowwarden.checkpoints.store import AsyncCheckpointStore, CheckpointStore

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# ----------------------------------------------------------------------------------------------
# Method decorators


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
    if getattr(func, FILTER_ATTR, False):
        raise ConfigurationError(
            f"method {_method_name(func)!r} is both @event_filter and @{decorator}; a filter decides "
            "which events the handler methods get, it handles none",
            owner=_owner_of(func),
            option=decorator,
            value=func,
            allowed="@event_filter and handler decorators on different methods",
        )
    previous = getattr(func, MARK_ATTR, None)
    if isinstance(previous, HandlerMark):
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
    mark = HandlerMark(kind, decorators, operation_types, is_async, wants_ctx, options)
    setattr(func, MARK_ATTR, mark)
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
def on_snapshot(func: F, /) -> F: ...
@overload
def on_snapshot() -> Callable[[F], F]: ...
def on_snapshot(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle the rows of the initial snapshot (``@change_stream(snapshot=...)``): ``(self, event:
    ChangeEvent[, ctx: StreamContext])`` with ``event.operation_type == "snapshot"`` and the
    existing document as ``event.full_document``. Without it they go to ``@on_insert``, else
    ``@on_change``."""
    return _event_handler(func, "on_snapshot", ("snapshot",))


@overload
def on_change(func: F, /) -> F: ...
@overload
def on_change() -> Callable[[F], F]: ...
def on_change(func: F | None = None, /) -> F | Callable[[F], F]:
    """Handle every operation type that no ``@on_insert``/``update``/``replace``/``delete``
    method of the class claims (drop, rename, invalidate ... included)."""
    return _event_handler(func, "on_change", None)


def _mark_filter(func: F) -> F:
    shape = "def name(self, event) -> bool (a plain def: it runs on the read loop)"
    _inspect_handler(func, "event_filter", "event")
    name = _method_name(func)
    owner = _owner_of(func)
    unwrapped = inspect.unwrap(func)
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(unwrapped):
        raise ConfigurationError(
            f"@event_filter method {name!r} is async; a filter runs on the read loop for every "
            "event, so it is a plain def that decides from the event alone",
            owner=owner,
            option="event_filter",
            value=func,
            allowed=shape,
        )
    try:
        inspect.signature(func).bind(None, None)
    except TypeError:
        raise ConfigurationError(
            f"@event_filter method {name}{inspect.signature(func)} cannot be called as (self, event)",
            owner=owner,
            option="event_filter",
            value=func,
            allowed=shape,
        ) from None
    if isinstance(getattr(func, MARK_ATTR, None), HandlerMark):
        raise ConfigurationError(
            f"method {name!r} is both @event_filter and @{', @'.join(getattr(func, MARK_ATTR).decorators)}; "
            "a filter decides which events the handler methods get, it handles none",
            owner=owner,
            option="event_filter",
            value=func,
            allowed=shape,
        )
    setattr(func, FILTER_ATTR, True)
    return func


@overload
def event_filter(func: F, /) -> F: ...
@overload
def event_filter() -> Callable[[F], F]: ...
def event_filter(func: F | None = None, /) -> F | Callable[[F], F]:
    """Choose the events the methods get: ``def keep(self, event: ChangeEvent) -> bool``.

    Called for every event, before any method (and for every row of the initial snapshot, as
    ``operation_type == "snapshot"``). An event it returns false for reaches no method and no
    batch, and completes as if it were handled: the checkpoint moves past it, in stream order,
    and it counts as ``filtered``. The filter runs on the stream's read loop, so it must be
    cheap: a plain ``def`` (not async) deciding from the event alone, with no I/O. An error it
    raises is a handler failure: retried under ``@retry_policy``, then ``on_exhausted``. One
    per class; it handles no event itself.
    """
    if func is None:
        return _mark_filter
    return _mark_filter(func)


# ----------------------------------------------------------------------------------------------
# Decorators that take options
#
# Each is written out with its options as typed parameters (the ones DESIGN.md names by
# position, the rest keyword-only) and a docstring describing them: that is what type checkers,
# IDEs, help() and the API reference read. The option model behind each stays the one place
# values are checked; tests/config/test_decorator_signatures.py holds every signature to its model.


def _target_name(target: Any) -> str:
    return str(getattr(target, "__qualname__", None) or repr(target))


def _decoratable(value: Any) -> bool:
    # A class, a function, or a static/class method the method decorators refuse by name: what a
    # decorator applied bare receives. An option value is none of these.
    return callable(value) or isinstance(value, (staticmethod, classmethod))


def _call_problem(
    model: type[Options], positional: list[str], args: tuple[Any, ...], options: Mapping[str, Any]
) -> Callable[..., ConfigurationError] | None:
    """What is wrong with how a decorator was called, as the error to raise (given ``owner=``,
    the class or method it is applied to); None when the call fits the written signature."""
    decorator = model.decorator
    names = model.option_names()
    if len(args) > len(positional):
        if positional:
            message = (
                f"@{decorator} takes at most {len(positional)} options by position "
                f"({', '.join(positional)}); give the others by name"
            )
        else:
            message = (
                f"@{decorator} takes its options by name, e.g. @{decorator}({names[0]}=...), "
                f"not {len(args)} value(s) by position"
            )
        by_name = ", ".join(f"{name}=" for name in names)
        return functools.partial(ConfigurationError, message, option=decorator, value=args, allowed=by_name)
    for name, value in zip(positional, args, strict=False):
        if name in options:
            return functools.partial(
                ConfigurationError,
                f"@{decorator} got {name} both by position and by name",
                option=name,
                value=(value, options[name]),
                allowed="one of the two",
            )
    for name, value in options.items():
        if name not in names:
            return functools.partial(unknown_option_error, model, option=name, value=value)
    return None


def _options_decorator(model: type[Options]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make the decorator written below it callable the ways users call it.

    Applied bare (``@checkpoint``, ``@on_batch``), it takes every default. A misspelt option, a
    value given by position where only names are taken, or one given both ways does not raise
    Python's TypeError at the call, which could name neither the class nor the option meant:
    the decorator returned raises a ConfigurationError naming them once it is applied (a type
    checker reports the call before it runs). ``inspect.signature`` and ``help()`` show the
    written signature.
    """

    def wrap(declared: Callable[..., Any]) -> Callable[..., Any]:
        parameters = inspect.signature(declared).parameters.values()
        positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]

        @functools.wraps(declared)
        def called(*args: Any, **options: Any) -> Any:
            if len(args) == 1 and not options and _decoratable(args[0]):
                return declared()(args[0])
            problem = _call_problem(model, positional, args, options)
            if problem is None:
                return declared(*args, **options)

            def refuse(target: Any) -> Any:
                raise problem(owner=_target_name(target))

            return refuse

        return called

    return wrap


def _method_options(
    model: type[BatchOptions], kind: HandlerKind, values: Mapping[str, Any]
) -> Callable[[F], F]:
    def apply(target: F) -> F:
        options = validate_options(model, f"{_owner_of(target)}.{_method_name(target)}", values)
        return _mark(target, model.decorator, kind, None, options)

    return apply


@overload
def on_batch(func: F, /) -> F: ...
@overload
def on_batch(*, max_events: int = 1000, max_wait_seconds: float = 1.0) -> Callable[[F], F]: ...
@_options_decorator(BatchOptions)
def on_batch(*, max_events: int = 1000, max_wait_seconds: float = 1.0) -> Callable[[F], F]:
    """Handle events in batches: ``(self, events: list[ChangeEvent][, ctx: StreamContext])``.

    Its events complete together: the checkpoint moves past the batch only when the method
    returned. A class with ``@on_batch`` has no other handler method. Bare ``@on_batch`` takes
    the defaults.

    :param max_events: A batch is handed over once it holds this many events.
    :param max_wait_seconds: ...or once its first event has waited this long.
    """
    # locals() is the options as called, defaults included: nothing else is bound yet.
    return _method_options(BatchOptions, "batch", locals())


@overload
def on_dataframe(func: F, /) -> F: ...
@overload
def on_dataframe(
    *,
    max_events: int = 10_000,
    max_wait_seconds: float = 2.0,
    schema: type[BaseModel] | StructType | Literal["infer"] | None = None,
    mode: SchemaMode | Literal["PERMISSIVE", "DROPMALFORMED", "FAILFAST"] = SchemaMode.PERMISSIVE,
    sample_size: int = 1000,
    schema_hints: str | StructType | None = None,
) -> Callable[[F], F]: ...
@_options_decorator(DataFrameOptions)
def on_dataframe(
    *,
    max_events: int = 10_000,
    max_wait_seconds: float = 2.0,
    schema: type[BaseModel] | StructType | Literal["infer"] | None = None,
    mode: SchemaMode | Literal["PERMISSIVE", "DROPMALFORMED", "FAILFAST"] = SchemaMode.PERMISSIVE,
    sample_size: int = 1000,
    schema_hints: str | StructType | None = None,
) -> Callable[[F], F]:
    """Handle batches as Spark DataFrames: ``(self, df[, ctx: StreamContext])``.

    pyspark is not imported here. A class with ``@on_dataframe`` has no other handler method.
    Bare ``@on_dataframe`` takes the defaults.

    :param max_events: A batch is handed over once it holds this many events.
    :param max_wait_seconds: ...or once its first event has waited this long.
    :param schema: Types full_document: a pydantic model class or a StructType; 'infer': inferred from a
        sample of the collection at start, with _rescued_data; None: extended JSON strings.
    :param mode: What a document that does not fit the schema does to its row.
    :param sample_size: With schema='infer': how many documents $sample draws to infer the schema.
    :param schema_hints: With schema='infer': types that override what sampling found, as a DDL field
        list whose names may be dotted paths ('qty BIGINT, addr.zip STRING') or a StructType.
    """
    return _method_options(DataFrameOptions, "dataframe", locals())


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
    if SPEC_ATTR in vars(cls):
        delattr(cls, SPEC_ATTR)
    if getattr(cls, STREAM_ATTR, None) is not None:
        setattr(cls, SPEC_ATTR, build_spec(cls))


def _class_options(
    model: type[Options], attribute: str, values: Mapping[str, Any]
) -> Callable[[type[T]], type[T]]:
    return lambda cls: _attach(cls, attribute, model.decorator, model, values)


@overload
def change_stream(cls: type[T], /) -> type[T]: ...
@overload
def change_stream(
    collection: str | None = None,
    database: str | None = None,
    *,
    name: str | None = None,
    full_document: Literal["default", "updateLookup", "whenAvailable", "required"] = "default",
    full_document_before_change: Literal["off", "whenAvailable", "required"] = "off",
    operation_types: Iterable[OperationType] | None = None,
    batch_size: int | None = None,
    max_await_time_ms: int = 1000,
    max_concurrency: int = 1,
    deployment: Deployment | Literal["all_instances", "single_leader"] = Deployment.ALL_INSTANCES,
    on_invalidate: OnInvalidate | Literal["stop", "restart"] = OnInvalidate.STOP,
    lease_ttl_seconds: float = 30.0,
    restart_initial_delay_seconds: float = 1.0,
    restart_max_delay_seconds: float = 60.0,
    max_restarts: int | None = 10,
    show_expanded_events: bool = False,
    partitions: int = 1,
    snapshot: Snapshot | Literal["NEVER", "INITIAL", "INITIAL_ONLY", "WHEN_NEEDED"] = Snapshot.NEVER,
    snapshot_chunk_size: int = 1000,
    split_large_events: bool = False,
    collections: Iterable[str] | None = None,
    exclude_collections: Iterable[str] = (),
    exclude_fields: Iterable[str] = (),
    hash_fields: Iterable[str] = (),
    hash_salt_env: str | None = None,
) -> Callable[[type[T]], type[T]]: ...
@_options_decorator(ChangeStreamOptions)
def change_stream(
    collection: str | None = None,
    database: str | None = None,
    *,
    name: str | None = None,
    full_document: Literal["default", "updateLookup", "whenAvailable", "required"] = "default",
    full_document_before_change: Literal["off", "whenAvailable", "required"] = "off",
    operation_types: Iterable[OperationType] | None = None,
    batch_size: int | None = None,
    max_await_time_ms: int = 1000,
    max_concurrency: int = 1,
    deployment: Deployment | Literal["all_instances", "single_leader"] = Deployment.ALL_INSTANCES,
    on_invalidate: OnInvalidate | Literal["stop", "restart"] = OnInvalidate.STOP,
    lease_ttl_seconds: float = 30.0,
    restart_initial_delay_seconds: float = 1.0,
    restart_max_delay_seconds: float = 60.0,
    max_restarts: int | None = 10,
    show_expanded_events: bool = False,
    partitions: int = 1,
    snapshot: Snapshot | Literal["NEVER", "INITIAL", "INITIAL_ONLY", "WHEN_NEEDED"] = Snapshot.NEVER,
    snapshot_chunk_size: int = 1000,
    split_large_events: bool = False,
    collections: Iterable[str] | None = None,
    exclude_collections: Iterable[str] = (),
    exclude_fields: Iterable[str] = (),
    hash_fields: Iterable[str] = (),
    hash_salt_env: str | None = None,
) -> Callable[[type[T]], type[T]]:
    """Make a class a change-stream handler.

    ``collection`` and ``database``: watch one collection; only ``database``: one database;
    neither (or bare ``@change_stream``): the whole cluster. Renaming a class without ``name=``
    starts a new checkpoint. After an error a re-open may fix, the stream re-opens from its
    checkpoint with backoff: for as long as it takes after transient errors, at most
    ``max_restarts`` times in a row after errors not known to be transient. Errors no re-open can
    fix fail the stream at once.

    :param collection: The collection to watch (with database); None watches a whole database or the cluster.
    :param database: The database to watch; None (and no collection) watches the whole cluster.
    :param name: The stream's name, which keys its checkpoint and lease; None uses the class name.
    :param full_document: Whether update events carry the document as it is now (updateLookup) or not.
    :param full_document_before_change: Whether events carry the document as it was before the
        change (pre-images).
    :param operation_types: Only these operation types are delivered, filtered by the server;
        invalidate always passes.
    :param batch_size: Events per server batch; None leaves it to the server.
    :param max_await_time_ms: How long the server waits for new events before it answers an empty batch.
    :param max_concurrency: Handler calls running at once; events of one document key always run in order.
    :param deployment: single_leader: one instance at a time handles the stream, through a lease.
    :param on_invalidate: What the stream does after its collection or database was dropped or renamed.
    :param lease_ttl_seconds: How long a single_leader lease lasts without renewal.
    :param restart_initial_delay_seconds: The first wait before a re-open after an error; it doubles
        each time.
    :param restart_max_delay_seconds: The longest wait between re-opens.
    :param max_restarts: Re-opens in a row after errors not known to be transient before the stream fails.
    :param show_expanded_events: Also deliver DDL events (create, createIndexes, modify...), MongoDB 6.0+.
    :param partitions: More than 1 reads the stream as that many streams, each the hash bucket of
        documentKey._id the server filters, run side by side with checkpoints of their own (MongoDB 7.0+).
    :param snapshot: Copy the documents that already exist before (or instead of) streaming their
        changes; rows reach the methods as operation_type 'snapshot'.
    :param snapshot_chunk_size: Documents the initial snapshot reads at a time (at most max_events
        for @on_batch and @on_dataframe: a chunk is one batch); each chunk is stored before it is
        handed over and again once it was handled.
    :param split_large_events: Add $changeStreamSplitLargeEvent and join the fragments of events
        over 16 MB into one event before any method sees it (MongoDB 7.0+).
    :param collections: Database and cluster streams: only these collections, by name or 're:'
        pattern matching the whole name (cluster streams name them db.coll), filtered by the server
        and by the snapshot; None: all.
    :param exclude_collections: Database and cluster streams: leave out these collections, names or
        're:' patterns as for collections.
    :param exclude_fields: Dotted paths under the document the server removes from every event and
        snapshot row (full documents, pre-images, update descriptions).
    :param hash_fields: Dotted paths under the document whose values reach the methods as the hex
        SHA-256 of the salt followed by the value (needs hash_salt_env).
    :param hash_salt_env: The environment variable holding the salt of hash_fields; it must be set
        when the stream starts.
    """
    return _class_options(ChangeStreamOptions, STREAM_ATTR, locals())


@overload
def checkpoint(cls: type[T], /) -> type[T]: ...
@overload
def checkpoint(
    *,
    save_every_n: int = 1,
    save_interval_seconds: float = 5.0,
    start_position: StartPosition | Literal["RESUME", "LATEST", "EARLIEST", "AT_TIME"] = StartPosition.RESUME,
    start_at: datetime | Timestamp | None = None,
    on_history_lost: OnHistoryLost
    | Literal["FAIL", "RESUME_FROM_OPLOG_START", "RESUME_FROM_NOW"] = OnHistoryLost.FAIL,
    store: CheckpointStore | AsyncCheckpointStore | None = None,
) -> Callable[[type[T]], type[T]]: ...
@_options_decorator(CheckpointOptions)
def checkpoint(
    *,
    save_every_n: int = 1,
    save_interval_seconds: float = 5.0,
    start_position: StartPosition | Literal["RESUME", "LATEST", "EARLIEST", "AT_TIME"] = StartPosition.RESUME,
    start_at: datetime | Timestamp | None = None,
    on_history_lost: OnHistoryLost
    | Literal["FAIL", "RESUME_FROM_OPLOG_START", "RESUME_FROM_NOW"] = OnHistoryLost.FAIL,
    store: CheckpointStore | AsyncCheckpointStore | None = None,
) -> Callable[[type[T]], type[T]]:
    """How the stream's position is saved and where it starts.

    A save happens every ``save_every_n`` completed events or ``save_interval_seconds``, whichever
    comes first, and never past an event still in flight. A class without ``@checkpoint`` gets
    these defaults, as does bare ``@checkpoint``.

    :param save_every_n: Save the position after this many handled events (the commit waits for
        it); 0: never by count.
    :param save_interval_seconds: Save the position (and the last seen token) this often; 0: never by time.
    :param start_position: Where a stream with no stored position starts (LATEST: even with one).
    :param start_at: With start_position=AT_TIME: the cluster time to start at.
    :param on_history_lost: What happens when the stored position has left the oplog.
    :param store: The checkpoint store; None uses the connector's (by default the _fw_checkpoints collection).
    """
    return _class_options(CheckpointOptions, CHECKPOINT_ATTR, locals())


def pipeline(stages: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> Callable[[type[T]], type[T]]:
    """Server-side stages run after ``$changeStream`` (filtering events costs no round trip).

    Only stages MongoDB allows in a change stream are accepted, and none may remove or rewrite
    ``_id``: it is the resume token. Events the pipeline filters out still move the stream's
    last-seen position, so a restart does not rescan them.

    :param stages: Stages the server runs after $changeStream, e.g. [{'$match': {...}}].
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
    return lambda cls: _attach(cls, PIPELINE_ATTR, "pipeline", PipelineOptions, values)


@overload
def retry_policy(cls: type[T], /) -> type[T]: ...
@overload
def retry_policy(
    *,
    max_attempts: int = 3,
    initial_delay_seconds: float = 0.5,
    multiplier: float = 2.0,
    max_delay_seconds: float = 30.0,
    jitter: float = 0.2,
    retry_on: type[Exception] | Iterable[type[Exception]] = (Exception,),
    no_retry_on: type[Exception] | Iterable[type[Exception]] = (),
    on_exhausted: OnError | Literal["STOP", "SKIP", "DEAD_LETTER"] = OnError.STOP,
) -> Callable[[type[T]], type[T]]: ...
@_options_decorator(RetryPolicy)
def retry_policy(
    *,
    max_attempts: int = 3,
    initial_delay_seconds: float = 0.5,
    multiplier: float = 2.0,
    max_delay_seconds: float = 30.0,
    jitter: float = 0.2,
    retry_on: type[Exception] | Iterable[type[Exception]] = (Exception,),
    no_retry_on: type[Exception] | Iterable[type[Exception]] = (),
    on_exhausted: OnError | Literal["STOP", "SKIP", "DEAD_LETTER"] = OnError.STOP,
) -> Callable[[type[T]], type[T]]:
    """How a failing handler is retried for one event, then what happens to the event.

    Errors in ``no_retry_on`` or not in ``retry_on`` go to ``on_exhausted`` at once: STOP (the
    stream fails, its checkpoint stays before the event), SKIP (log and move on) or DEAD_LETTER
    (store it, then move on). A class without ``@retry_policy`` gets these defaults, as does
    bare ``@retry_policy``.

    :param max_attempts: Calls of the handler for one event, the first included.
    :param initial_delay_seconds: The wait after the first failed call.
    :param multiplier: Each later wait is the one before times this.
    :param max_delay_seconds: The longest wait between calls.
    :param jitter: Each wait is spread by up to this fraction of itself, either way.
    :param retry_on: Errors that are retried.
    :param no_retry_on: Errors that are never retried, even when retry_on names them.
    :param on_exhausted: What happens to the event when its calls are used up: STOP, SKIP or DEAD_LETTER.
    """
    return _class_options(RetryPolicy, RETRY_ATTR, locals())


@overload
def dead_letter_queue(cls: type[T], /) -> type[T]: ...
@overload
def dead_letter_queue(
    *, retention_days: int = 30, collection: str = "_fw_dlq", database: str | None = None
) -> Callable[[type[T]], type[T]]: ...
@_options_decorator(DeadLetterOptions)
def dead_letter_queue(
    *, retention_days: int = 30, collection: str = "_fw_dlq", database: str | None = None
) -> Callable[[type[T]], type[T]]:
    """Where events that exhausted their retries are kept (with on_exhausted=DEAD_LETTER).

    If writing the entry fails, the checkpoint stays before the event. Bare
    ``@dead_letter_queue`` takes the defaults.

    :param retention_days: Days a dead letter is kept (a TTL index expires it).
    :param collection: The collection dead letters are written to.
    :param database: The database of that collection; None: the stream's (the checkpoint database
        for cluster streams).
    """
    return _class_options(DeadLetterOptions, DEAD_LETTER_ATTR, locals())


__all__ = [
    "BatchHandler",
    "DataFrameHandler",
    "HandlerMethod",
    "StreamSpec",
    "change_stream",
    "checkpoint",
    "dead_letter_queue",
    "event_filter",
    "on_batch",
    "on_change",
    "on_dataframe",
    "on_delete",
    "on_insert",
    "on_replace",
    "on_snapshot",
    "on_update",
    "pipeline",
    "retry_policy",
    "stream_spec",
]
