"""flowwarden.mongo.failures: the shortcuts over classify that the committer and the stores ask."""

from __future__ import annotations

import pytest
from pymongo.errors import AutoReconnect, OperationFailure

from flowwarden.errors import CheckpointError, FencedError, UnreadableCheckpointError
from flowwarden.mongo.failures import Failure, classify, is_fatal, is_retryable_save_error, is_transient


def test_a_store_error_with_no_cause_is_unknown() -> None:
    assert classify(CheckpointError("stream 'orders': the store refused the write")) is Failure.UNKNOWN


@pytest.mark.parametrize(
    ("error", "transient", "fatal"),
    [
        (AutoReconnect("connection closed"), True, False),
        (OperationFailure("unauthorized", 13), False, True),
        (FencedError("orders", epoch=1, stored_epoch=2), False, True),
        (CheckpointError("no cause"), False, False),
        (ValueError("a bug"), False, False),
    ],
    ids=repr,
)
def test_is_transient_and_is_fatal_say_what_classify_says(
    error: BaseException, transient: bool, fatal: bool
) -> None:
    assert (is_transient(error), is_fatal(error)) == (transient, fatal)


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (CheckpointError("no cause"), True),
        (AutoReconnect("connection closed"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        # I/O errors an operator must fix: never retried.
        (FencedError("orders", epoch=1, stored_epoch=2), False),
        (UnreadableCheckpointError("epoch must be an integer"), False),
        (OperationFailure("unauthorized", 13), False),
        (PermissionError("checkpoints.json"), False),
        # Not I/O at all: a bug in the store or in what was saved.
        (TypeError("cannot encode object"), False),
        (ValueError("a bug"), False),
    ],
    ids=repr,
)
def test_a_failed_save_is_retried_only_for_io_errors_a_retry_can_fix(
    error: BaseException, retried: bool
) -> None:
    assert is_retryable_save_error(error) is retried
