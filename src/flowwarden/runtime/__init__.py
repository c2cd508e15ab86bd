"""The connector runtime: streams opened at the right position, events dispatched to handlers,
checkpoints committed, failures retried, dead-lettered, restarted or fenced."""

from __future__ import annotations

from flowwarden.runtime.connector import Connector, ForcedStop, redact_uri
from flowwarden.runtime.context import StreamContext
from flowwarden.runtime.status import StreamState, StreamStatus

__all__ = ["Connector", "ForcedStop", "StreamContext", "StreamState", "StreamStatus", "redact_uri"]
