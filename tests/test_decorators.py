"""Handler classes: method marks, class decorators in any order, and the spec the runtime reads."""

from __future__ import annotations

import functools
import inspect
import itertools
import types
from collections.abc import Callable
from typing import Any

import pydantic
import pytest

from flowwarden.config import (
    ChangeStreamOptions,
    CheckpointOptions,
    DeadLetterOptions,
    Deployment,
    OnError,
    OnHistoryLost,
    RetryPolicy,
    SchemaMode,
    StartPosition,
)
from flowwarden.decorators import (
    BatchHandler,
    DataFrameHandler,
    HandlerMethod,
    StreamSpec,
    change_stream,
    checkpoint,
    dead_letter_queue,
    on_batch,
    on_change,
    on_dataframe,
    on_delete,
    on_insert,
    on_replace,
    on_update,
    pipeline,
    retry_policy,
    stream_spec,
)
from flowwarden.errors import ConfigurationError


class Order(pydantic.BaseModel):
    sku: str


def assert_names(error: ConfigurationError, owner: str, option: str) -> None:
    """Every ConfigurationError names the class, the option and what is allowed."""
    message = str(error)
    assert owner in (error.owner or "")
    assert message.startswith(error.owner or "")
    assert error.option == option
    assert f"option {option!r}" in message
    assert error.allowed
    assert f"(allowed: {error.allowed})" in message


# ----------------------------------------------------------------------------------------------
# The DESIGN.md example and a minimal class


@change_stream(collection="orders", database="shop", full_document="updateLookup")
@checkpoint(
    save_every_n=100,
    save_interval_seconds=5,
    start_position=StartPosition.RESUME,
    on_history_lost=OnHistoryLost.FAIL,
)
@pipeline([{"$match": {"operationType": {"$in": ["insert", "update"]}}}])
@retry_policy(
    max_attempts=3,
    initial_delay_seconds=0.5,
    multiplier=2.0,
    max_delay_seconds=30,
    jitter=0.2,
    on_exhausted=OnError.DEAD_LETTER,
)
@dead_letter_queue(retention_days=30)
class OrdersHandler:
    def __init__(self) -> None:
        self.seen: list[object] = []

    @on_insert
    def created(self, event: object) -> None:
        self.seen.append(event)

    @on_update
    async def changed(self, event: object, ctx: object) -> None:
        self.seen.append((event, ctx))


def test_stream_spec_of_the_design_example() -> None:
    spec = stream_spec(OrdersHandler)
    assert isinstance(spec, StreamSpec)
    assert spec.name == "OrdersHandler"
    assert spec.handler_class is OrdersHandler
    assert spec.mode == "event"

    assert spec.stream.name == "OrdersHandler"
    assert (spec.stream.database, spec.stream.collection, spec.stream.target) == (
        "shop",
        "orders",
        "collection",
    )
    assert spec.stream.full_document == "updateLookup"
    assert spec.stream.deployment is Deployment.ALL_INSTANCES
    assert spec.stream.watch_options()["comment"] == "flowwarden:OrdersHandler"

    assert spec.checkpoint == CheckpointOptions(save_every_n=100, save_interval_seconds=5)
    assert spec.pipeline == ({"$match": {"operationType": {"$in": ["insert", "update"]}}},)
    assert spec.retry == RetryPolicy(on_exhausted=OnError.DEAD_LETTER)
    assert spec.dead_letter == DeadLetterOptions(retention_days=30)

    assert dict(spec.event_handlers) == {
        "insert": HandlerMethod(
            "created", is_async=False, wants_ctx=False, kind="event", operation_types=("insert",)
        ),
        "update": HandlerMethod(
            "changed", is_async=True, wants_ctx=True, kind="event", operation_types=("update",)
        ),
    }
    assert spec.fallback is None
    assert spec.batch is None and spec.dataframe is None
    assert spec.handler_for("insert") is spec.event_handlers["insert"]
    assert spec.handler_for("delete") is None


async def test_handler_methods_bind_to_an_instance() -> None:
    spec = stream_spec(OrdersHandler)
    handler = OrdersHandler()
    spec.event_handlers["insert"].bind(handler)("e1")
    await spec.event_handlers["update"].bind(handler)("e2", "ctx")
    assert handler.seen == ["e1", ("e2", "ctx")]


def test_minimal_class_gets_every_default() -> None:
    @change_stream(collection="orders", database="shop")
    class Minimal:
        @on_change
        def handle(self, event: object) -> None: ...

    spec = stream_spec(Minimal)
    assert spec.name == "Minimal"
    assert spec.checkpoint == CheckpointOptions()
    assert (spec.checkpoint.save_every_n, spec.checkpoint.save_interval_seconds) == (1, 5)
    assert spec.checkpoint.start_position is StartPosition.RESUME
    assert spec.checkpoint.on_history_lost is OnHistoryLost.FAIL
    assert spec.retry == RetryPolicy()
    assert spec.dead_letter is None
    assert spec.pipeline == ()
    fallback = HandlerMethod("handle", is_async=False, wants_ctx=False, kind="event", operation_types=None)
    assert spec.fallback == fallback
    assert dict(spec.event_handlers) == {"*": fallback}
    assert spec.handler_for("insert") == fallback
    assert spec.handler_for("dropDatabase") == fallback


def test_bare_class_decorators_use_defaults() -> None:
    @change_stream
    @checkpoint
    @retry_policy
    @dead_letter_queue
    class Everything:
        @on_change
        async def handle(self, event: object) -> None: ...

    spec = stream_spec(Everything)
    assert spec.stream.target == "cluster"
    assert spec.stream.namespace == "*"
    assert spec.checkpoint == CheckpointOptions()
    assert spec.retry == RetryPolicy()
    assert spec.dead_letter == DeadLetterOptions()


def test_dead_letter_defaults_come_with_on_exhausted_dead_letter() -> None:
    @change_stream(database="shop")
    @retry_policy(on_exhausted="dead_letter")
    class Poisoned:
        @on_insert
        def created(self, event: object) -> None: ...

    assert stream_spec(Poisoned).dead_letter == DeadLetterOptions()


def test_explicit_name_keys_the_stream() -> None:
    @change_stream(database="shop", name="orders-v2", deployment="single_leader", max_concurrency=4)
    class Renamed:
        @on_delete
        def removed(self, event: object) -> None: ...

    spec = stream_spec(Renamed)
    assert spec.name == spec.stream.name == "orders-v2"
    assert spec.stream.deployment is Deployment.SINGLE_LEADER
    assert spec.stream.max_concurrency == 4


# ----------------------------------------------------------------------------------------------
# Class decorators stack in any order

CLASS_DECORATORS: list[Callable[[type], type]] = [
    change_stream(collection="orders", database="shop", operation_types=["insert", "update"]),
    checkpoint(save_every_n=10, start_position=StartPosition.LATEST),
    pipeline([{"$project": {"fullDocumentBeforeChange": 0}}]),
    retry_policy(max_attempts=5, on_exhausted=OnError.SKIP),
    dead_letter_queue(retention_days=7, collection="poison"),
]


def _comparable(spec: StreamSpec) -> tuple[Any, ...]:
    return (
        spec.name,
        spec.stream,
        spec.checkpoint,
        spec.pipeline,
        spec.retry,
        spec.dead_letter,
        dict(spec.event_handlers),
        spec.fallback,
    )


def test_class_decorators_stack_in_any_order() -> None:
    results = set()
    for order in itertools.permutations(CLASS_DECORATORS):

        class Stacked:
            @on_insert
            @on_update
            def upserted(self, event: object) -> None: ...

        for decorator in reversed(order):
            Stacked = decorator(Stacked)  # type: ignore[misc,assignment]
        results.add(repr(_comparable(stream_spec(Stacked))))
    assert len(results) == 1
    assert "Stacked" in results.pop()


@pytest.mark.parametrize("position", range(5))
def test_cross_decorator_errors_surface_whichever_decorator_comes_last(position: int) -> None:
    # operationType removed by the pipeline while methods dispatch on it: found at decoration
    # time however the decorators are ordered.
    decorators: list[Callable[[type], type]] = [
        change_stream(collection="orders", database="shop"),
        checkpoint(),
        pipeline([{"$project": {"fullDocument": 1}}]),
        retry_policy(),
        dead_letter_queue(),
    ]
    order = decorators[position:] + decorators[:position]

    class Broken:
        @on_insert
        def created(self, event: object) -> None: ...

    with pytest.raises(ConfigurationError, match="removes operationType"):
        for decorator in reversed(order):
            Broken = decorator(Broken)  # type: ignore[misc,assignment]


@pytest.mark.parametrize(
    ("decorator", "name"),
    [
        (change_stream(database="shop"), "change_stream"),
        (checkpoint(), "checkpoint"),
        (pipeline([]), "pipeline"),
        (retry_policy(), "retry_policy"),
        (dead_letter_queue(), "dead_letter_queue"),
    ],
)
def test_a_class_decorator_applied_twice_is_refused(decorator: Callable[[type], type], name: str) -> None:
    class Twice:
        @on_change
        def handle(self, event: object) -> None: ...

    decorator(Twice)
    with pytest.raises(ConfigurationError, match="applied twice") as info:
        decorator(Twice)
    assert_names(info.value, "Twice", name)


@pytest.mark.parametrize(
    "decorator",
    [change_stream(database="shop"), checkpoint(), pipeline([]), retry_policy(), dead_letter_queue()],
)
def test_class_decorators_refuse_functions(decorator: Callable[[Any], Any]) -> None:
    def handler(event: object) -> None: ...

    with pytest.raises(ConfigurationError, match="decorates handler classes") as info:
        decorator(handler)
    assert_names(info.value, "handler", info.value.option or "")


def test_pipeline_needs_its_stages() -> None:
    with pytest.raises(ConfigurationError, match="needs its stages") as info:

        @pipeline  # type: ignore[arg-type]
        class Bare:
            @on_change
            def handle(self, event: object) -> None: ...

    assert_names(info.value, "Bare", "stages")


# ----------------------------------------------------------------------------------------------
# How a decorator is called: a misspelt option or a misplaced value names the class and the fix


@pytest.mark.parametrize(
    ("decorator", "misspelt", "meant"),
    [
        (change_stream, "colection", "collection"),
        (checkpoint, "save_every", "save_every_n"),
        (retry_policy, "max_attempt", "max_attempts"),
        (dead_letter_queue, "retention", "retention_days"),
    ],
)
def test_a_misspelt_class_option_names_the_class_and_the_closest_option(
    decorator: Callable[..., Any], misspelt: str, meant: str
) -> None:
    options = {misspelt: "orders"}
    applied = decorator(**options)  # nothing to name until it meets its class
    with pytest.raises(ConfigurationError, match=f"did you mean '{meant}'") as info:

        @applied
        class Orders:
            @on_change
            def handle(self, event: object) -> None: ...

    assert_names(info.value, "Orders", misspelt)
    assert f"@{decorator.__name__} has no option {misspelt!r}" in str(info.value)
    assert meant in str(info.value.allowed)


@pytest.mark.parametrize(("decorator", "meant"), [(on_batch, "max_events"), (on_dataframe, "max_events")])
def test_a_misspelt_method_option_names_the_method_and_the_closest_option(
    decorator: Callable[..., Any], meant: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"did you mean '{meant}'") as info:

        class Orders:
            @decorator(max_event=10)
            def handle(self, events: object) -> None: ...

    assert_names(info.value, "Orders.handle", "max_event")


def test_an_option_far_from_any_name_lists_them_all() -> None:
    with pytest.raises(ConfigurationError) as info:

        @checkpoint(zzz=1)  # type: ignore[call-overload]
        class Orders: ...

    assert "did you mean" not in str(info.value)
    assert "save_every_n" in str(info.value.allowed)


def test_options_given_by_position_are_refused_naming_the_class() -> None:
    by_position = r"takes its options by name.*not 3 value\(s\) by position"
    with pytest.raises(ConfigurationError, match=by_position) as info:

        @checkpoint(100, 5.0, "LATEST")  # type: ignore[call-overload]
        class Orders: ...

    assert_names(info.value, "Orders", "checkpoint")
    assert "save_every_n=" in str(info.value.allowed)

    with pytest.raises(ConfigurationError, match=r"at most 2 options by position \(collection, database\)"):

        @change_stream("orders", "shop", "orders-v2")  # type: ignore[call-overload]
        class Named: ...

    with pytest.raises(ConfigurationError, match="got collection both by position and by name") as info:

        @change_stream("orders", "shop", collection="orders")  # type: ignore[call-overload]
        class Twice: ...

    assert_names(info.value, "Twice", "collection")


def test_collection_and_database_are_taken_by_position() -> None:
    @change_stream("orders", "shop", name="orders-v2")
    class Orders:
        @on_change
        def handle(self, event: object) -> None: ...

    stream = stream_spec(Orders).stream
    assert (stream.collection, stream.database, stream.name) == ("orders", "shop", "orders-v2")


def test_help_shows_the_written_signature_and_every_option() -> None:
    signature = inspect.signature(checkpoint)
    assert list(signature.parameters) == CheckpointOptions.option_names()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.parameters.values())
    for name in ChangeStreamOptions.option_names():
        assert f":param {name}:" in (change_stream.__doc__ or "")


# ----------------------------------------------------------------------------------------------
# Method decorators: bare or called, sync or async, with or without ctx


@pytest.mark.parametrize("decorator", [on_insert, on_update, on_replace, on_delete, on_change])
def test_event_decorators_work_bare_and_called(decorator: Any) -> None:
    def bare(self: object, event: object) -> str:
        return "bare"

    def called(self: object, event: object) -> str:
        return "called"

    assert decorator(bare) is bare
    assert decorator()(called) is called
    assert bare(None, None) == "bare"


def fresh(func: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of a module-level function, so marks of one test do not leak into the next."""
    assert isinstance(func, types.FunctionType)
    copy = types.FunctionType(
        func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__
    )
    copy.__kwdefaults__ = func.__kwdefaults__
    copy.__qualname__ = func.__qualname__
    copy.__dict__.update({k: v for k, v in func.__dict__.items() if k != "__flowwarden_handler__"})
    return copy


def _spec_of(method: Callable[..., Any], decorator: Any = on_insert) -> HandlerMethod:
    handler_class = type("Probe", (), {"handle": decorator(fresh(method))})
    spec = stream_spec(change_stream(database="shop")(handler_class))
    found = spec.batch or spec.dataframe or spec.handler_for("insert")
    assert found is not None
    return found


def _sync(self: object, event: object) -> None: ...


def _sync_ctx(self: object, event: object, ctx: object) -> None: ...


def _sync_optional_ctx(self: object, event: object, ctx: object = None) -> None: ...


def _sync_varargs(self: object, *args: object) -> None: ...


def _sync_optional_kw(self: object, event: object, *, verbose: bool = False) -> None: ...


async def _async(self: object, event: object) -> None: ...


async def _async_ctx(self: object, event: object, ctx: object) -> None: ...


async def _async_positional_only(self: object, event: object, ctx: object, /) -> None: ...


def _wrapped_async() -> Callable[..., Any]:
    async def inner(self: object, event: object, ctx: object) -> None: ...

    @functools.wraps(inner)
    def wrapper(*args: object) -> Any:
        return inner(*args)

    return wrapper


@pytest.mark.parametrize(
    ("method", "is_async", "wants_ctx"),
    [
        (_sync, False, False),
        (_sync_ctx, False, True),
        (_sync_optional_ctx, False, True),
        (_sync_varargs, False, True),
        (_sync_optional_kw, False, False),
        (_async, True, False),
        (_async_ctx, True, True),
        (_async_positional_only, True, True),
        (_wrapped_async(), True, True),
    ],
)
@pytest.mark.parametrize(
    "decorator",
    [on_insert, on_batch, on_batch(max_events=5), on_dataframe, on_dataframe()],
    ids=["on_insert", "on_batch", "on_batch()", "on_dataframe", "on_dataframe()"],
)
def test_sync_async_and_ctx_are_detected_once(
    method: Callable[..., Any], is_async: bool, wants_ctx: bool, decorator: Any
) -> None:
    handler = _spec_of(method, decorator)
    assert (handler.is_async, handler.wants_ctx, handler.name) == (is_async, wants_ctx, "handle")


def test_lambdas_are_handlers_too() -> None:
    assert _spec_of(lambda self, event, ctx: None).wants_ctx


def _no_event(self: object) -> None: ...


def _extra_required(self: object, event: object, ctx: object, other: object) -> None: ...


def _required_keyword(self: object, event: object, *, other: object) -> None: ...


def _generator(self: object, event: object) -> Any:
    yield event


async def _async_generator(self: object, event: object) -> Any:
    yield event


@pytest.mark.parametrize(
    ("method", "fragment"),
    [
        (_no_event, "cannot be called as"),
        (_extra_required, "cannot be called as"),
        (_required_keyword, "cannot be called as"),
        (_generator, "is a generator"),
        (_async_generator, "is a generator"),
    ],
)
@pytest.mark.parametrize(
    "decorator", [on_insert, on_change, on_batch, on_dataframe], ids=lambda d: str(d.__name__)
)
def test_unusable_method_signatures_are_refused(
    method: Callable[..., Any], fragment: str, decorator: Any
) -> None:
    with pytest.raises(ConfigurationError, match=fragment) as info:
        decorator(fresh(method))
    assert info.value.option == decorator.__name__
    assert "def name(self," in str(info.value.allowed)
    assert "test_decorators" in (info.value.owner or "")


def test_static_and_class_methods_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="staticmethod") as info:

        class Static:
            @on_insert
            @staticmethod
            def created(event: object, ctx: object) -> None: ...

    assert_names(info.value, "Static", "on_insert")

    with pytest.raises(ConfigurationError, match="classmethod"):

        class Klass:
            @on_batch
            @classmethod
            def load(cls, events: object) -> None: ...

    class Hidden:
        # Marked first, then wrapped: the class check finds the mark under the staticmethod.
        @staticmethod
        @on_insert
        def created(event: object, ctx: object) -> None: ...

    with pytest.raises(ConfigurationError, match="is a staticmethod") as info:
        stream_spec(change_stream(database="shop")(Hidden))
    assert_names(info.value, "Hidden", "on_insert")


def test_method_decorators_refuse_non_functions() -> None:
    with pytest.raises(ConfigurationError, match="marks methods"):
        on_insert(5)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="takes its options by name") as info:

        class Batches:
            @on_batch(10)  # type: ignore[call-overload]
            def handle(self, events: object) -> None: ...

    assert_names(info.value, "Batches.handle", "on_batch")
    assert "max_events=" in str(info.value.allowed)


def test_per_type_decorators_stack_on_one_method() -> None:
    @change_stream(database="shop")
    class Upserts:
        @on_insert
        @on_replace
        @on_update
        def upserted(self, event: object) -> None: ...

        @on_delete
        def removed(self, event: object) -> None: ...

    spec = stream_spec(Upserts)
    assert sorted(spec.event_handlers) == ["delete", "insert", "replace", "update"]
    upserted = spec.event_handlers["insert"]
    assert upserted is spec.event_handlers["update"] is spec.event_handlers["replace"]
    assert upserted.operation_types == ("update", "replace", "insert")
    assert spec.event_handlers["delete"].name == "removed"


@pytest.mark.parametrize(
    ("outer", "inner", "fragment"),
    [
        (on_insert, on_insert, "applied twice"),
        (on_insert, on_change, "already covers every operation type"),
        (on_change, on_update, "already covers every operation type"),
        (on_batch, on_insert, "cannot be combined"),
        (on_insert, on_batch(), "cannot be combined"),
        (on_dataframe, on_batch, "cannot be combined"),
        (on_batch(max_events=3), on_batch, "applied twice"),
    ],
)
def test_conflicting_marks_on_one_method(outer: Any, inner: Any, fragment: str) -> None:
    def handle(self: object, event: object) -> None: ...

    marked = inner(handle)
    with pytest.raises(ConfigurationError, match=fragment) as info:
        outer(marked)
    assert "'handle'" in str(info.value)
    assert info.value.allowed


# ----------------------------------------------------------------------------------------------
# Batch and DataFrame modes


def test_on_batch_spec() -> None:
    @change_stream(database="shop")
    class Loader:
        @on_batch(max_events=50, max_wait_seconds=0.5)
        async def load(self, events: list[object], ctx: object) -> None: ...

    spec = stream_spec(Loader)
    assert spec.mode == "batch"
    assert spec.batch == BatchHandler(
        "load", is_async=True, wants_ctx=True, kind="batch", max_events=50, max_wait_seconds=0.5
    )
    assert spec.dataframe is None and spec.fallback is None and not spec.event_handlers
    assert spec.handler_for("insert") is None


def test_on_batch_defaults() -> None:
    @change_stream(database="shop")
    class Loader:
        @on_batch
        def load(self, events: list[object]) -> None: ...

    batch = stream_spec(Loader).batch
    assert batch is not None
    assert (batch.max_events, batch.max_wait_seconds, batch.wants_ctx) == (1000, 1.0, False)


def test_on_dataframe_spec() -> None:
    @change_stream(collection="orders", database="shop")
    class Frames:
        @on_dataframe(max_events=200, max_wait_seconds=0, schema=Order, mode=SchemaMode.FAILFAST)
        def frame(self, df: object, ctx: object) -> None: ...

    spec = stream_spec(Frames)
    assert spec.mode == "dataframe"
    assert spec.dataframe == DataFrameHandler(
        "frame",
        is_async=False,
        wants_ctx=True,
        kind="dataframe",
        max_events=200,
        max_wait_seconds=0.0,
        schema=Order,
        mode=SchemaMode.FAILFAST,
    )
    assert spec.batch is None


def test_on_dataframe_defaults() -> None:
    @change_stream(database="shop")
    class Frames:
        @on_dataframe
        def frame(self, df: object) -> None: ...

    frame = stream_spec(Frames).dataframe
    assert frame is not None
    assert (frame.max_events, frame.max_wait_seconds, frame.schema, frame.mode) == (
        10_000,
        2.0,
        None,
        SchemaMode.PERMISSIVE,
    )


# ----------------------------------------------------------------------------------------------
# Whole-class errors


def test_handlers_without_change_stream_name_the_fix() -> None:
    class Forgotten:
        @on_insert
        def created(self, event: object) -> None: ...

    with pytest.raises(ConfigurationError, match="no @change_stream; add @change_stream") as info:
        stream_spec(Forgotten)
    assert_names(info.value, "Forgotten", "change_stream")
    assert "'created' (@on_insert)" in str(info.value)

    @checkpoint(save_every_n=3)
    class ConfiguredButForgotten:
        @on_insert
        def created(self, event: object) -> None: ...

    with pytest.raises(ConfigurationError, match="no @change_stream"):
        stream_spec(ConfiguredButForgotten)


def test_a_plain_class_is_not_a_handler() -> None:
    class Plain:
        def created(self, event: object) -> None: ...

    with pytest.raises(ConfigurationError, match="is not a handler class") as info:
        stream_spec(Plain)
    assert_names(info.value, "Plain", "change_stream")


def test_stream_spec_refuses_non_classes() -> None:
    with pytest.raises(ConfigurationError, match="handlers are classes") as info:
        stream_spec(OrdersHandler())  # type: ignore[arg-type]
    assert info.value.option == "handlers"


def test_no_handler_method_fails_at_decoration_time() -> None:
    with pytest.raises(ConfigurationError, match="no handler method") as info:

        @change_stream(collection="orders", database="shop")
        class Idle:
            def created(self, event: object) -> None: ...

    assert_names(info.value, "Idle", "handlers")
    assert "@on_insert" in str(info.value.allowed)


def test_two_handlers_for_one_operation_type() -> None:
    with pytest.raises(ConfigurationError, match="two methods handle 'insert' events") as info:

        @change_stream(database="shop")
        class Doubled:
            @on_insert
            def first(self, event: object) -> None: ...

            @on_insert
            @on_update
            def second(self, event: object) -> None: ...

    assert_names(info.value, "Doubled", "on_insert")
    assert info.value.value == ("first", "second")


def test_two_on_change_methods() -> None:
    with pytest.raises(ConfigurationError, match="two @on_change methods") as info:

        @change_stream(database="shop")
        class Doubled:
            @on_change
            def first(self, event: object) -> None: ...

            @on_change
            async def second(self, event: object) -> None: ...

    assert_names(info.value, "Doubled", "on_change")


@pytest.mark.parametrize(
    ("first", "second", "option"),
    [
        (on_batch, on_insert, "on_batch"),
        (on_dataframe, on_change, "on_dataframe"),
        (on_batch, on_dataframe, "on_batch"),
        (on_batch(max_events=2), on_batch, "on_batch"),
        (on_insert, on_dataframe(max_events=5), "on_dataframe"),
    ],
)
def test_modes_do_not_mix(first: Any, second: Any, option: str) -> None:
    with pytest.raises(ConfigurationError, match="cannot share the class with") as info:

        @change_stream(database="shop")
        class Mixed:
            @first
            def alpha(self, payload: object) -> None: ...

            @second
            def beta(self, payload: object) -> None: ...

    assert_names(info.value, "Mixed", option)
    assert "'alpha'" in str(info.value) and "'beta'" in str(info.value)


def test_handler_filtered_out_by_operation_types() -> None:
    with pytest.raises(ConfigurationError, match="can never run") as info:

        @change_stream(database="shop", operation_types=["insert", "update"])
        class Unreachable:
            @on_insert
            def created(self, event: object) -> None: ...

            @on_delete
            def removed(self, event: object) -> None: ...

    assert_names(info.value, "Unreachable", "operation_types")
    assert "'removed'" in str(info.value) and "'delete'" in str(info.value)


def test_operation_types_with_on_change_is_fine() -> None:
    @change_stream(database="shop", operation_types=["drop", "rename"])
    class Ddl:
        @on_change
        def changed(self, event: object) -> None: ...

    spec = stream_spec(Ddl)
    own, types = spec.pipeline  # a database stream leaves out flowwarden's own collections first
    assert own == {"$match": {"ns.coll": {"$not": {"$regex": "^_fw_"}}}}
    assert types == {"$match": {"operationType": {"$in": ["drop", "rename", "invalidate"]}}}


# ----------------------------------------------------------------------------------------------
# Caching and inheritance


def test_spec_is_computed_once_per_class() -> None:
    assert stream_spec(OrdersHandler) is stream_spec(OrdersHandler)


def test_event_handlers_are_read_only() -> None:
    with pytest.raises(TypeError):
        stream_spec(OrdersHandler).event_handlers["delete"] = HandlerMethod("x", False, False)  # type: ignore[index]


def test_subclasses_inherit_configuration_under_their_own_name() -> None:
    class Archive(OrdersHandler):
        @on_delete
        def removed(self, event: object) -> None: ...

    base, sub = stream_spec(OrdersHandler), stream_spec(Archive)
    assert sub is not base
    assert sub.name == sub.stream.name == "Archive"
    assert sub.handler_class is Archive
    assert sub.checkpoint == base.checkpoint and sub.retry == base.retry
    assert sorted(sub.event_handlers) == ["delete", "insert", "update"]
    assert stream_spec(OrdersHandler) is base


def test_undecorated_override_drops_a_handler() -> None:
    class Quiet(OrdersHandler):
        def created(self, event: object) -> None: ...

    assert sorted(stream_spec(Quiet).event_handlers) == ["update"]


def test_explicit_name_is_inherited() -> None:
    @change_stream(database="shop", name="shared")
    class Base:
        @on_change
        def handle(self, event: object) -> None: ...

    class Child(Base):
        pass

    assert stream_spec(Child).name == "shared"


def test_subclass_may_replace_a_decorator_of_its_base() -> None:
    @checkpoint(save_every_n=500)
    class Faster(OrdersHandler):
        pass

    assert stream_spec(Faster).checkpoint.save_every_n == 500
    assert stream_spec(OrdersHandler).checkpoint.save_every_n == 100


def test_spec_options_are_the_validated_models() -> None:
    spec = stream_spec(OrdersHandler)
    assert isinstance(spec.stream, ChangeStreamOptions)
    assert isinstance(spec.checkpoint, CheckpointOptions)
    assert isinstance(spec.retry, RetryPolicy)
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


def test_a_refused_decorator_leaves_the_class_unchanged() -> None:
    class Broken:
        @on_insert
        def created(self, event: object) -> None: ...

    change_stream(database="shop")(Broken)
    with pytest.raises(ConfigurationError, match="removes operationType"):
        pipeline([{"$unset": "operationType"}])(Broken)
    pipeline([{"$unset": "fullDocument"}])(Broken)
    assert stream_spec(Broken).pipeline[-1:] == ({"$unset": "fullDocument"},)
