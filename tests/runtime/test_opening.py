"""The line a stream writes as it opens from a stored position: which token, and why that one."""

from __future__ import annotations

from flowwarden.checkpoints import Checkpoint
from flowwarden.runtime.opening import _why_stored, describe_token


def token(seconds: int) -> dict[str, str]:
    return {"_data": f"82{seconds:08X}000000012B0429296E1404"}


EARLY, LATE, LATER = token(1_800_000_000), token(1_800_000_100), token(1_800_000_200)


def test_a_stream_that_only_ever_idled_opens_after_its_last_seen_token() -> None:
    checkpoint = Checkpoint(stream_id="orders", last_seen_token=LATE)
    assert _why_stored(checkpoint) == (
        f"lastSeen {describe_token(LATE)} (stored when the stream first opened or last idled)"
    )


def test_a_last_seen_token_newer_than_the_last_processed_one_is_the_one_and_both_are_named() -> None:
    checkpoint = Checkpoint(stream_id="orders", last_processed_token=EARLY, last_seen_token=LATE)
    assert _why_stored(checkpoint) == (
        f"lastSeen {describe_token(LATE)}, newer than lastProcessed {describe_token(EARLY)}"
    )


def test_the_last_processed_token_with_the_events_so_far_when_it_is_the_newer() -> None:
    for seen in (None, EARLY):
        checkpoint = Checkpoint(
            stream_id="orders", last_processed_token=LATE, last_seen_token=seen, events_processed=7
        )
        assert _why_stored(checkpoint) == f"lastProcessed {describe_token(LATE)}, 7 events processed so far"


def test_a_batch_to_form_again_is_named_with_where_it_ends() -> None:
    checkpoint = Checkpoint(
        stream_id="orders", last_processed_token=LATE, events_processed=7, batch_end_token=LATER
    )
    assert _why_stored(checkpoint) == (
        f"lastProcessed {describe_token(LATE)}, 7 events processed so far; "
        f"the next batch is formed again up to {describe_token(LATER)}"
    )
    # A batch end the processed position reached is over: not named.
    done = Checkpoint(
        stream_id="orders", last_processed_token=LATER, events_processed=9, batch_end_token=LATE
    )
    assert _why_stored(done) == f"lastProcessed {describe_token(LATER)}, 9 events processed so far"
