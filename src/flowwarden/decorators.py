"""Decorators that turn a class into a change-stream handler.

Class decorators (``@change_stream``, ``@checkpoint``, ``@pipeline``, ``@retry_policy``,
``@dead_letter_queue``) validate their options once, when applied, and store the frozen model on
the class; they stack in any order. Method decorators (``@on_insert`` ... ``@on_dataframe``) mark a
method and record, once, whether it is async and whether it takes a ``ctx`` parameter.

The option models of :mod:`flowwarden.config` are the one declaration of every option: the
decorators that take options are built from them (:func:`_class_decorator`,
:func:`_method_decorator`), signature and docstring included. The runtime reads a class only
through :func:`flowwarden.config.spec.stream_spec`. Nothing in this module runs per event, and it never
imports the runtime, the checkpoint stores or pyspark.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Protocol, TypeVar, cast, overload

from flowwarden.config import (
    BatchOptions,
    ChangeStreamOptions,
    CheckpointOptions,
    DataFrameOptions,
    DeadLetterOptions,
    Options,
    PipelineOptions,
    RetryPolicy,
    validate_options,
)
from flowwarden.config.spec import (
    CHECKPOINT_ATTR,
    DEAD_LETTER_ATTR,
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


class ClassDecorator(Protocol):
    """A class decorator built from an option model: bare, or called with options first.

    Options are checked when the decorator is applied (against the model, with a
    ConfigurationError naming what is wrong), not by the type checker; the decorated class keeps
    its type either way.
    """

    @overload
    def __call__(self, cls: type[T], /) -> type[T]: ...
    @overload
    def __call__(self, *args: Any, **options: Any) -> Callable[[type[T]], type[T]]: ...


class MethodDecorator(Protocol):
    """A handler-method decorator built from an option model: bare, or called with options."""

    @overload
    def __call__(self, func: F, /) -> F: ...
    @overload
    def __call__(self, /, **options: Any) -> Callable[[F], F]: ...


def _signature(model: type[Options], *, positional: int, first: str | None = None) -> inspect.Signature:
    """The signature a decorator shows (``help()``, ``inspect``): the model's options with their
    defaults, the first ``positional`` also by position."""
    parameters = []
    if first is not None:
        parameters.append(inspect.Parameter(first, inspect.Parameter.POSITIONAL_ONLY, default=None))
    for index, name in enumerate(model.option_names()):
        field = model.option_field(name)
        kind = (
            inspect.Parameter.POSITIONAL_OR_KEYWORD if index < positional else inspect.Parameter.KEYWORD_ONLY
        )
        parameters.append(inspect.Parameter(name, kind, default=field.default))
    return inspect.Signature(parameters)


def _describe_decorator(
    function: Callable[..., Any], model: type[Options], summary: str, signature: inspect.Signature
) -> Callable[..., Any]:
    """Name, signature and docstring of a decorator, the option list written from ``model``."""
    lines = [inspect.cleandoc(summary), "", "Options:", ""]
    for name in model.option_names():
        field = model.option_field(name)
        default = field.default.value if isinstance(field.default, Enum) else field.default
        lines.append(f"- ``{name}`` (default ``{default!r}``; {model.allowed[name]}): {field.description}")
    function.__name__ = function.__qualname__ = model.decorator
    function.__doc__ = "\n".join(lines)
    function.__signature__ = signature  # type: ignore[attr-defined]
    return function


def _method_decorator(model: type[BatchOptions], kind: HandlerKind, summary: str) -> MethodDecorator:
    """A method decorator whose keyword options are ``model``'s fields (see :func:`_signature`)."""
    decorator = model.decorator

    def apply_options(func: Any = None, /, **options: Any) -> Any:
        if func is not None and not callable(func):
            raise ConfigurationError(
                f"@{decorator} takes keyword options only, got the positional value {func!r}",
                owner="handler class",
                option=decorator,
                value=func,
                allowed=", ".join(f"{name}=" for name in model.option_names()),
            )

        def apply(target: F) -> F:
            values = validate_options(model, f"{_owner_of(target)}.{_method_name(target)}", options)
            return _mark(target, decorator, kind, None, values)

        return apply(func) if func is not None else apply

    signature = _signature(model, positional=0, first="func")
    return cast(MethodDecorator, _describe_decorator(apply_options, model, summary, signature))


on_batch = _method_decorator(
    BatchOptions,
    "batch",
    """Handle events in batches: ``(self, events: list[ChangeEvent][, ctx: StreamContext])``.

    Its events complete together: the checkpoint moves past the batch only when the method
    returned. A class with ``@on_batch`` has no other handler method.""",
)

on_dataframe = _method_decorator(
    DataFrameOptions,
    "dataframe",
    """Handle batches as Spark DataFrames: ``(self, df[, ctx: StreamContext])``.

    pyspark is not imported here. A class with ``@on_dataframe`` has no other handler method.""",
)


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


def _class_decorator(
    model: type[Options], attribute: str, *, positional: int, summary: str
) -> ClassDecorator:
    """A class decorator whose options are ``model``'s fields, the first ``positional`` of them
    also by position; applied bare (``@checkpoint``), it takes every default."""
    decorator = model.decorator
    names = model.option_names()

    def apply_options(*args: Any, **options: Any) -> Any:
        if len(args) == 1 and not options and isinstance(args[0], type):
            return _attach(args[0], attribute, decorator, model, {})
        if len(args) > positional:
            raise ConfigurationError(
                f"@{decorator} takes at most {positional} options by position "
                f"({', '.join(names[:positional])}); give the others by name",
                owner="handler class",
                option=decorator,
                value=args,
                allowed=", ".join(f"{name}=" for name in names),
            )
        values = dict(zip(names, args, strict=False))
        for name in values.keys() & options.keys():
            raise ConfigurationError(
                f"@{decorator} got {name} both by position and by name",
                owner="handler class",
                option=name,
                value=(values[name], options[name]),
                allowed="one of the two",
            )
        values.update(options)
        return lambda cls: _attach(cls, attribute, decorator, model, values)

    described = _describe_decorator(apply_options, model, summary, _signature(model, positional=positional))
    return cast(ClassDecorator, described)


change_stream = _class_decorator(
    ChangeStreamOptions,
    STREAM_ATTR,
    positional=2,
    summary="""Make a class a change-stream handler.

    ``collection`` and ``database``: watch one collection; only ``database``: one database;
    neither (or bare ``@change_stream``): the whole cluster. Renaming a class without ``name=``
    starts a new checkpoint. After an error a re-open may fix, the stream re-opens from its
    checkpoint with backoff: for as long as it takes after transient errors, at most
    ``max_restarts`` times in a row after errors not known to be transient. Errors no re-open can
    fix fail the stream at once.""",
)

checkpoint = _class_decorator(
    CheckpointOptions,
    CHECKPOINT_ATTR,
    positional=len(CheckpointOptions.model_fields),
    summary="""How the stream's position is saved and where it starts.

    A save happens every ``save_every_n`` completed events or ``save_interval_seconds``, whichever
    comes first, and never past an event still in flight. A class without ``@checkpoint`` gets
    these defaults.""",
)


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
    return lambda cls: _attach(cls, PIPELINE_ATTR, "pipeline", PipelineOptions, values)


retry_policy = _class_decorator(
    RetryPolicy,
    RETRY_ATTR,
    positional=len(RetryPolicy.model_fields),
    summary="""How a failing handler is retried for one event, then what happens to the event.

    Errors in ``no_retry_on`` or not in ``retry_on`` go to ``on_exhausted`` at once: STOP (the
    stream fails, its checkpoint stays before the event), SKIP (log and move on) or DEAD_LETTER
    (store it, then move on).""",
)

dead_letter_queue = _class_decorator(
    DeadLetterOptions,
    DEAD_LETTER_ATTR,
    positional=len(DeadLetterOptions.model_fields),
    summary="""Where events that exhausted their retries are kept (with on_exhausted=DEAD_LETTER).

    If writing the entry fails, the checkpoint stays before the event.""",
)


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
    "on_snapshot",
    "on_update",
    "pipeline",
    "retry_policy",
    "stream_spec",
]
