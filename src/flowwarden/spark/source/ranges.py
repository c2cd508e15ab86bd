"""The streaming source's micro-batches: offsets, token ranges, plans and retries.

An offset is a dict kept as JSON in the query's checkpointLocation (see
:mod:`flowwarden.spark.source.reader`); a :class:`TokenRange` is one input partition of a micro-batch;
a :class:`Plan` is where planning decided a micro-batch ends, with the events it read;
:class:`PlanAhead` plans the next micro-batch while Spark runs the current one;
:class:`TransientRetry` is the rule for errors worth another try.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from bson import Timestamp, json_util
from pymongo.errors import OperationFailure
from pyspark.sql.datasource import InputPartition

from flowwarden.errors import ConfigurationError, ResumePositionError
from flowwarden.events import compare_tokens, token_cluster_time
from flowwarden.mongo import large_events as fragments
from flowwarden.mongo.failures import Failure, classify
from flowwarden.mongo.positions import refused_position
from flowwarden.spark.source.options import OWNER

__all__ = [
    "TRANSIENT_RETRY_SECONDS",
    "Offset",
    "Plan",
    "PlanAhead",
    "TokenRange",
    "TransientRetry",
    "bucket_offsets",
    "counting_needs_documents",
    "covers",
    "offset_timestamp",
    "offset_token",
    "timestamp_offset",
]

Offset = dict[str, Any]

TRANSIENT_RETRY_SECONDS = 60.0
"""How long a call keeps retrying transient errors before the query fails with the last one."""

_OWNER = OWNER


def timestamp_offset(ts: Timestamp) -> dict[str, int]:
    """A cluster time as an offset's ``{t, i}``."""
    return {"t": ts.time, "i": ts.inc}


def offset_timestamp(value: Mapping[str, Any]) -> Timestamp:
    """An offset's ``{t, i}`` as a cluster time."""
    return Timestamp(int(value["t"]), int(value["i"]))


def offset_token(offset: Mapping[str, Any]) -> dict[str, Any] | None:
    """The resume token an offset holds, or None (a start time); for an offset of the initial
    snapshot, the position its changes follow from."""
    data = offset.get("_data")
    if isinstance(data, str):
        return {"_data": data}
    snapshot = offset.get("snapshot")
    if isinstance(snapshot, Mapping) and isinstance(snapshot.get("token"), str):
        return {"_data": snapshot["token"]}
    return None


class TokenRange(InputPartition):
    """One input partition of a micro-batch: the events after ``start`` up to and including ``end``
    (none when they are equal), of one hash bucket when the source is partitioned.

    ``events``, when planning read them, is their BSON, one document after another in stream
    order; None makes ``read`` read the range from MongoDB.
    """

    def __init__(
        self,
        start: Offset,
        end: Offset,
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


def bucket_offsets(offset: Offset, count: int) -> list[Offset]:
    """The offsets of the ``count`` buckets a partitioned offset holds."""
    offsets = offset.get("partitions")
    if not isinstance(offsets, list) or len(offsets) != count:
        held = len(offsets) if isinstance(offsets, list) else 1
        raise ConfigurationError(
            f"the query's checkpointLocation holds offsets for {held} partition(s), and the source "
            f"is read with partitions={count}; keep the number of partitions a query started with, "
            "or start the query again with a new checkpointLocation",
            owner=_OWNER,
            option="partitions",
            value=count,
        )
    return [dict(item) for item in offsets]


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
    their BSON back to back when planning read them, and whether they are all an availableNow
    run is to read."""

    start: Offset
    end: Offset
    events: bytes | None
    drained: bool


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
        self._key: tuple[str, int | None, Any] | None = None
        self._future: Future[Plan] | None = None

    def start(
        self, start: Offset, max_rows: int | None, target: Any, plan: Callable[[Offset, int | None], Plan]
    ) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowwarden-plan-ahead")
        self._key = (json.dumps(start, sort_keys=True), max_rows, target)
        self._future = self._pool.submit(plan, start, max_rows)

    def take(self, start: Offset, max_rows: int | None, target: Any) -> Plan | None:
        future, key = self._future, self._key
        self._future = self._key = None
        if future is None:
            return None
        try:
            plan = future.result()
        except Exception:
            return None
        if key != (json.dumps(start, sort_keys=True), max_rows, target):
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
    covers them all."""
    if compare_tokens(position, target) >= 0:
        return True
    reached, end = token_cluster_time(position), token_cluster_time(target)
    return (reached.time, reached.inc + 1) >= (end.time, end.inc)
