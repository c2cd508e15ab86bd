"""Validated options of every flowwarden decorator, one module per decorator family.

The option models (frozen pydantic v2 models) are the one declaration of each option: its type,
default, limits and description. Every model is validated once, when a decorator is applied;
nothing here runs per event. A bad value never escapes as a pydantic error:
:func:`validate_options` turns it into a :class:`~flowwarden.errors.ConfigurationError` naming
the class, the option, the value and what is allowed.

The package imports each name's module on first use: the choices (``StartPosition``,
``Snapshot``...) and name checks import without pydantic, which a Spark worker running the
streaming source never loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowwarden._lazy import lazy_attributes

if TYPE_CHECKING:
    from flowwarden.config.backoff import backoff_delay as backoff_delay
    from flowwarden.config.base import Options as Options
    from flowwarden.config.base import validate_options as validate_options
    from flowwarden.config.checkpoint import CheckpointOptions as CheckpointOptions
    from flowwarden.config.choices import Deployment as Deployment
    from flowwarden.config.choices import OnError as OnError
    from flowwarden.config.choices import OnHistoryLost as OnHistoryLost
    from flowwarden.config.choices import OnInvalidate as OnInvalidate
    from flowwarden.config.choices import SchemaMode as SchemaMode
    from flowwarden.config.choices import Snapshot as Snapshot
    from flowwarden.config.choices import StartPosition as StartPosition
    from flowwarden.config.delivery import BatchOptions as BatchOptions
    from flowwarden.config.delivery import DataFrameOptions as DataFrameOptions
    from flowwarden.config.delivery import DeadLetterOptions as DeadLetterOptions
    from flowwarden.config.delivery import RetryPolicy as RetryPolicy
    from flowwarden.config.pipeline import ALLOWED_PIPELINE_STAGES as ALLOWED_PIPELINE_STAGES
    from flowwarden.config.pipeline import KEEP_ID_HINT as KEEP_ID_HINT
    from flowwarden.config.pipeline import PipelineOptions as PipelineOptions
    from flowwarden.config.pipeline import new_root_fate as new_root_fate
    from flowwarden.config.problems import OptionProblem as OptionProblem
    from flowwarden.config.stream import EXPANDED_OPERATION_TYPES as EXPANDED_OPERATION_TYPES
    from flowwarden.config.stream import OPERATION_TYPES as OPERATION_TYPES
    from flowwarden.config.stream import STANDARD_OPERATION_TYPES as STANDARD_OPERATION_TYPES
    from flowwarden.config.stream import ChangeStreamOptions as ChangeStreamOptions
    from flowwarden.config.stream import OperationType as OperationType

_LAZY = {
    "backoff_delay": "flowwarden.config.backoff",
    "Options": "flowwarden.config.base",
    "validate_options": "flowwarden.config.base",
    "CheckpointOptions": "flowwarden.config.checkpoint",
    "Deployment": "flowwarden.config.choices",
    "OnError": "flowwarden.config.choices",
    "OnHistoryLost": "flowwarden.config.choices",
    "OnInvalidate": "flowwarden.config.choices",
    "SchemaMode": "flowwarden.config.choices",
    "Snapshot": "flowwarden.config.choices",
    "StartPosition": "flowwarden.config.choices",
    "BatchOptions": "flowwarden.config.delivery",
    "DataFrameOptions": "flowwarden.config.delivery",
    "DeadLetterOptions": "flowwarden.config.delivery",
    "RetryPolicy": "flowwarden.config.delivery",
    "ALLOWED_PIPELINE_STAGES": "flowwarden.config.pipeline",
    "KEEP_ID_HINT": "flowwarden.config.pipeline",
    "PipelineOptions": "flowwarden.config.pipeline",
    "new_root_fate": "flowwarden.config.pipeline",
    "OptionProblem": "flowwarden.config.problems",
    "ChangeStreamOptions": "flowwarden.config.stream",
    "EXPANDED_OPERATION_TYPES": "flowwarden.config.stream",
    "OPERATION_TYPES": "flowwarden.config.stream",
    "OperationType": "flowwarden.config.stream",
    "STANDARD_OPERATION_TYPES": "flowwarden.config.stream",
}

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

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
