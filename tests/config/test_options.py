"""Option models of every decorator: accepted values, rejected values, and the errors they raise."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pydantic
import pytest
from bson import Timestamp
from hypothesis import given
from hypothesis import strategies as st

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
    RetryPolicy,
    SchemaMode,
    StartPosition,
    backoff_delay,
    validate_options,
)
from flowwarden.decorators import (
    change_stream,
    checkpoint,
    dead_letter_queue,
    on_batch,
    on_dataframe,
    on_insert,
    retry_policy,
)
from flowwarden.errors import ConfigurationError

UTC = timezone.utc


class SyncStore:
    def load(self, stream_id: str) -> None: ...
    def save(self, checkpoint: object) -> None: ...
    def save_seen(self, stream_id: str, token: object, epoch: int) -> None: ...
    def save_batch_end(self, stream_id: str, token: object, epoch: int) -> None: ...
    def delete(self, stream_id: str) -> None: ...
    def list(self) -> list[object]:
        return []

    def rewind(self, stream_id: str, token: object) -> None: ...


class AsyncStore:
    async def load(self, stream_id: str) -> None: ...
    async def save(self, checkpoint: object) -> None: ...
    async def save_seen(self, stream_id: str, token: object, epoch: int) -> None: ...
    async def save_batch_end(self, stream_id: str, token: object, epoch: int) -> None: ...
    async def delete(self, stream_id: str) -> None: ...
    async def list(self) -> list[object]:
        return []

    async def rewind(self, stream_id: str, token: object) -> None: ...


class NoRewindStore:
    def load(self, stream_id: str) -> None: ...
    def save(self, checkpoint: object) -> None: ...
    def save_seen(self, stream_id: str, token: object, epoch: int) -> None: ...
    def save_batch_end(self, stream_id: str, token: object, epoch: int) -> None: ...
    def delete(self, stream_id: str) -> None: ...
    def list(self) -> list[object]:
        return []


class Order(pydantic.BaseModel):
    sku: str


# ----------------------------------------------------------------------------------------------
# Accepted values


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"target": "cluster", "namespace": "*"}),
        ({"database": "shop"}, {"target": "database", "namespace": "shop"}),
        ({"database": "shop", "collection": "orders"}, {"target": "collection", "namespace": "shop.orders"}),
    ],
)
def test_change_stream_targets(options: dict[str, Any], expected: dict[str, str]) -> None:
    parsed = ChangeStreamOptions(**options)
    assert parsed.target == expected["target"]
    assert parsed.namespace == expected["namespace"]


@pytest.mark.parametrize(
    ("option", "value", "stored"),
    [
        ("name", "orders-v2", "orders-v2"),
        ("full_document", "default", "default"),
        ("full_document", "updateLookup", "updateLookup"),
        ("full_document", "whenAvailable", "whenAvailable"),
        ("full_document", "required", "required"),
        ("full_document_before_change", "off", "off"),
        ("full_document_before_change", "whenAvailable", "whenAvailable"),
        ("full_document_before_change", "required", "required"),
        ("operation_types", ["insert", "update"], ("insert", "update")),
        ("operation_types", ("delete", "delete", "drop"), ("delete", "drop")),
        ("operation_types", {"rename", "dropDatabase"}, ("dropDatabase", "rename")),
        ("batch_size", None, None),
        ("batch_size", 1, 1),
        ("batch_size", 500, 500),
        ("max_await_time_ms", 1, 1),
        ("max_concurrency", 1, 1),
        ("max_concurrency", 16, 16),
        ("deployment", "all_instances", Deployment.ALL_INSTANCES),
        ("deployment", "single_leader", Deployment.SINGLE_LEADER),
        ("deployment", "SINGLE_LEADER", Deployment.SINGLE_LEADER),
        ("deployment", Deployment.SINGLE_LEADER, Deployment.SINGLE_LEADER),
        ("on_invalidate", "stop", OnInvalidate.STOP),
        ("on_invalidate", "restart", OnInvalidate.RESTART),
        ("on_invalidate", OnInvalidate.RESTART, OnInvalidate.RESTART),
        ("lease_ttl_seconds", 0.5, 0.5),
        ("lease_ttl_seconds", 30, 30.0),
        ("restart_initial_delay_seconds", 0.01, 0.01),
        ("restart_max_delay_seconds", 1.0, 1.0),
        ("max_restarts", None, None),
        ("max_restarts", 0, 0),
        ("max_restarts", 10, 10),
        ("show_expanded_events", True, True),
    ],
)
def test_change_stream_accepts(option: str, value: Any, stored: Any) -> None:
    parsed = validate_options(ChangeStreamOptions, "Orders", {"database": "shop", option: value})
    assert getattr(parsed, option) == stored


def test_change_stream_defaults_match_the_design() -> None:
    parsed = ChangeStreamOptions()
    assert (parsed.collection, parsed.database, parsed.name) == (None, None, None)
    assert parsed.full_document == "default"
    assert parsed.full_document_before_change == "off"
    assert parsed.operation_types is None
    assert parsed.batch_size is None
    assert parsed.max_await_time_ms == 1000
    assert parsed.max_concurrency == 1
    assert parsed.deployment is Deployment.ALL_INSTANCES
    assert parsed.on_invalidate is OnInvalidate.STOP
    assert parsed.lease_ttl_seconds == 30
    assert (parsed.restart_initial_delay_seconds, parsed.restart_max_delay_seconds) == (1.0, 60.0)
    assert parsed.max_restarts == 10
    assert parsed.show_expanded_events is False


def test_expanded_operation_types_need_show_expanded_events() -> None:
    parsed = ChangeStreamOptions(operation_types=["create", "insert"], show_expanded_events=True)
    assert parsed.operation_types == ("create", "insert")
    with pytest.raises(ConfigurationError, match="show_expanded_events=True") as info:
        validate_options(ChangeStreamOptions, "Ddl", {"operation_types": ["createIndexes"]})
    assert info.value.option == "operation_types"
    assert "Ddl" in str(info.value)


def test_operation_type_stage_always_lets_invalidate_through() -> None:
    assert ChangeStreamOptions().operation_type_stage() is None
    stage = ChangeStreamOptions(operation_types=["insert", "update"]).operation_type_stage()
    assert stage == {"$match": {"operationType": {"$in": ["insert", "update", "invalidate"]}}}
    stage = ChangeStreamOptions(operation_types=["invalidate", "delete"]).operation_type_stage()
    assert stage == {"$match": {"operationType": {"$in": ["invalidate", "delete"]}}}


def test_watch_options_leave_server_defaults_out() -> None:
    assert ChangeStreamOptions().watch_options() == {"max_await_time_ms": 1000}
    options = ChangeStreamOptions(
        database="shop",
        collection="orders",
        name="orders",
        full_document="updateLookup",
        full_document_before_change="whenAvailable",
        batch_size=100,
        max_await_time_ms=250,
        show_expanded_events=True,
    ).watch_options()
    assert options == {
        "max_await_time_ms": 250,
        "full_document": "updateLookup",
        "full_document_before_change": "whenAvailable",
        "batch_size": 100,
        "show_expanded_events": True,
        "comment": "flowwarden:orders",
    }


def test_restart_delay_doubles_to_the_maximum_with_jitter() -> None:
    options = ChangeStreamOptions(restart_initial_delay_seconds=1.0, restart_max_delay_seconds=60.0)
    middle = [options.restart_delay_for(n, rng=lambda: 0.5) for n in range(1, 9)]
    assert middle == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert options.restart_delay_for(1, rng=lambda: 0.0) == pytest.approx(0.8)
    assert options.restart_delay_for(1, rng=lambda: 1.0) == pytest.approx(1.2)
    assert options.restart_delay_for(100, rng=lambda: 1.0) == 60.0


@pytest.mark.parametrize(
    ("option", "value", "stored"),
    [
        ("save_every_n", 0, 0),
        ("save_every_n", 1, 1),
        ("save_every_n", 10_000, 10_000),
        ("save_interval_seconds", 0, 0.0),
        ("save_interval_seconds", 0.25, 0.25),
        ("save_interval_seconds", 5, 5.0),
        ("start_position", StartPosition.LATEST, StartPosition.LATEST),
        ("start_position", "earliest", StartPosition.EARLIEST),
        ("start_position", "RESUME", StartPosition.RESUME),
        ("on_history_lost", OnHistoryLost.RESUME_FROM_NOW, OnHistoryLost.RESUME_FROM_NOW),
        ("on_history_lost", "resume_from_oplog_start", OnHistoryLost.RESUME_FROM_OPLOG_START),
        ("on_history_lost", "FAIL", OnHistoryLost.FAIL),
    ],
)
def test_checkpoint_accepts(option: str, value: Any, stored: Any) -> None:
    assert getattr(validate_options(CheckpointOptions, "Orders", {option: value}), option) == stored


def test_checkpoint_defaults_match_the_design() -> None:
    parsed = CheckpointOptions()
    assert parsed.save_every_n == 1
    assert parsed.save_interval_seconds == 5
    assert parsed.start_position is StartPosition.RESUME
    assert parsed.start_at is None
    assert parsed.on_history_lost is OnHistoryLost.FAIL
    assert parsed.store is None


def test_at_time_accepts_aware_datetimes_as_utc_and_timestamps() -> None:
    paris = timezone(timedelta(hours=2))
    parsed = CheckpointOptions(
        start_position=StartPosition.AT_TIME, start_at=datetime(2024, 5, 1, 12, tzinfo=paris)
    )
    assert parsed.start_at == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert isinstance(parsed.start_at, datetime) and parsed.start_at.utcoffset() == timedelta(0)
    assert parsed.start_at_operation_time == Timestamp(
        int(datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp()), 0
    )

    fractional = CheckpointOptions(
        start_position="AT_TIME", start_at=datetime(2024, 5, 1, 10, 0, 0, 900_000, tzinfo=UTC)
    )
    # Floored: the stream starts at or before the instant given, never after it.
    assert fractional.start_at_operation_time == Timestamp(
        int(datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp()), 0
    )

    stamp = Timestamp(1_700_000_000, 7)
    assert (
        CheckpointOptions(start_position=StartPosition.AT_TIME, start_at=stamp).start_at_operation_time
        == stamp
    )
    assert CheckpointOptions().start_at_operation_time is None


@pytest.mark.parametrize("store", [SyncStore(), AsyncStore()], ids=["sync", "async"])
def test_checkpoint_accepts_sync_and_async_stores(store: object) -> None:
    assert CheckpointOptions(store=store).store is store


@pytest.mark.parametrize(
    ("option", "value", "stored"),
    [
        ("max_attempts", 1, 1),
        ("max_attempts", 10, 10),
        ("initial_delay_seconds", 0, 0.0),
        ("multiplier", 1, 1.0),
        ("multiplier", 3.5, 3.5),
        ("max_delay_seconds", 0.5, 0.5),
        ("jitter", 0, 0.0),
        ("jitter", 1, 1.0),
        ("jitter", 0.5, 0.5),
        ("retry_on", ValueError, (ValueError,)),
        ("retry_on", [ValueError, KeyError], (ValueError, KeyError)),
        ("retry_on", (), ()),
        ("no_retry_on", (TypeError,), (TypeError,)),
        ("on_exhausted", OnError.SKIP, OnError.SKIP),
        ("on_exhausted", "dead_letter", OnError.DEAD_LETTER),
    ],
)
def test_retry_policy_accepts(option: str, value: Any, stored: Any) -> None:
    assert getattr(validate_options(RetryPolicy, "Orders", {option: value}), option) == stored


def test_retry_policy_defaults_match_the_design() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 3
    assert (policy.initial_delay_seconds, policy.multiplier, policy.max_delay_seconds) == (0.5, 2.0, 30.0)
    assert policy.jitter == 0.2
    assert policy.retry_on == (Exception,)
    assert policy.no_retry_on == ()
    assert policy.on_exhausted is OnError.STOP


def test_should_retry_follows_retry_on_and_no_retry_on() -> None:
    policy = RetryPolicy(retry_on=(OSError, ValueError), no_retry_on=(FileNotFoundError,))
    assert policy.should_retry(ConnectionError())
    assert policy.should_retry(ValueError())
    assert not policy.should_retry(FileNotFoundError())
    assert not policy.should_retry(KeyError())
    assert not RetryPolicy().should_retry(KeyboardInterrupt())
    assert not RetryPolicy(retry_on=()).should_retry(ValueError())


def test_delay_for_without_jitter_is_the_exponential_series_capped() -> None:
    policy = RetryPolicy(initial_delay_seconds=0.5, multiplier=2.0, max_delay_seconds=3.0, jitter=0.0)
    assert [policy.delay_for(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    flat = RetryPolicy(initial_delay_seconds=0.25, multiplier=1.0, jitter=0.0)
    assert [flat.delay_for(n) for n in (1, 5, 50)] == [0.25, 0.25, 0.25]


def test_delay_for_spreads_by_the_jitter_fraction() -> None:
    policy = RetryPolicy(initial_delay_seconds=1.0, multiplier=2.0, max_delay_seconds=30.0, jitter=0.2)
    assert policy.delay_for(2, rng=lambda: 0.0) == pytest.approx(1.6)
    assert policy.delay_for(2, rng=lambda: 0.5) == pytest.approx(2.0)
    assert policy.delay_for(2, rng=lambda: 0.999999) == pytest.approx(2.4, rel=1e-5)
    # At the cap the spread is cut at the maximum: never above max_delay_seconds.
    assert policy.delay_for(10, rng=lambda: 0.999999) == 30.0
    assert policy.delay_for(10, rng=lambda: 0.0) == pytest.approx(24.0)


def test_delay_for_uses_random_by_default_and_survives_huge_attempts() -> None:
    policy = RetryPolicy()
    samples = {policy.delay_for(1) for _ in range(20)}
    assert all(0.4 <= sample <= 0.6 for sample in samples)
    assert len(samples) > 1
    assert policy.delay_for(10**6) <= policy.max_delay_seconds
    with pytest.raises(ValueError, match="attempt counts from 1"):
        policy.delay_for(0)


@given(
    attempt=st.integers(min_value=1, max_value=5000),
    initial=st.floats(min_value=0, max_value=100),
    multiplier=st.floats(min_value=1, max_value=10),
    extra=st.floats(min_value=0, max_value=1000),
    jitter=st.floats(min_value=0, max_value=1),
    draw=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_delay_stays_within_bounds(
    attempt: int, initial: float, multiplier: float, extra: float, jitter: float, draw: float
) -> None:
    maximum = initial + extra
    delay = backoff_delay(
        attempt, initial=initial, multiplier=multiplier, maximum=maximum, jitter=jitter, rng=lambda: draw
    )
    assert 0.0 <= delay <= maximum
    base = min(maximum, initial * multiplier ** min(attempt - 1, 60)) if multiplier > 1 else initial
    if attempt <= 60 or multiplier == 1:
        assert delay >= base * (1 - jitter) - 1e-9


def test_dead_letter_defaults_and_retention() -> None:
    options = DeadLetterOptions()
    assert (options.retention_days, options.collection, options.database) == (30, "_fw_dlq", None)
    assert options.retention_seconds == 30 * 86_400
    custom = DeadLetterOptions(retention_days=1, collection="poison", database="ops")
    assert (custom.retention_seconds, custom.collection, custom.database) == (86_400, "poison", "ops")


def test_batch_and_dataframe_options() -> None:
    assert (BatchOptions().max_events, BatchOptions().max_wait_seconds) == (1000, 1.0)
    frame = DataFrameOptions()
    assert (frame.max_events, frame.max_wait_seconds, frame.schema, frame.mode) == (
        10_000,
        2.0,
        None,
        SchemaMode.PERMISSIVE,
    )
    typed = DataFrameOptions(schema=Order, mode="dropmalformed", max_events=1, max_wait_seconds=0)
    assert (typed.schema, typed.mode, typed.max_events, typed.max_wait_seconds) == (
        Order,
        SchemaMode.DROPMALFORMED,
        1,
        0.0,
    )


@pytest.mark.spark
def test_dataframe_accepts_a_struct_type_instance() -> None:
    types = pytest.importorskip("pyspark.sql.types")
    schema = types.StructType([types.StructField("sku", types.StringType())])
    assert DataFrameOptions(schema=schema).schema is schema
    with pytest.raises(ConfigurationError, match="not the class"):
        validate_options(DataFrameOptions, "Frames", {"schema": types.StructType})


def test_option_models_are_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        CheckpointOptions().save_every_n = 5


def test_enums_are_strings_and_accept_any_case() -> None:
    assert StartPosition("at_time") is StartPosition.AT_TIME
    assert OnError("Dead_Letter") is OnError.DEAD_LETTER
    assert Deployment("SINGLE_LEADER") is Deployment.SINGLE_LEADER
    assert OnInvalidate("Restart") is OnInvalidate.RESTART
    assert SchemaMode("failfast") is SchemaMode.FAILFAST
    assert OnHistoryLost("resume_from_now") is OnHistoryLost.RESUME_FROM_NOW
    assert str(Deployment.SINGLE_LEADER) == "single_leader"
    assert f"{StartPosition.LATEST}" == "LATEST"
    assert isinstance(OnError.SKIP, str)
    with pytest.raises(ValueError):
        StartPosition("yesterday")


def test_importing_the_decorators_does_not_import_pyspark() -> None:
    code = (
        "import sys, flowwarden.config, flowwarden.decorators; "
        "sys.exit(1 if any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ----------------------------------------------------------------------------------------------
# Rejected values: every error names the class, the option, the value and the allowed values


def _apply(decorator: Callable[..., Any], **options: Any) -> None:
    @decorator(**options)
    class Orders:
        @on_insert
        def created(self, event: object) -> None: ...


def _apply_stream(**options: Any) -> None:
    _apply(change_stream, **options)


def _apply_checkpoint(**options: Any) -> None:
    _apply(checkpoint, **options)


def _apply_retry(**options: Any) -> None:
    _apply(retry_policy, **options)


def _apply_dead_letter(**options: Any) -> None:
    _apply(dead_letter_queue, **options)


def _apply_batch(**options: Any) -> None:
    class Orders:
        @on_batch(**options)
        def load(self, events: list[object]) -> None: ...


def _apply_dataframe(**options: Any) -> None:
    class Orders:
        @on_dataframe(**options)
        def load(self, df: object) -> None: ...


REJECTED: list[tuple[Callable[..., None], dict[str, Any], str]] = [
    (_apply_stream, {"collection": "orders"}, "database"),
    (_apply_stream, {"collection": "", "database": "shop"}, "collection"),
    (_apply_stream, {"collection": "a$b", "database": "shop"}, "collection"),
    (_apply_stream, {"collection": "system.views", "database": "shop"}, "collection"),
    (_apply_stream, {"collection": 5, "database": "shop"}, "collection"),
    (_apply_stream, {"database": ""}, "database"),
    (_apply_stream, {"database": "sh.op"}, "database"),
    (_apply_stream, {"database": "a/b"}, "database"),
    (_apply_stream, {"database": "x" * 64}, "database"),
    (_apply_stream, {"database": "admin"}, "database"),
    (_apply_stream, {"database": "local"}, "database"),
    (_apply_stream, {"database": "config"}, "database"),
    (_apply_stream, {"name": ""}, "name"),
    (_apply_stream, {"name": " orders"}, "name"),
    (_apply_stream, {"name": 7}, "name"),
    (_apply_stream, {"full_document": "updatelookup"}, "full_document"),
    (_apply_stream, {"full_document": None}, "full_document"),
    (_apply_stream, {"full_document_before_change": "default"}, "full_document_before_change"),
    (_apply_stream, {"operation_types": "insert"}, "operation_types"),
    (_apply_stream, {"operation_types": []}, "operation_types"),
    (_apply_stream, {"operation_types": ["insert", "upsert"]}, "operation_types"),
    (_apply_stream, {"operation_types": ["Insert"]}, "operation_types"),
    (_apply_stream, {"operation_types": 3}, "operation_types"),
    (_apply_stream, {"batch_size": 0}, "batch_size"),
    (_apply_stream, {"batch_size": 1.5}, "batch_size"),
    (_apply_stream, {"max_await_time_ms": 0}, "max_await_time_ms"),
    (_apply_stream, {"max_await_time_ms": -5}, "max_await_time_ms"),
    (_apply_stream, {"max_await_time_ms": "1000"}, "max_await_time_ms"),
    (_apply_stream, {"max_concurrency": 0}, "max_concurrency"),
    (_apply_stream, {"max_concurrency": True}, "max_concurrency"),
    (_apply_stream, {"deployment": "leader"}, "deployment"),
    (_apply_stream, {"on_invalidate": "ignore"}, "on_invalidate"),
    (_apply_stream, {"lease_ttl_seconds": 0}, "lease_ttl_seconds"),
    (_apply_stream, {"lease_ttl_seconds": float("inf")}, "lease_ttl_seconds"),
    (_apply_stream, {"restart_initial_delay_seconds": 0}, "restart_initial_delay_seconds"),
    (_apply_stream, {"restart_max_delay_seconds": float("nan")}, "restart_max_delay_seconds"),
    (
        _apply_stream,
        {"restart_initial_delay_seconds": 5, "restart_max_delay_seconds": 2},
        "restart_max_delay_seconds",
    ),
    (_apply_stream, {"max_restarts": -1}, "max_restarts"),
    (_apply_stream, {"show_expanded_events": "yes"}, "show_expanded_events"),
    (_apply_stream, {"operation_types": ["modify"]}, "operation_types"),
    (_apply_checkpoint, {"save_every_n": -1}, "save_every_n"),
    (_apply_checkpoint, {"save_every_n": 2.5}, "save_every_n"),
    (_apply_checkpoint, {"save_every_n": True}, "save_every_n"),
    (_apply_checkpoint, {"save_every_n": "10"}, "save_every_n"),
    (_apply_checkpoint, {"save_interval_seconds": -0.1}, "save_interval_seconds"),
    (_apply_checkpoint, {"save_interval_seconds": float("inf")}, "save_interval_seconds"),
    (_apply_checkpoint, {"start_position": "now"}, "start_position"),
    (_apply_checkpoint, {"start_position": StartPosition.AT_TIME}, "start_at"),
    (_apply_checkpoint, {"start_at": datetime(2024, 1, 1, tzinfo=UTC)}, "start_at"),
    (
        _apply_checkpoint,
        {"start_position": StartPosition.EARLIEST, "start_at": Timestamp(1, 1)},
        "start_at",
    ),
    (
        _apply_checkpoint,
        {"start_position": StartPosition.AT_TIME, "start_at": datetime(2024, 1, 1)},
        "start_at",
    ),
    (_apply_checkpoint, {"start_position": StartPosition.AT_TIME, "start_at": 1_700_000_000}, "start_at"),
    (_apply_checkpoint, {"start_position": StartPosition.AT_TIME, "start_at": "2024-01-01"}, "start_at"),
    (_apply_checkpoint, {"on_history_lost": "retry"}, "on_history_lost"),
    (_apply_checkpoint, {"store": SyncStore}, "store"),
    (_apply_checkpoint, {"store": NoRewindStore()}, "store"),
    (_apply_checkpoint, {"store": {"load": None}}, "store"),
    (_apply_retry, {"max_attempts": 0}, "max_attempts"),
    (_apply_retry, {"max_attempts": 2.0}, "max_attempts"),
    (_apply_retry, {"initial_delay_seconds": -1}, "initial_delay_seconds"),
    (_apply_retry, {"multiplier": 0.5}, "multiplier"),
    (_apply_retry, {"max_delay_seconds": float("inf")}, "max_delay_seconds"),
    (_apply_retry, {"initial_delay_seconds": 10, "max_delay_seconds": 1}, "max_delay_seconds"),
    (_apply_retry, {"jitter": -0.1}, "jitter"),
    (_apply_retry, {"jitter": 1.5}, "jitter"),
    (_apply_retry, {"retry_on": "ValueError"}, "retry_on"),
    (_apply_retry, {"retry_on": (ValueError, 3)}, "retry_on"),
    (_apply_retry, {"retry_on": (KeyboardInterrupt,)}, "retry_on"),
    (_apply_retry, {"no_retry_on": (int,)}, "no_retry_on"),
    (_apply_retry, {"no_retry_on": ValueError()}, "no_retry_on"),
    (_apply_retry, {"on_exhausted": "ignore"}, "on_exhausted"),
    (_apply_dead_letter, {"retention_days": 0}, "retention_days"),
    (_apply_dead_letter, {"retention_days": 30.5}, "retention_days"),
    (_apply_dead_letter, {"retention_days": 100_000}, "retention_days"),
    (_apply_dead_letter, {"collection": ""}, "collection"),
    (_apply_dead_letter, {"collection": "system.dlq"}, "collection"),
    (_apply_dead_letter, {"collection": None}, "collection"),
    (_apply_dead_letter, {"database": "admin"}, "database"),
    (_apply_batch, {"max_events": 0}, "max_events"),
    (_apply_batch, {"max_events": None}, "max_events"),
    (_apply_batch, {"max_wait_seconds": -1}, "max_wait_seconds"),
    (_apply_batch, {"max_wait_seconds": float("nan")}, "max_wait_seconds"),
    (_apply_dataframe, {"max_events": 0}, "max_events"),
    (_apply_dataframe, {"max_wait_seconds": -0.5}, "max_wait_seconds"),
    (_apply_dataframe, {"schema": Order(sku="x")}, "schema"),
    (_apply_dataframe, {"schema": dict}, "schema"),
    (_apply_dataframe, {"schema": {"sku": "string"}}, "schema"),
    (_apply_dataframe, {"mode": "lenient"}, "mode"),
]


@pytest.mark.parametrize(
    ("apply", "options", "option"),
    REJECTED,
    ids=[
        f"{apply.__name__[7:]}-{'-'.join(map(str, options))}-{index}"
        for index, (apply, options, _) in enumerate(REJECTED)
    ],
)
def test_rejected_value_names_class_option_value_and_allowed(
    apply: Callable[..., None], options: dict[str, Any], option: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        apply(**options)
    error = info.value
    message = str(error)
    assert "Orders" in (error.owner or "")
    assert message.startswith(error.owner or "")
    assert error.option == option
    assert f"option {option!r}" in message
    assert error.allowed
    assert f"(allowed: {error.allowed})" in message
    if option in options:
        given = options[option]
        # Cross-field checks report the value as validated (a list of types becomes a tuple).
        assert error.value is given or error.value == given or error.value == tuple(given)
    assert not isinstance(error, pydantic.ValidationError)
    assert error.__cause__ is None or not isinstance(error.__cause__, pydantic.ValidationError)


def test_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_options(CheckpointOptions, "Orders", {"save_every": 5})
    assert info.value.option == "save_every"
    assert "save_every_n" in str(info.value.allowed)
    assert "@checkpoint has no option 'save_every'; did you mean 'save_every_n'?" in str(info.value)


def test_several_problems_are_counted() -> None:
    with pytest.raises(ConfigurationError, match=r"1 more problem"):
        validate_options(RetryPolicy, "Orders", {"max_attempts": 0, "jitter": 2})


def test_naive_start_at_explains_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="has no timezone") as info:
        _apply_checkpoint(start_position=StartPosition.AT_TIME, start_at=datetime(2024, 1, 1))
    assert "tzinfo=timezone.utc" in str(info.value)


def test_store_errors_name_the_missing_methods() -> None:
    with pytest.raises(ConfigurationError, match="lacks rewind"):
        _apply_checkpoint(store=NoRewindStore())
    with pytest.raises(ConfigurationError, match="pass an instance"):
        _apply_checkpoint(store=SyncStore)
