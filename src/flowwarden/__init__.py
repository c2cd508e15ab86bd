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

from typing import TYPE_CHECKING

from flowwarden._lazy import lazy_attributes

if TYPE_CHECKING:
    from flowwarden.config import Deployment as Deployment
    from flowwarden.config import OnError as OnError
    from flowwarden.config import OnHistoryLost as OnHistoryLost
    from flowwarden.config import OnInvalidate as OnInvalidate
    from flowwarden.config import RetryPolicy as RetryPolicy
    from flowwarden.config import SchemaMode as SchemaMode
    from flowwarden.config import Snapshot as Snapshot
    from flowwarden.config import StartPosition as StartPosition
    from flowwarden.decorators import StreamSpec as StreamSpec
    from flowwarden.decorators import change_stream as change_stream
    from flowwarden.decorators import checkpoint as checkpoint
    from flowwarden.decorators import dead_letter_queue as dead_letter_queue
    from flowwarden.decorators import event_filter as event_filter
    from flowwarden.decorators import on_batch as on_batch
    from flowwarden.decorators import on_change as on_change
    from flowwarden.decorators import on_dataframe as on_dataframe
    from flowwarden.decorators import on_delete as on_delete
    from flowwarden.decorators import on_insert as on_insert
    from flowwarden.decorators import on_replace as on_replace
    from flowwarden.decorators import on_snapshot as on_snapshot
    from flowwarden.decorators import on_update as on_update
    from flowwarden.decorators import pipeline as pipeline
    from flowwarden.decorators import retry_policy as retry_policy
    from flowwarden.decorators import stream_spec as stream_spec
    from flowwarden.errors import CheckpointError as CheckpointError
    from flowwarden.errors import ConfigurationError as ConfigurationError
    from flowwarden.errors import FencedError as FencedError
    from flowwarden.errors import FlowWardenError as FlowWardenError
    from flowwarden.errors import HandlerError as HandlerError
    from flowwarden.errors import HistoryLostError as HistoryLostError
    from flowwarden.errors import MissingDependencyError as MissingDependencyError
    from flowwarden.errors import StreamError as StreamError
    from flowwarden.errors import StreamInvalidatedError as StreamInvalidatedError
    from flowwarden.events import ChangeEvent as ChangeEvent
    from flowwarden.events import token_cluster_time as token_cluster_time
    from flowwarden.runtime import Connector as Connector
    from flowwarden.runtime import StreamContext as StreamContext
    from flowwarden.runtime import StreamState as StreamState
    from flowwarden.runtime import StreamStatus as StreamStatus

# Each name loads its module on first use, so a process that needs one part (a Spark worker
# unpickling the streaming source, the command line printing its help) does not pay for all.
_LAZY = {
    "Deployment": "flowwarden.config",
    "OnError": "flowwarden.config",
    "OnHistoryLost": "flowwarden.config",
    "OnInvalidate": "flowwarden.config",
    "RetryPolicy": "flowwarden.config",
    "SchemaMode": "flowwarden.config",
    "Snapshot": "flowwarden.config",
    "StartPosition": "flowwarden.config",
    "StreamSpec": "flowwarden.decorators",
    "change_stream": "flowwarden.decorators",
    "checkpoint": "flowwarden.decorators",
    "dead_letter_queue": "flowwarden.decorators",
    "event_filter": "flowwarden.decorators",
    "on_batch": "flowwarden.decorators",
    "on_change": "flowwarden.decorators",
    "on_dataframe": "flowwarden.decorators",
    "on_delete": "flowwarden.decorators",
    "on_insert": "flowwarden.decorators",
    "on_replace": "flowwarden.decorators",
    "on_snapshot": "flowwarden.decorators",
    "on_update": "flowwarden.decorators",
    "pipeline": "flowwarden.decorators",
    "retry_policy": "flowwarden.decorators",
    "stream_spec": "flowwarden.decorators",
    "CheckpointError": "flowwarden.errors",
    "ConfigurationError": "flowwarden.errors",
    "FencedError": "flowwarden.errors",
    "FlowWardenError": "flowwarden.errors",
    "HandlerError": "flowwarden.errors",
    "HistoryLostError": "flowwarden.errors",
    "MissingDependencyError": "flowwarden.errors",
    "StreamError": "flowwarden.errors",
    "StreamInvalidatedError": "flowwarden.errors",
    "ChangeEvent": "flowwarden.events",
    "token_cluster_time": "flowwarden.events",
    "Connector": "flowwarden.runtime",
    "StreamContext": "flowwarden.runtime",
    "StreamState": "flowwarden.runtime",
    "StreamStatus": "flowwarden.runtime",
}


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
    "Snapshot",
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
    "token_cluster_time",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
