"""What a handler method may receive as its optional ``ctx`` argument."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

StreamLog = logging.Logger | logging.LoggerAdapter[logging.Logger]
"""A stream's logger: module loggers wrapped to put the stream's name on every record."""


@dataclass
class StreamContext:
    """Per-call context: which stream, which attempt, a logger, and a way to save progress now.

    One context object exists per stream; the runtime updates ``attempt`` before each call, so a
    handler must not keep it across calls expecting the values to stay.
    """

    stream: str
    logger: StreamLog
    attempt: int = 1
    batch_id: str | None = None
    """For ``@on_batch``/``@on_dataframe`` calls: the ``_data`` of the batch's first event token.

    A redelivered batch (after a crash between the method's write and the checkpoint save)
    starts with the same event, so writes keyed by ``batch_id`` (overwrite a partition, MERGE)
    replace what the lost run wrote instead of adding to it."""
    save_requested: bool = field(default=False, repr=False)
    """Set by :meth:`save_checkpoint_now`; the runtime saves when the call returns and clears it."""

    def save_checkpoint_now(self) -> None:
        """Ask for the checkpoint to be saved as soon as the current handler call returns.

        The event being handled is not finished yet, so it cannot be saved from inside the call;
        this never blocks and is safe from sync and async handlers alike.
        """
        self.save_requested = True

    def take_save_request(self) -> bool:
        """Whether a save was asked for since the last time this was called (the runtime's side)."""
        requested, self.save_requested = self.save_requested, False
        return requested
