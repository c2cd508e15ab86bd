"""The store rules as pure functions: every field of the record each write leaves behind.

The contract suite checks the positions through real stores; these check the rest of the record
(when it was written, the times next to the tokens, who is fenced) with a ``now`` of their own,
which a store's clock would hide.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from flowwarden.checkpoints import Checkpoint, SaveResult, SnapshotProgress
from flowwarden.checkpoints.contract import sample_token
from flowwarden.checkpoints.transitions import (
    apply_rewind,
    apply_save,
    apply_save_batch_end,
    apply_save_seen,
    apply_save_snapshot,
    require_processed_token,
)
from flowwarden.errors import FencedError
from flowwarden.events import token_datetime

STREAM = "orders"
NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
T1 = sample_token(1_700_000_000)
T2 = sample_token(1_700_000_100)
T3 = sample_token(1_700_000_200)
# A time no token here carries: a field that kept it was copied, not derived from a token.
EXPLICIT = datetime(2001, 1, 1, tzinfo=timezone.utc)


def _stored(**fields: Any) -> Checkpoint:
    return Checkpoint(stream_id=STREAM, epoch=2, updated_at=NOW - timedelta(days=1), **fields)


def test_a_save_without_a_processed_token_says_which_call_to_use_instead() -> None:
    with pytest.raises(ValueError) as raised:
        require_processed_token(Checkpoint(stream_id=STREAM, last_seen_token=T1))
    assert str(raised.value) == (
        "stream 'orders': save() needs last_processed_token; "
        "use save_seen() for a seen token or rewind() to clear a position"
    )


def test_a_save_keeps_the_time_it_was_given_and_the_seen_slot_as_stored() -> None:
    current = _stored(last_processed_token=T1, last_seen_token=T2, last_seen_at=EXPLICIT)
    given = datetime(2002, 2, 2, tzinfo=timezone.utc)
    result, record = apply_save(
        current, Checkpoint(stream_id=STREAM, last_processed_token=T3, last_processed_at=given, epoch=2), NOW
    )
    assert result is SaveResult.STORED
    assert record.last_processed_at == given
    assert (record.last_seen_token, record.last_seen_at) == (T2, EXPLICIT)
    assert record.updated_at == NOW


@pytest.mark.parametrize(
    "write",
    [
        lambda current: apply_save_seen(current, STREAM, T3, 1, NOW),
        lambda current: apply_save_batch_end(current, STREAM, T3, 1, NOW),
        lambda current: apply_save_snapshot(
            current, STREAM, SnapshotProgress(token=T3, namespaces=("db.c",), namespace="db.c"), 1, NOW
        ),
    ],
    ids=["save_seen", "save_batch_end", "save_snapshot"],
)
def test_a_fenced_write_names_the_stream_and_both_epochs(write: Callable[[Checkpoint], object]) -> None:
    with pytest.raises(FencedError) as raised:
        write(_stored(last_processed_token=T1))
    assert (raised.value.stream, raised.value.epoch, raised.value.stored_epoch) == (STREAM, 1, 2)
    assert "'orders'" in str(raised.value)


def test_a_newer_seen_token_brings_its_own_time_and_the_write_time() -> None:
    current = _stored(last_processed_token=T1, last_seen_token=T2)
    assert current.last_seen_at == token_datetime(T2)
    result, record = apply_save_seen(current, STREAM, T3, 2, NOW)
    assert result is SaveResult.STORED
    assert record.last_seen_token == T3
    assert record.last_seen_at == token_datetime(T3)
    assert record.updated_at == NOW


def test_a_first_seen_token_creates_the_record_with_the_write_time() -> None:
    result, record = apply_save_seen(None, STREAM, T1, 0, NOW)
    assert result is SaveResult.STORED
    assert (record.last_seen_token, record.last_seen_at, record.updated_at) == (T1, token_datetime(T1), NOW)


def test_a_newer_batch_end_records_the_write_time() -> None:
    current = _stored(last_processed_token=T1, batch_end_token=T2)
    result, record = apply_save_batch_end(current, STREAM, T3, 2, NOW)
    assert result is SaveResult.STORED
    assert (record.batch_end_token, record.updated_at) == (T3, NOW)


def test_a_rewind_with_no_record_creates_one_at_the_token_with_the_write_time() -> None:
    record = apply_rewind(None, STREAM, T1, NOW)
    assert record is not None
    assert (record.last_processed_token, record.last_processed_at, record.updated_at) == (
        T1,
        token_datetime(T1),
        NOW,
    )


def test_a_rewind_forgets_every_position_and_time_past_the_token() -> None:
    current = _stored(
        last_processed_token=T3,
        last_processed_at=EXPLICIT,
        last_seen_token=T3,
        last_seen_at=EXPLICIT,
        batch_end_token=T3,
        snapshot=SnapshotProgress(token=T2, namespaces=("db.c",), namespace="db.c"),
    )
    record = apply_rewind(current, STREAM, T1, NOW)
    assert record is not None
    assert (record.last_processed_token, record.last_processed_at) == (T1, token_datetime(T1))
    assert (record.last_seen_token, record.last_seen_at) == (None, None)
    assert (record.batch_end_token, record.snapshot) == (None, None)
    assert record.updated_at == NOW
    assert record.epoch == 2, "a rewind is not an ownership change"
    cleared = apply_rewind(current, STREAM, None, NOW)
    assert cleared is not None
    assert (cleared.resume_token, cleared.last_processed_at, cleared.last_seen_at, cleared.updated_at) == (
        None,
        None,
        None,
        NOW,
    )
