"""flowwarden.mongo.failures.classify: one rule for what a retry or a re-open can fix."""

from __future__ import annotations

import asyncio

import pytest
from bson.errors import InvalidBSON
from pymongo.errors import (
    AutoReconnect,
    ConfigurationError,
    CursorNotFound,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
)

from flowwarden.errors import (
    CheckpointError,
    CheckpointSaveFailedError,
    CommitterClosedError,
    FencedError,
    HandlerError,
    HistoryLostError,
    ResumePositionError,
    UnreadableCheckpointError,
)
from flowwarden.mongo.failures import FATAL_CODES, TRANSIENT_CODES, Failure, classify


def failure(code: int, labels: list[str] | None = None) -> OperationFailure:
    return OperationFailure("server says no", code, {"ok": 0, "code": code, "errorLabels": labels or []})


def wrapped(cause: BaseException) -> CheckpointError:
    """What a store raises for a driver error: a CheckpointError raised from it."""
    try:
        raise CheckpointError("stream 'orders': checkpoint load failed") from cause
    except CheckpointError as error:
        return error


@pytest.mark.parametrize(
    "error",
    [
        AutoReconnect("connection closed"),
        NetworkTimeout("timed out"),
        ServerSelectionTimeoutError("no primary"),
        NotPrimaryError("not primary", {}),
        CursorNotFound("cursor gone", 43),
        failure(2, ["ResumableChangeStreamError"]),
        failure(2, ["RetryableWriteError"]),
        ConnectionResetError(),
        TimeoutError(),
        asyncio.TimeoutError(),
        wrapped(AutoReconnect("connection refused")),
        CheckpointSaveFailedError("orders", failures=10, last_error=wrapped(NetworkTimeout("slow"))),
        *[failure(code) for code in sorted(TRANSIENT_CODES)],
    ],
    ids=repr,
)
def test_transient(error: BaseException) -> None:
    assert classify(error) is Failure.TRANSIENT


@pytest.mark.parametrize(
    "error",
    [
        *[failure(code) for code in sorted(FATAL_CODES)],
        wrapped(failure(13)),
        wrapped(failure(18)),
        wrapped(failure(8000)),
        UnreadableCheckpointError("epoch must be an integer"),
        FencedError("orders", epoch=1, stored_epoch=2),
        HandlerError("orders", token=None, attempts=3, cause=ValueError()),
        HistoryLostError("orders", checkpoint_time=None, oplog_start=None, oplog_end=None),
        ResumePositionError("orders", token={"_data": "82"}, reason="the server refused it"),
        CheckpointSaveFailedError("orders", failures=1, last_error=TypeError("bug in the store")),
        ConfigurationError("bad URI option"),
        PermissionError("checkpoints.json"),
        FileNotFoundError("no such directory"),
    ],
    ids=repr,
)
def test_fatal(error: BaseException) -> None:
    assert classify(error) is Failure.FATAL


@pytest.mark.parametrize(
    "error",
    [
        failure(2),  # BadValue: a server error flowwarden knows nothing particular about
        failure(11601),  # Interrupted: an operator killed the operation
        wrapped(failure(2)),
        CheckpointError("kept changing under a conditional write"),
        CommitterClosedError("closed"),
        InvalidBSON("bad bytes"),
        OSError(28, "No space left on device"),
        TypeError("a bug"),
        ValueError("a bug"),
    ],
    ids=repr,
)
def test_unknown(error: BaseException) -> None:
    assert classify(error) is Failure.UNKNOWN


def test_no_code_is_both_transient_and_fatal() -> None:
    assert not TRANSIENT_CODES & FATAL_CODES
