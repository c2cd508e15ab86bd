"""The choice enums of flowwarden's options: values accepted by name or value, in any letter case."""

from __future__ import annotations

from enum import Enum
from typing import Any

from flowwarden.config.problems import OptionProblem


class Choice(str, Enum):
    """A str-valued enum that also accepts its member names and values in any letter case."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def _missing_(cls, value: object) -> Choice | None:
        if isinstance(value, str):
            folded = value.casefold()
            for member in cls:
                if folded in (member.value.casefold(), member.name.casefold()):
                    return member
        return None


class StartPosition(Choice):
    """Where a stream starts when it has no checkpoint (LATEST: even when it has one)."""

    RESUME = "RESUME"
    """The checkpoint if there is one, else now."""
    LATEST = "LATEST"
    """Now, ignoring any checkpoint."""
    EARLIEST = "EARLIEST"
    """The oldest entry still in the oplog."""
    AT_TIME = "AT_TIME"
    """The cluster time given as ``start_at``."""


class OnHistoryLost(Choice):
    """What a stream does when its resume position has fallen out of the oplog."""

    FAIL = "FAIL"
    """The stream fails with a HistoryLostError; the checkpoint is left for an operator."""
    RESUME_FROM_OPLOG_START = "RESUME_FROM_OPLOG_START"
    """Handle what the oplog still has (now, with a warning, when the oplog cannot be read)."""
    RESUME_FROM_NOW = "RESUME_FROM_NOW"
    """Skip the gap and go on from now."""


class OnError(Choice):
    """What happens to an event once its handler exhausted the retry policy."""

    STOP = "STOP"
    """The stream fails; its checkpoint stays before the event."""
    SKIP = "SKIP"
    """Log the error and go on with the next event."""
    DEAD_LETTER = "DEAD_LETTER"
    """Store the event in the dead-letter collection, then go on."""


class SchemaMode(Choice):
    """How ``on_dataframe`` treats a full document that does not fit the declared schema."""

    PERMISSIVE = "PERMISSIVE"
    """The row stays: values that did not fit are null, ``_corrupt_record`` holds the document."""
    DROPMALFORMED = "DROPMALFORMED"
    """The row is left out; the event is reported as malformed."""
    FAILFAST = "FAILFAST"
    """A SchemaMismatchError names the first field that did not fit and the event's token."""


class Deployment(Choice):
    """How many connector instances process one stream at a time."""

    ALL_INSTANCES = "all_instances"
    """Every instance running the handler processes the stream."""
    SINGLE_LEADER = "single_leader"
    """One instance at a time, the holder of the stream's lease; the others stand by."""


class OnInvalidate(Choice):
    """What a stream does after its collection or database was dropped or renamed."""

    STOP = "stop"
    """The stream stops with a StreamInvalidatedError."""
    RESTART = "restart"
    """The stream starts again after the invalidate event."""


class Snapshot(Choice):
    """Whether a stream first copies the documents that already exist (its initial snapshot)."""

    NEVER = "NEVER"
    """Only changes: what exists before the stream's start position is not read."""
    INITIAL = "INITIAL"
    """Copy the existing documents once, then stream their changes from before the copy."""
    INITIAL_ONLY = "INITIAL_ONLY"
    """Copy the existing documents once and stop."""
    WHEN_NEEDED = "WHEN_NEEDED"
    """Copy when the stream has no checkpoint, or its position fell out of the oplog."""


def choices_text(enum: type[Choice]) -> str:
    return ", ".join(repr(member.value) for member in enum)


def coerce_choice(enum: type[Choice], value: Any, option: str) -> Choice:
    # Strict mode would refuse the string "single_leader" for Deployment; accept names and values.
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            pass
    raise OptionProblem(
        f"{value!r} is not a valid {enum.__name__}",
        option=option,
        value=value,
        allowed=choices_text(enum) + f" (or {enum.__name__}.<NAME>)",
    )
