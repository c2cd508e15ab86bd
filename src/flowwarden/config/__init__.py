"""Validated options of every flowwarden decorator, one module per decorator family.

The option models (frozen pydantic v2 models) are the one declaration of each option: its type,
default, limits and description. Every model is validated once, when a decorator is applied;
nothing here runs per event. A bad value never escapes as a pydantic error:
:func:`validate_options` turns it into a :class:`~flowwarden.errors.ConfigurationError` naming
the class, the option, the value and what is allowed.
"""

from __future__ import annotations

from flowwarden.config.backoff import backoff_delay
from flowwarden.config.base import OptionProblem, Options, validate_options
from flowwarden.config.checkpoint import CheckpointOptions
from flowwarden.config.choices import (
    Deployment,
    OnError,
    OnHistoryLost,
    OnInvalidate,
    SchemaMode,
    Snapshot,
    StartPosition,
)
from flowwarden.config.delivery import BatchOptions, DataFrameOptions, DeadLetterOptions, RetryPolicy
from flowwarden.config.pipeline import ALLOWED_PIPELINE_STAGES, KEEP_ID_HINT, PipelineOptions, new_root_fate
from flowwarden.config.stream import (
    EXPANDED_OPERATION_TYPES,
    OPERATION_TYPES,
    STANDARD_OPERATION_TYPES,
    ChangeStreamOptions,
    OperationType,
)

__all__ = [
    "ALLOWED_PIPELINE_STAGES",
    "EXPANDED_OPERATION_TYPES",
    "KEEP_ID_HINT",
    "OPERATION_TYPES",
    "STANDARD_OPERATION_TYPES",
    "BatchOptions",
    "ChangeStreamOptions",
    "CheckpointOptions",
    "DataFrameOptions",
    "DeadLetterOptions",
    "Deployment",
    "OnError",
    "OnHistoryLost",
    "OnInvalidate",
    "OperationType",
    "OptionProblem",
    "Options",
    "PipelineOptions",
    "RetryPolicy",
    "SchemaMode",
    "Snapshot",
    "StartPosition",
    "backoff_delay",
    "new_root_fate",
    "validate_options",
]
