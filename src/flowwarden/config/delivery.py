"""How handlers get events and what happens when they fail: ``@retry_policy``,
``@dead_letter_queue``, ``@on_batch`` and ``@on_dataframe`` options."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationInfo, field_validator, model_validator

from flowwarden.config.backoff import backoff_delay
from flowwarden.config.base import Options, option
from flowwarden.config.choices import OnError, SchemaMode, coerce_choice
from flowwarden.config.names import check_collection_name, check_database_name
from flowwarden.config.problems import OptionProblem
from flowwarden.errors import ConfigurationError

# MongoDB stores expireAfterSeconds as a 32-bit signed int.
_MAX_TTL_SECONDS = 2**31 - 1
_MAX_RETENTION_DAYS = _MAX_TTL_SECONDS // 86_400


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


class RetryPolicy(Options):
    """Options of ``@retry_policy``: how often a failing handler is called again for one event.

    An error is retried when it is an instance of ``retry_on`` and not of ``no_retry_on``; after
    ``max_attempts`` calls in all, ``on_exhausted`` decides (the checkpoint never moves past an
    event whose outcome is STOP).
    """

    decorator: ClassVar[str] = "retry_policy"
    max_attempts: int = option(
        3,
        "Calls of the handler for one event, the first included.",
        allowed="an int >= 1 (calls in all, the first included)",
        ge=1,
    )
    initial_delay_seconds: float = option(
        0.5, "The wait after the first failed call.", ge=0, allow_inf_nan=False
    )
    multiplier: float = option(
        2.0, "Each later wait is the one before times this.", ge=1, allow_inf_nan=False
    )
    max_delay_seconds: float = option(
        30.0,
        "The longest wait between calls.",
        allowed="a finite number >= initial_delay_seconds",
        ge=0,
        allow_inf_nan=False,
    )
    jitter: float = option(
        0.2, "Each wait is spread by up to this fraction of itself, either way.", ge=0, le=1
    )
    retry_on: tuple[type[Exception], ...] = option(
        (Exception,), "Errors that are retried.", allowed="a tuple of Exception subclasses"
    )
    no_retry_on: tuple[type[Exception], ...] = option(
        (),
        "Errors that are never retried, even when retry_on names them.",
        allowed="a tuple of Exception subclasses",
    )
    on_exhausted: OnError = option(
        OnError.STOP, "What happens to the event when its calls are used up: STOP, SKIP or DEAD_LETTER."
    )

    @field_validator("retry_on", "no_retry_on", mode="before")
    @classmethod
    def _classes(cls, value: Any, info: ValidationInfo) -> Any:
        option = info.field_name or "retry_on"
        return _exception_classes(value, option, cls.allowed[option])

    @field_validator("on_exhausted", mode="before")
    @classmethod
    def _on_exhausted(cls, value: Any, info: ValidationInfo) -> Any:
        return coerce_choice(OnError, value, info.field_name or "")

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


class DeadLetterOptions(Options):
    """Options of ``@dead_letter_queue``: where events that exhausted their retries are kept.

    ``database=None`` means the stream's own database (for cluster streams the runtime picks the
    checkpoint database). Entries expire ``retention_days`` after they failed (TTL index).
    """

    decorator: ClassVar[str] = "dead_letter_queue"
    retention_days: int = option(
        30, "Days a dead letter is kept (a TTL index expires it).", ge=1, le=_MAX_RETENTION_DAYS
    )
    collection: str = option(
        "_fw_dlq",
        "The collection dead letters are written to.",
        allowed="a collection name without '$' that does not start with 'system.'",
    )
    database: str | None = option(
        None,
        "The database of that collection; None: the stream's (the checkpoint database for cluster streams).",
        allowed="None or a database name",
    )

    @field_validator("collection")
    @classmethod
    def _collection_name(cls, value: str) -> str:
        check_collection_name(value, "collection")
        return value

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str | None) -> str | None:
        return check_database_name(value, "database")

    @property
    def retention_seconds(self) -> int:
        """``expireAfterSeconds`` of the TTL index."""
        return self.retention_days * 86_400


# ----------------------------------------------------------------------------------------------
# @on_batch / @on_dataframe


class BatchOptions(Options):
    """Options of ``@on_batch``: a batch is handed over at ``max_events`` or after
    ``max_wait_seconds`` since its first event, whichever comes first."""

    decorator: ClassVar[str] = "on_batch"
    max_events: int = option(1000, "A batch is handed over once it holds this many events.", ge=1)
    max_wait_seconds: float = option(
        1.0, "...or once its first event has waited this long.", ge=0, allow_inf_nan=False
    )


INFER = "infer"
"""``@on_dataframe(schema=INFER)``: the schema is inferred from a sample of the collection."""


def _is_struct_type(value: Any) -> bool:
    # A StructType instance can only exist once pyspark is imported, so looking in sys.modules
    # checks it exactly without importing pyspark here.
    types_module = sys.modules.get("pyspark.sql.types")
    struct_type = getattr(types_module, "StructType", None)
    return isinstance(struct_type, type) and isinstance(value, struct_type)


class DataFrameOptions(BatchOptions):
    """Options of ``@on_dataframe``: batch limits, the full-document schema and its mode."""

    decorator: ClassVar[str] = "on_dataframe"
    max_events: int = option(10_000, "A batch is handed over once it holds this many events.", ge=1)
    max_wait_seconds: float = option(
        2.0, "...or once its first event has waited this long.", ge=0, allow_inf_nan=False
    )
    schema_: Any = option(
        None,
        "Types full_document: a pydantic model class or a StructType; 'infer': inferred from a "
        "sample of the collection at start, with _rescued_data; None: extended JSON strings.",
        allowed="None, 'infer', a pydantic BaseModel subclass, or a pyspark StructType instance",
        alias="schema",
    )
    mode: SchemaMode = option(
        SchemaMode.PERMISSIVE, "What a document that does not fit the schema does to its row."
    )
    sample_size: int = option(
        1000, "With schema='infer': how many documents $sample draws to infer the schema.", ge=1
    )
    schema_hints: Any = option(
        None,
        "With schema='infer': types that override what sampling found, as a DDL field list "
        "whose names may be dotted paths ('qty BIGINT, addr.zip STRING') or a StructType.",
        allowed="None, a DDL field list, or a pyspark StructType instance",
    )

    @property
    def schema(self) -> Any:
        """The declared full-document schema (None: extended-JSON strings)."""
        return self.schema_

    @property
    def infers_schema(self) -> bool:
        """Whether the schema is inferred from a sample of the collection at start."""
        return isinstance(self.schema_, str) and self.schema_ == INFER

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: Any) -> Any:
        if value is None or _is_struct_type(value) or value == INFER:
            return value
        if isinstance(value, str):
            raise OptionProblem(
                f"schema {value!r} is not known; a DDL schema is given as a StructType here",
                option="schema",
                value=value,
                allowed=cls.allowed["schema"],
            )
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
        return coerce_choice(SchemaMode, value, info.field_name or "")

    @field_validator("schema_hints")
    @classmethod
    def _schema_hints(cls, value: Any) -> Any:
        if value is None or _is_struct_type(value):
            return value
        if isinstance(value, str):
            from flowwarden.spark.hints import parse_hints  # no pyspark, no pyarrow

            try:
                parse_hints(value)  # a DDL mistake fails at decoration time
            except ConfigurationError as error:
                raise OptionProblem(
                    error.problem,
                    option="schema_hints",
                    value=value,
                    allowed=cls.allowed["schema_hints"],
                ) from None
            return value
        raise OptionProblem(
            f"schema_hints is a {type(value).__name__}",
            option="schema_hints",
            value=value,
            allowed=cls.allowed["schema_hints"],
        )

    @model_validator(mode="after")
    def _hints_need_inference(self) -> DataFrameOptions:
        if self.schema_hints is not None and not self.infers_schema:
            raise OptionProblem(
                "schema_hints applies to an inferred schema only",
                option="schema_hints",
                value=self.schema_hints,
                allowed="schema_hints together with schema='infer'",
            )
        return self
