"""flowwarden.spark.source.ranges on its own: the partitions of a micro-batch, where a planned
range ends, the plan made ahead in a thread, and the retry rule of the source's reads. No Spark
session and no server: these are the rules the reader applies."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pymongo.errors import AutoReconnect, OperationFailure

from flowwarden.checkpoints.contract import sample_token
from flowwarden.errors import ConfigurationError, ResumePositionError, StreamError
from flowwarden.mongo import codes
from flowwarden.spark.source import ranges
from flowwarden.spark.source.offsets import PartitionedOffset, TokenOffset, bucket_offset
from flowwarden.spark.source.ranges import (
    Plan,
    PlanAhead,
    TokenRange,
    TransientRetry,
    bucket_offsets,
    counting_needs_documents,
    covers,
    stream_offset,
)


def token(seconds: int, increment: int = 1) -> TokenOffset:
    return TokenOffset(sample_token(seconds, increment)["_data"])


# -- partitions -------------------------------------------------------------------------------------


def test_a_token_range_carries_its_range_to_spark_and_names_its_bucket() -> None:
    whole = TokenRange(token(1), token(2), b"")
    part = TokenRange(token(1), token(2), None, (1, 3))
    assert whole.value == (token(1), token(2), None) and part.value == (token(1), token(2), (1, 3))
    assert repr(whole) == f"TokenRange({token(1)!r}, {token(2)!r})"
    assert repr(part) == f"TokenRange({token(1)!r}, {token(2)!r}, bucket=1 of 3)"


def test_offsets_for_another_number_of_partitions_are_refused_naming_the_way_out() -> None:
    partitioned = PartitionedOffset(tuple(bucket_offset(token(1)) for _ in range(3)))
    assert bucket_offsets(partitioned, 3) == partitioned.buckets
    assert stream_offset(token(1)) == token(1)
    for call, held, asked in (
        (lambda: bucket_offsets(partitioned, 2), 3, 2),
        (lambda: bucket_offsets(token(1), 2), 1, 2),
        (lambda: stream_offset(partitioned), 3, 1),
    ):
        with pytest.raises(ConfigurationError) as refused:
            call()
        error = refused.value
        assert error.owner == "flowwarden streaming source"
        assert (error.option, error.value) == ("partitions", asked)
        assert error.problem == (
            f"the query's checkpointLocation holds offsets for {held} partition(s), and the source is read "
            f"with partitions={asked}; keep the number of partitions a query started with, or start the "
            "query again with a new checkpointLocation"
        )


def test_a_counting_stream_asks_for_documents_only_when_a_stage_reads_them_or_events_split() -> None:
    assert not counting_needs_documents(())
    assert not counting_needs_documents(({"$match": {"operationType": "insert"}},))
    assert counting_needs_documents(({"$match": {"fullDocument.qty": {"$gt": 1}}},))
    assert counting_needs_documents(({"$changeStreamSplitLargeEvent": {}},))


def test_a_position_covers_a_target_at_its_operation_or_later() -> None:
    target = sample_token(100, 5)  # one tick after the newest operation, (100, 4)
    assert covers(sample_token(100, 5), target)  # the same position
    assert covers(sample_token(101, 1), target)  # later
    assert covers(sample_token(100, 4), target)  # at the operation itself
    assert not covers(sample_token(100, 3), target)  # before it
    assert not covers(sample_token(99, 9), target)


# -- planning ahead ---------------------------------------------------------------------------------


def test_a_plan_made_ahead_is_taken_for_the_same_range_only() -> None:
    ahead = PlanAhead()
    found = Plan(token(1), token(5), b"events", drained=False)
    try:
        ahead.start(token(1), 10, None, lambda start, rows: found)
        assert ahead.take(token(1), 10, None) is found
        assert ahead.take(token(1), 10, None) is None  # taken once
        ahead.start(token(1), 10, None, lambda start, rows: found)
        assert ahead.take(token(1), 20, None) is None  # another limit
        ahead.start(token(1), 10, None, lambda start, rows: found)
        assert ahead.take(token(1), 10, token(9)) is None  # another availableNow target
        ahead.start(token(1), 10, None, lambda start, rows: Plan(token(1), token(1), None, drained=False))
        assert ahead.take(token(1), 10, None) is None  # nothing then: planned again now
        drained = Plan(token(1), token(1), None, drained=True)
        ahead.start(token(1), 10, token(1), lambda start, rows: drained)
        assert ahead.take(token(1), 10, token(1)) is drained  # the end of an availableNow run

        def fails(start: Any, rows: Any) -> Plan:
            raise AutoReconnect("gone")

        ahead.start(token(1), 10, None, fails)
        assert ahead.take(token(1), 10, None) is None  # planned again, which reports the error
    finally:
        ahead.cancel()


def test_plans_are_made_one_at_a_time_in_a_thread_of_their_own_which_cancel_waits_for() -> None:
    ahead = PlanAhead()
    release = threading.Event()
    running: list[str] = []
    threads: list[str] = []

    def slow(start: Any, rows: Any) -> Plan:
        running.append("begun")
        threads.append(threading.current_thread().name)
        release.wait(30)
        return Plan(start, start, None, drained=True)

    ahead.start(token(1), 10, None, slow)
    ahead.start(token(2), 10, None, slow)
    cancelling = threading.Thread(target=ahead.cancel, daemon=True)
    try:
        for _ in range(200):
            if running:
                break
            threading.Event().wait(0.01)
        cancelling.start()
        cancelling.join(0.3)
        assert running == ["begun"], "a second plan ran beside the first"
        assert cancelling.is_alive(), "cancel() returned while a plan was being made"
    finally:
        release.set()
        cancelling.join(30)
    assert not cancelling.is_alive()
    assert threads and all(name.startswith("flowwarden-plan-ahead") for name in threads)


# -- the retry rule ---------------------------------------------------------------------------------


def test_a_refused_position_fails_naming_the_stream_the_position_and_the_way_out() -> None:
    position = sample_token(7)
    with pytest.raises(ResumePositionError) as refused:
        refusal = OperationFailure("bad token", code=codes.INVALID_RESUME_TOKEN)
        TransientRetry("shop.orders").after(refusal, position)
    error = refused.value
    assert error.stream == "flowwarden streaming source shop.orders"
    assert error.token == position
    assert error.reason == "the server refused it: bad token"
    assert str(error).endswith(
        "Offsets live in the query's checkpointLocation: to read from a new position, start the query "
        "with a new checkpointLocation and the start_position you want."
    )
    assert isinstance(error.__cause__, OperationFailure)


def test_an_event_too_large_names_the_option_that_reads_it() -> None:
    too_large = OperationFailure("too big", code=codes.BSON_OBJECT_TOO_LARGE)
    with pytest.raises(StreamError) as failed:
        TransientRetry("shop.orders").after(too_large, sample_token(7))
    error = failed.value
    assert error.stream == "shop.orders" and error.__cause__ is too_large
    assert str(error).startswith("flowwarden streaming source shop.orders: a change event is over")
    assert 'Read such events with .option("split_large_events", "true")' in str(error)
    assert f"The server said: {too_large}" in str(error)


def test_transient_errors_are_waited_out_with_backoff_until_the_deadline(monkeypatch) -> None:
    clock = [1000.0]
    pauses: list[float] = []
    monkeypatch.setattr(ranges.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ranges.time, "sleep", pauses.append)
    retry = TransientRetry("shop.orders")
    assert (retry.deadline, retry.attempt) == (1000.0 + ranges.TRANSIENT_RETRY_SECONDS, 0)
    gone = AutoReconnect("gone")
    for _ in range(7):
        retry.after(gone, None)
    assert pauses == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(OperationFailure):  # not transient: raised at once
        retry.after(OperationFailure("unauthorized", code=13), None)
    clock[0] = retry.deadline  # the deadline reached
    with pytest.raises(AutoReconnect):
        retry.after(gone, None)
    clock[0] = 2000.0
    retry.reset()
    assert (retry.deadline, retry.attempt) == (2000.0 + ranges.TRANSIENT_RETRY_SECONDS, 0)
    retry.after(gone, None)
    assert pauses[-1] == 0.25
