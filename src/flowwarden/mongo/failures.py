"""Which errors a retry or a re-open can fix: the one classification flowwarden uses everywhere.

Streams, checkpoint stores, the checkpoint committer and the Spark source all ask
:func:`classify`; nothing else in flowwarden decides whether an error is worth another try.
Every error falls into one of three kinds:

* :attr:`Failure.TRANSIENT`: the deployment was briefly out of reach (a network error, an
  election, a server shutting down, the codes and labels PyMongo itself resumes change streams
  on). A stream re-opens from its saved checkpoint with backoff, for as long as it takes.
* :attr:`Failure.FATAL`: only an operator can fix it (credentials and permissions, a pipeline or
  option the server refuses, a checkpoint that cannot be read or resumed from, lost history under
  ``on_history_lost=FAIL``, a handler that gave up). The stream goes FAILED at once and its
  checkpoint is left exactly as it was.
* :attr:`Failure.UNKNOWN`: anything else. A stream re-opens with backoff at most
  ``max_restarts`` times in a row, then goes FAILED; an error that a re-open cannot fix
  therefore surfaces instead of looping forever.

Wrapped errors are judged by what they wrap: a :class:`~flowwarden.errors.CheckpointError` that
a store raised for a driver error is as transient (or fatal) as that driver error.
"""

from __future__ import annotations

import asyncio
import enum

from bson.errors import InvalidBSON
from pymongo.errors import (
    ConfigurationError as DriverConfigurationError,
)
from pymongo.errors import (
    ConnectionFailure,
    CursorNotFound,
    OperationFailure,
    PyMongoError,
)

from flowwarden.errors import (
    CheckpointError,
    CheckpointSaveFailedError,
    CommitterClosedError,
    FlowWardenError,
    UnreadableCheckpointError,
)


class Failure(enum.Enum):
    """What a failed operation's error says about trying again."""

    TRANSIENT = "transient"
    FATAL = "fatal"
    UNKNOWN = "unknown"


# Server error codes, one by one. PyMongo's own resume rule (any ConnectionFailure or
# CursorNotFound, and the ResumableChangeStreamError label) comes first in classify().
TRANSIENT_CODES = frozenset(
    {
        6,  # HostUnreachable
        7,  # HostNotFound
        43,  # CursorNotFound: the cursor timed out on the server; a re-open resumes it
        89,  # NetworkTimeout
        91,  # ShutdownInProgress
        134,  # ReadConcernMajorityNotAvailableYet
        189,  # PrimarySteppedDown
        262,  # ExceededTimeLimit
        9001,  # SocketException
        10058,  # LegacyNotPrimary
        10107,  # NotWritablePrimary
        11600,  # InterruptedAtShutdown
        11602,  # InterruptedDueToReplStateChange
        13435,  # NotPrimaryNoSecondaryOk
        13436,  # NotPrimaryOrSecondary
    }
)
FATAL_CODES = frozenset(
    {
        9,  # FailedToParse: e.g. a resume token whose _data is not hex
        11,  # UserNotFound
        13,  # Unauthorized
        18,  # AuthenticationFailed
        20,  # IllegalOperation: e.g. change streams on a deployment that has none
        59,  # CommandNotFound
        72,  # InvalidOptions: e.g. a read concern change streams refuse
        73,  # InvalidNamespace
        168,  # InvalidPipelineOperator
        260,  # InvalidResumeToken (after the startAfter retry for invalidate tokens)
        280,  # ChangeStreamFatalError: e.g. the resume token was not found in the stream
        286,  # ChangeStreamHistoryLost, when the strategy is FAIL (the runner handles the others)
        8000,  # AtlasError: Atlas refused the credentials or the operation
        10334,  # BSONObjectTooLarge: a change event over 16 MiB (split large events to read it)
        7182500,  # one field of an event too large for any $changeStreamSplitLargeEvent fragment
        40324,  # unrecognized pipeline stage name
        40415,  # unknown field in a command or stage
        40573,  # $changeStream needs a replica set or a sharded cluster
        40602,  # $changeStream must be the first stage
        40649,  # a resume token that is too short or not of a known format
    }
)
TRANSIENT_LABELS = ("ResumableChangeStreamError", "RetryableWriteError", "TransientTransactionError")


def classify(error: BaseException) -> Failure:
    """Whether ``error`` is transient, fatal or unknown; see the module docstring for the rules."""
    if isinstance(error, CheckpointSaveFailedError):
        # The committer gave up after consecutive failed saves: as fixable as the last of them.
        last = classify(error.last_error)
        return Failure.TRANSIENT if last is Failure.TRANSIENT else Failure.FATAL
    if isinstance(error, UnreadableCheckpointError):
        return Failure.FATAL
    if isinstance(error, CommitterClosedError):
        return Failure.UNKNOWN
    if isinstance(error, CheckpointError) and type(error) is CheckpointError:
        # A store's wrapper: judged by the error it wraps (a store without a cause: unknown).
        cause = error.__cause__
        return classify(cause) if cause is not None else Failure.UNKNOWN
    if isinstance(error, FlowWardenError):
        # Raised on purpose to tell an operator something (fencing, a handler that gave up, lost
        # history, a position or option that cannot work): never retried.
        return Failure.FATAL
    if isinstance(error, (ConnectionFailure, CursorNotFound)):
        return Failure.TRANSIENT
    if isinstance(error, OperationFailure):
        if any(error.has_error_label(label) for label in TRANSIENT_LABELS):
            return Failure.TRANSIENT
        if error.code in TRANSIENT_CODES:
            return Failure.TRANSIENT
        if error.code in FATAL_CODES:
            return Failure.FATAL
        return Failure.UNKNOWN
    if isinstance(error, DriverConfigurationError):
        return Failure.FATAL  # a URI or client option the driver refuses
    if isinstance(error, (PyMongoError, InvalidBSON)):
        return Failure.UNKNOWN
    if isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return Failure.TRANSIENT
    if isinstance(error, (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return Failure.FATAL  # a checkpoint file or directory the process may not use
    return Failure.UNKNOWN


def is_transient(error: BaseException) -> bool:
    return classify(error) is Failure.TRANSIENT


def is_fatal(error: BaseException) -> bool:
    return classify(error) is Failure.FATAL


def is_io_error(error: BaseException) -> bool:
    """Whether ``error`` came from talking to a store or a server (not a bug in Python code)."""
    return isinstance(error, (CheckpointError, PyMongoError, OSError, asyncio.TimeoutError))


def is_retryable_save_error(error: BaseException) -> bool:
    """Whether the checkpoint committer retries a failed save at its next trigger.

    An error from the store or the network (a :class:`~flowwarden.errors.CheckpointError`, a
    PyMongo error, an ``OSError`` or a timeout) that :func:`classify` does not call fatal: a
    fenced write, credentials the server refuses or a checkpoint that cannot be read are never
    retried. Anything else (TypeError, ValueError, ...) is a bug in the store or in what was
    saved; retrying cannot fix it, so the committer fails at once.
    """
    return is_io_error(error) and not is_fatal(error)


__all__ = [
    "FATAL_CODES",
    "TRANSIENT_CODES",
    "TRANSIENT_LABELS",
    "Failure",
    "classify",
    "is_fatal",
    "is_io_error",
    "is_retryable_save_error",
    "is_transient",
]
