"""How one open/read cycle of a stream ended, as a value the run loop matches on.

A cycle (copy what a snapshot needs, open the stream, read it, save) returns one of these;
:meth:`flowwarden.runtime.stream.StreamRunner.run` decides from it what comes next. The rule this
module keeps: an outcome says only how the cycle ended, never what to do about it, and an error
that is a real failure (a handler that gave up, a failed committer, a server error) is not an
outcome: it is raised, and reaches the run loop as :class:`Restart` (the restart rule of
:mod:`flowwarden.runtime.restarts` then fails the stream or re-opens it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from pymongo.errors import OperationFailure

from flowwarden.errors import StreamInvalidatedError


@dataclass(frozen=True)
class Stopped:
    """The stream stops: a stop was asked for (nothing in flight was lost), or the server ended
    the stream."""


@dataclass(frozen=True)
class SnapshotOnly:
    """A ``snapshot=INITIAL_ONLY`` stream copied what exists: it stops without streaming."""


@dataclass(frozen=True)
class Invalidated:
    """The watched namespace was dropped or renamed and the stream stops (``on_invalidate="stop"``)."""

    error: StreamInvalidatedError


@dataclass(frozen=True)
class Reopen:
    """Re-open at once from the saved checkpoint, no backoff and no failure: after an event that
    cannot be decoded was given up on, or after an invalidate with ``on_invalidate="restart"``."""


@dataclass(frozen=True)
class LostOwnership:
    """The single-leader lease (or the checkpoint's epoch) says another instance owns the stream,
    or the bucket is handed over to another member of its fleet (its lease released once its
    checkpoint is saved): it stands by for the lease."""


@dataclass(frozen=True)
class HistoryLost:
    """The stream's position fell out of the oplog (ChangeStreamHistoryLost): ``on_history_lost``
    (or ``snapshot=WHEN_NEEDED``) decides where it goes on."""

    error: OperationFailure


@dataclass(frozen=True)
class Restart:
    """The cycle failed with ``error``: re-open with backoff, or fail, as the restart rule says."""

    error: BaseException


Outcome: TypeAlias = Stopped | SnapshotOnly | Invalidated | Reopen | LostOwnership | HistoryLost | Restart
"""How a cycle ended."""

ReadOutcome: TypeAlias = Stopped | Invalidated | Reopen | LostOwnership
"""How reading an open stream ended (:meth:`flowwarden.runtime.dispatch.EventDispatch.read`)."""

__all__ = [
    "HistoryLost",
    "Invalidated",
    "LostOwnership",
    "Outcome",
    "ReadOutcome",
    "Reopen",
    "Restart",
    "SnapshotOnly",
    "Stopped",
]
