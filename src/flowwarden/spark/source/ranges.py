"""The streaming source's micro-batches: token ranges, plans and retries.

A :class:`TokenRange` is one input partition of a micro-batch, between two offsets
(:mod:`flowwarden.spark.source.offsets`); a :class:`Plan` is where planning decided a
micro-batch ends, with the events it read; :class:`PlanAhead` plans the next micro-batch while
Spark runs the current one; :class:`TransientRetry` is the rule for errors worth another try.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from bson import json_util
from pymongo.errors import OperationFailure
from pyspark.sql.datasource import InputPartition

from flowwarden.errors import ConfigurationError, ResumePositionError
from flowwarden.events import token_cluster_time
from flowwarden.mongo import large_events as fragments
from flowwarden.mongo.failures import Failure, classify
from flowwarden.mongo.positions import refused_position
from flowwarden.spark.source.offsets import (
    BucketOffset,
    Offset,
    PartitionedOffset,
    ReadFromOffset,
    RequestedOffset,
    SkippedOffset,
    SnapshotOffset,
    StreamOffset,
    TimeOffset,
    TokenOffset,
)
from flowwarden.spark.source.options import OWNER

__all__ = [
    "TRANSIENT_RETRY_SECONDS",
    "Plan",
    "PlanAhead",
    "TokenRange",
    "TransientRetry",
    "bucket_offsets",
    "counting_needs_documents",
    "covers",
    "stream_offset",
]

TRANSIENT_RETRY_SECONDS = 60.0
"""How long a call keeps retrying transient errors before the query fails with the last one."""

_OWNER = OWNER


class TokenRange(InputPartition):
    """One input partition of a micro-batch: the events after ``start`` up to and including ``end``
    (none when they are equal), of one hash bucket when the source is partitioned.

    ``events``, when planning read them, is their BSON, one document after another in stream
    order; None makes ``read`` read the range from MongoDB.
    """

    def __init__(
        self,
        start: StreamOffset,
        end: StreamOffset,
        events: bytes | None = None,
        bucket: tuple[int, int] | None = None,
    ) -> None:
        super().__init__((start, end, bucket))
        self.start = start
        self.end = end
        self.events = events
        self.bucket = bucket
        """(index, count) of the hash bucket a partitioned read covers; None: every event."""

    def __repr__(self) -> str:
        bucket = "" if self.bucket is None else f", bucket={self.bucket[0]} of {self.bucket[1]}"
        return f"TokenRange({self.start!r}, {self.end!r}{bucket})"


def bucket_offsets(offset: Offset, count: int) -> tuple[BucketOffset, ...]:
    """The offsets of the ``count`` buckets a partitioned offset holds."""
    if not isinstance(offset, PartitionedOffset) or len(offset.buckets) != count:
        raise _partitions_changed(offset, count)
    return offset.buckets


def stream_offset(offset: Offset) -> StreamOffset:
    """``offset`` as the offset of a source read as one change stream (``partitions`` 1)."""
    kinds = (TokenOffset, TimeOffset, ReadFromOffset, SkippedOffset, SnapshotOffset, RequestedOffset)
    if isinstance(offset, kinds):
        return offset
    raise _partitions_changed(offset, 1)


def _partitions_changed(offset: Offset, count: int) -> ConfigurationError:
    held = len(offset.buckets) if isinstance(offset, PartitionedOffset) else 1
    return ConfigurationError(
        f"the query's checkpointLocation holds offsets for {held} partition(s), and the source "
        f"is read with partitions={count}; keep the number of partitions a query started with, "
        "or start the query again with a new checkpointLocation",
        owner=_OWNER,
        option="partitions",
        value=count,
    )


def counting_needs_documents(pipeline: tuple[dict[str, Any], ...]) -> bool:
    """Whether a stream that only finds where a micro-batch ends must still ask for the
    post-image (``fullDocument``, an ``updateLookup`` query per update) and pre-image: only
    when a stage reads them (a ``$match`` on a field of the document, say) or the pipeline
    splits large events, whose fragments depend on the documents' sizes. Otherwise they never
    change which events the stream returns: ``required`` images missing make the read that
    replays the range fail, as they would make the planning fail. ``pipeline`` is what the
    stream runs (:attr:`~flowwarden.spark.source.options.SourceOptions.stream_pipeline`)."""
    return fragments.splits_large_events(pipeline) or "fullDocument" in json_util.dumps(list(pipeline))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A planned micro-batch: the events after ``start`` up to ``end`` (``end == start``: none),
    their BSON back to back when planning read them, whether they are all an availableNow
    run is to read, and whether planning read every event there was (it stopped at the
    stream's end, not at a limit)."""

    start: StreamOffset
    end: StreamOffset
    events: bytes | None
    drained: bool
    caught_up: bool = False


class PlanAhead:
    """Plans the next micro-batch in a thread while Spark runs the current one.

    After planning a range that ended at ``end``, the reader starts planning the next one from
    ``end`` at once; Spark's next ``latestOffset(end, limit)`` takes that plan when it matches
    (same start, limit and availableNow target) and found events or the end of an availableNow
    run, or plans again itself. A plan is fixed only once ``latestOffset`` returns it (Spark logs
    it before running the batch), so one made ahead is as valid as one made later: it simply
    ends no later than where the stream was when it was made. Any error the thread met is left
    to the plan made again, which retries and reports it as usual.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._key: tuple[StreamOffset, int | None, TokenOffset | None] | None = None
        self._future: Future[Plan] | None = None

    def start(
        self,
        start: StreamOffset,
        max_rows: int | None,
        target: TokenOffset | None,
        plan: Callable[[StreamOffset, int | None], Plan],
    ) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowwarden-plan-ahead")
        self._key = (start, max_rows, target)
        self._future = self._pool.submit(plan, start, max_rows)

    def take(self, start: StreamOffset, max_rows: int | None, target: TokenOffset | None) -> Plan | None:
        future, key = self._future, self._key
        self._future = self._key = None
        if future is None:
            return None
        try:
            plan = future.result()
        except Exception:
            return None
        if key != (start, max_rows, target):
            return None  # not this range
        if plan.end == plan.start and not plan.drained:
            return None  # nothing then: whatever came since is read now
        return plan

    def cancel(self) -> None:
        future, self._future, self._key = self._future, None, None
        if future is not None:
            future.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class TransientRetry:
    """The source's retry rule: transient errors (flowwarden.mongo.failures) are waited out with
    backoff for up to TRANSIENT_RETRY_SECONDS; a refused position becomes ResumePositionError;
    an event over 16 MB without the split stage an error naming ``split_large_events``;
    anything else is raised as it is."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.reset()

    def reset(self) -> None:
        self.deadline = time.monotonic() + TRANSIENT_RETRY_SECONDS
        self.attempt = 0

    def after(self, error: Exception, position: Any) -> None:
        """Return after a pause when ``error`` is worth another try; raise otherwise."""
        if isinstance(error, OperationFailure) and refused_position(error):
            raise ResumePositionError(
                f"{_OWNER} {self.namespace}",
                token=position,
                reason=f"the server refused it: {error}",
                hint="Offsets live in the query's checkpointLocation: to read from a new position, "
                "start the query with a new checkpointLocation and the start_position you want.",
            ) from error
        if fragments.is_too_large(error):
            raise fragments.too_large_error(
                error,
                owner=f"{_OWNER} {self.namespace}",
                stream=self.namespace,
                remedy='.option("split_large_events", "true")',
            ) from error
        if classify(error) is not Failure.TRANSIENT or time.monotonic() >= self.deadline:
            raise error
        self.attempt += 1
        time.sleep(min(0.25 * 2 ** (self.attempt - 1), 5.0))


def covers(position: Mapping[str, Any], target: Mapping[str, Any]) -> bool:
    """Whether a stream whose post-batch resume token is ``position`` has returned every event
    that existed when ``target`` was taken: the token of a stream opened then, which MongoDB
    places one tick after the newest operation. A position at that operation's time, or later,
    covers them all (a position at or after ``target`` itself included)."""
    reached, end = token_cluster_time(position), token_cluster_time(target)
    return (reached.time, reached.inc + 1) >= (end.time, end.inc)
