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
from flowwarden.mongo import codes


class Failure(enum.Enum):
    """What a failed operation's error says about trying again."""

    TRANSIENT = "transient"
    FATAL = "fatal"
    UNKNOWN = "unknown"


# Server error codes (named in flowwarden.mongo.codes), by what a re-open does for them. PyMongo's
# own resume rule (any ConnectionFailure or CursorNotFound, and the ResumableChangeStreamError
# label) comes first in classify().
TRANSIENT_CODES = frozenset(
    {
        codes.HOST_UNREACHABLE,
        codes.HOST_NOT_FOUND,
        codes.CURSOR_NOT_FOUND,  # the cursor timed out on the server; a re-open resumes it
        codes.NETWORK_TIMEOUT,
        codes.SHUTDOWN_IN_PROGRESS,
        codes.READ_CONCERN_MAJORITY_NOT_AVAILABLE_YET,
        codes.PRIMARY_STEPPED_DOWN,
        codes.EXCEEDED_TIME_LIMIT,
        codes.SOCKET_EXCEPTION,
        codes.LEGACY_NOT_PRIMARY,
        codes.NOT_WRITABLE_PRIMARY,
        codes.INTERRUPTED_AT_SHUTDOWN,
        codes.INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
        codes.NOT_PRIMARY_NO_SECONDARY_OK,
        codes.NOT_PRIMARY_OR_SECONDARY,
    }
)
FATAL_CODES = frozenset(
    {
        codes.FAILED_TO_PARSE,
        codes.USER_NOT_FOUND,
        codes.UNAUTHORIZED,
        codes.AUTHENTICATION_FAILED,
        codes.ILLEGAL_OPERATION,
        codes.COMMAND_NOT_FOUND,
        codes.INVALID_OPTIONS,
        codes.INVALID_NAMESPACE,
        codes.INVALID_PIPELINE_OPERATOR,
        codes.INVALID_RESUME_TOKEN,  # after the startAfter retry for invalidate tokens
        codes.CHANGE_STREAM_FATAL_ERROR,
        codes.CHANGE_STREAM_HISTORY_LOST,  # when the strategy is FAIL (the runner handles the others)
        codes.ATLAS_ERROR,
        codes.BSON_OBJECT_TOO_LARGE,  # a change event over 16 MiB (split large events to read it)
        codes.SPLIT_EVENT_FIELD_TOO_LARGE,
        codes.UNRECOGNIZED_PIPELINE_STAGE,
        codes.UNKNOWN_FIELD,
        codes.CHANGE_STREAM_NEEDS_REPLICATION,
        codes.CHANGE_STREAM_NOT_FIRST_STAGE,
        codes.MALFORMED_RESUME_TOKEN,
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
