"""flowwarden: MongoDB change streams into Spark, with exact resume-token checkpoints.

Decorate a handler class, hand it to a :class:`Connector`, run it::

    @change_stream(collection="orders", database="shop")
    @checkpoint(save_every_n=100)
    class Orders:
        @on_insert
        def created(self, event: ChangeEvent) -> None: ...

    Connector("mongodb://localhost:27017/?replicaSet=rs0", handlers=[Orders]).run()
"""

from __future__ import annotations

from flowwarden._deprecated import install_old_checkpoint_path
from flowwarden.config import (
    Deployment,
    OnError,
    OnHistoryLost,
    OnInvalidate,
    RetryPolicy,
    SchemaMode,
    StartPosition,
)
from flowwarden.decorators import (
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
from flowwarden.errors import (
    CheckpointError,
    ConfigurationError,
    FencedError,
    FlowWardenError,
    HandlerError,
    HistoryLostError,
    MissingDependencyError,
    StreamError,
    StreamInvalidatedError,
)
from flowwarden.events import ChangeEvent, token_cluster_time
from flowwarden.runtime import Connector, StreamContext, StreamState, StreamStatus

install_old_checkpoint_path()

__version__ = "0.1.0"

__all__ = [
    "ChangeEvent",
    "CheckpointError",
    "ConfigurationError",
    "Connector",
    "Deployment",
    "FencedError",
    "FlowWardenError",
    "HandlerError",
    "HistoryLostError",
    "MissingDependencyError",
    "OnError",
    "OnHistoryLost",
    "OnInvalidate",
    "RetryPolicy",
    "SchemaMode",
    "StartPosition",
    "StreamContext",
    "StreamError",
    "StreamInvalidatedError",
    "StreamSpec",
    "StreamState",
    "StreamStatus",
    "__version__",
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
    "token_cluster_time",
]
