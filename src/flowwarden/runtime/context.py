"""What a handler method may receive as its optional ``ctx`` argument.

One context belongs to one event (or one batch): the runtime makes a new one for each, so
handlers running side by side (``max_concurrency > 1``) never see each other's values, and a value
read after an ``await`` is still the call's own.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

StreamLog = logging.Logger | logging.LoggerAdapter[logging.Logger]
"""A logger for a stream's lines: a module's logger, wrapped to put the stream's name on every record."""


class StreamLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger for one stream: every record gets ``stream``, and the ``extra`` of a call (such as
    ``extra={"token": ...}``) is kept beside it instead of replaced."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def stream_logger(module: str, stream: str) -> StreamLogger:
    """The logger a module uses for one stream's lines: the module's own logger (named by its
    path, ``module`` being its ``__name__``), each record carrying ``stream``."""
    return StreamLogger(logging.getLogger(module), {"stream": stream})


@dataclass(slots=True)
class StreamContext:
    """The context of one handler call: which stream, which attempt, which batch, a logger, and a
    way to save progress as soon as the call returns.

    Each event (each batch, for batch methods) gets its own context; the attempts of one event
    share it, with ``attempt`` counting them (1 for the first call).
    """

    stream: str
    """The name of the stream the call belongs to (its checkpoint's key)."""
    logger: StreamLog
    """A logger that puts ``stream`` on every record it writes."""
    attempt: int = 1
    """Which call this is for the event (or batch): 1 for the first, 2 for the first retry..."""
    batch_id: str | None = None
    """For ``@on_batch``/``@on_dataframe`` calls: the ``_data`` of the batch's first event token.

    A redelivered batch (after a crash between the method's write and the checkpoint save)
    starts with the same event, so writes keyed by ``batch_id`` (overwrite a partition, MERGE)
    replace what the lost run wrote instead of adding to it."""
    save_requested: bool = field(default=False, repr=False)
    """Set by :meth:`save_checkpoint_now`; the runtime saves once the event is finished."""

    def save_checkpoint_now(self) -> None:
        """Ask for the checkpoint to be saved as soon as the current handler call returns.

        The event being handled is not finished yet, so it cannot be saved from inside the call;
        this never blocks and is safe from sync and async handlers alike.
        """
        self.save_requested = True

__all__ = ["StreamContext", "StreamLog", "StreamLogger", "stream_logger"]
