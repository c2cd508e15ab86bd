"""The Structured Streaming source ``flowwarden``: a change stream as a streaming DataFrame.

After ``flowwarden.spark.register(spark)``::

    spark.readStream.format("flowwarden")
        .option("uri", "mongodb://.../?replicaSet=rs0")
        .option("database", "shop").option("collection", "orders")
        .load()

returns the change-event columns of :data:`~flowwarden.spark.schema.EVENT_COLUMNS`.

Offsets are resume tokens, never timestamps. A micro-batch covers the events after its start
token up to and including its end token; ``read`` re-opens the change stream with
``startAfter=<start>`` and stops at ``<end>``, so a micro-batch replayed after a failure, or
re-run after a restart from the query's checkpointLocation, yields exactly the same events, and
the next one begins right after the last committed event. With ``split_large_events`` an event
over 16 MB arrives in fragments and is one row; its offset is its last fragment's token, and no
range ends between fragments (:mod:`flowwarden.mongo.large_events`). Offsets are the typed values
of :mod:`flowwarden.spark.source.offsets` (a token; a start time; the end of a micro-batch after
a history loss; one per hash bucket; a position in the initial copy): the four methods Spark
calls with offsets (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``) take and
return their versioned JSON objects, and everything below them works on the typed values.

Each range is read from MongoDB once. Planning a micro-batch reads its events in full (as raw
BSON, never decoded in Python) to find where it ends, after at most ``max_events_per_trigger``
events or :data:`PREFETCH_BYTES` bytes, and the micro-batch's input partition carries those
bytes to the executor, which only converts them to Arrow. A range Spark replays without
planning it again (a failed micro-batch re-run from the offset log after a restart) is read
again from MongoDB by ``read``, which yields the same events: the offsets alone define a range.

The reader holds no cursor between calls: every call opens its own change stream and closes
it, and ``read`` runs in any executor.

Errors are judged by :func:`flowwarden.mongo.failures.classify`, as the connector judges them:
transient ones (an election, a network blip) are retried for up to
:data:`TRANSIENT_RETRY_SECONDS` (a replay resumes after the last event it returned, so nothing
is returned twice); a position the server refuses or cannot find raises
:class:`~flowwarden.errors.ResumePositionError` at once; anything else fails the query. ``read`` takes
the events as raw BSON (``RawBSONDocument``), so the compiled converter of
:mod:`flowwarden.spark.convert.native` turns them into Arrow buffers without decoding them in Python.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from struct import Struct
from typing import Any, TypeVar

import pymongo
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from flowwarden.config.choices import SchemaMode, Snapshot, StartPosition
from flowwarden.errors import ConfigurationError, StreamError
from flowwarden.events import compare_tokens, token_datetime
from flowwarden.mongo import codes
from flowwarden.mongo.buckets import bucket_stage
from flowwarden.mongo.initial_copy import copy_filter
from flowwarden.mongo.large_events import JoinedChangeStream, splits_large_events
from flowwarden.mongo.positions import oplog_edge, recover_from_history_loss
from flowwarden.mongo.raw_events import RawEvent
from flowwarden.mongo.signals import RequestProblem, RequestState
from flowwarden.spark.schema import (
    CORRUPT_RECORD_COLUMN,
    EVENT_COLUMNS,
    RESCUED_DATA_COLUMN,
    non_nullable_paths,
)
from flowwarden.spark.source import requested as source_requested
from flowwarden.spark.source import snapshot as source_snapshot
from flowwarden.spark.source.offsets import (
    Offset,
    PartitionedOffset,
    ReadFromOffset,
    RequestedOffset,
    SkippedOffset,
    SnapshotOffset,
    StreamOffset,
    TimeOffset,
    TokenOffset,
    bucket_offset,
    parse_offset,
    resume_token,
)
from flowwarden.spark.source.options import OWNER, SourceOptions
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

__all__ = ["FlowWardenDataSource", "FlowWardenStreamReader", "SourceOptions", "TokenRange"]

_OWNER = OWNER
log = logging.getLogger(__name__)
ARROW_BATCH_ROWS = 10_000
PREFETCH_BYTES = 64 * 1024 * 1024
"""The most raw BSON one micro-batch carries from planning to its executor; a micro-batch whose
events reach it ends there, whatever ``max_events_per_trigger`` allows."""
# How long a read waits for the events of its range to show up again before giving up: they
# were seen when the range was planned, so only a lost oplog or an unreachable server delays them.
READ_STALL_SECONDS = 120.0
# Events per batch of a planning stream (at most), and of a stream replaying a range.
MAX_BATCH_EVENTS = 10_000
REPLAY_BATCH_EVENTS = 2_000

_T = TypeVar("_T")
# Guards the creation of a reader's clients, which planning threads may ask for at once.
_CLIENTS = threading.Lock()


class FlowWardenDataSource(DataSource):
    """The ``flowwarden`` data source: reads a MongoDB change stream as a stream of events.

    Options (all strings): ``uri`` (required), ``database``, ``collection`` (none: the whole
    cluster; only database: that database), ``pipeline`` (a JSON array of stages run after
    ``$changeStream``; they must keep ``_id``), ``full_document`` (default, updateLookup,
    whenAvailable, required), ``full_document_before_change`` (off, whenAvailable, required),
    ``start_position`` (latest: events after the query first starts; earliest: the oldest entry
    in the oplog; timestamp: from ``start_at``, an ISO-8601 date-time), ``max_events_per_trigger``
    (default 10000; ``none`` for no limit), ``on_history_lost`` (fail, resume_from_oplog_start,
    resume_from_now), ``schema`` (a DDL field list typing ``full_document``, e.g.
    ``"sku STRING, qty INT"``; ``infer``: sampled from the collection when the query starts,
    ``sample_size`` documents (default 1000) with ``schema_hints`` laid over them, and a
    ``_rescued_data`` column; without it the document is Extended JSON), ``mode`` (permissive,
    dropmalformed, failfast: what a document that does not fit ``schema`` does), ``json_mode``
    (canonical, relaxed), ``split_large_events`` (true: events over 16 MB are split by the
    server and read as one row each; false, the default: such an event fails the query),
    ``snapshot`` (never; initial: the existing documents first, then the changes; initial_only:
    the documents only; see :mod:`~flowwarden.spark.source.snapshot`), ``collections`` and
    ``exclude_collections`` (database and cluster sources: names or ``re:`` patterns matching the
    whole name, ``db.coll`` for a cluster), ``exclude_fields`` (dotted paths the server removes
    from events and copied documents), ``hash_fields`` with ``hash_salt_env`` (dotted paths whose
    values become the hex SHA-256 of the salt and the value, in the events' BSON before they are
    converted); lists are JSON arrays or names separated by commas.

    The start position only matters for a new query: a query restarted from its
    checkpointLocation continues after its last committed offset.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Imported here: checking the option strings needs pydantic and the decorators' option
        # models, which only this process (where the query is defined) loads; Spark's planner and
        # executor processes unpickle the checked options.
        from flowwarden.spark.source.parsing import parse_source_options

        self.source_options = parse_source_options(options)

    @classmethod
    def name(cls) -> str:
        return "flowwarden"

    def schema(self) -> str:
        # Spark pickles this object after asking, so the inferred schema reaches streamReader.
        self.source_options = self.source_options.with_inferred_schema()
        return self.source_options.schema_ddl_of_events()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FlowWardenStreamReader(self.source_options.with_inferred_schema(), schema)


class FlowWardenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches as token ranges and replays a range on any executor.

    Hard rule: a range is (start, end], both resume positions; ``read`` of a range yields the
    same events every time it runs, in change-stream order.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        names = [field.name for field in schema.fields]
        expected = list(EVENT_COLUMNS)
        if options.schema_ddl and options.mode is SchemaMode.PERMISSIVE:
            expected.append(CORRUPT_RECORD_COLUMN)
        if options.infer_schema:
            expected.append(RESCUED_DATA_COLUMN)
        if names != expected:
            raise ConfigurationError(
                f"the schema's columns {names} are not the change-event columns",
                owner=_OWNER,
                option="schema",
                allowed=", ".join(expected)
                + " (type full_document with the schema option rather than readStream.schema())",
            )
        document = schema["full_document"].dataType
        self.document_schema: Any = document if isinstance(document, StructType) else None
        if options.document_spec is not None:
            # The spec also knows which strings hold Extended JSON, which Spark's schema cannot say.
            self.document_schema = options.document_spec
        required = non_nullable_paths(document, "full_document")
        if required:
            raise ConfigurationError(
                f"the schema declares {', '.join(required)} NOT NULL; a streaming source's fields "
                "are nullable (deletes carry no document, and mode=permissive writes null where a "
                "value does not fit)",
                owner=_OWNER,
                option="schema",
                allowed="fields without NOT NULL",
            )
        self._buckets = options.partitions
        self._target: TokenOffset | None = None
        # Where planning found every event of the availableNow run read, per bucket (None: the
        # whole stream).
        self._drained: dict[int | None, StreamOffset] = {}
        # The last range planned, with its events.
        self._planned: Plan | None = None
        self._ahead = PlanAhead()
        self._client: pymongo.MongoClient[dict[str, Any]] | None = None
        self._raw_client: pymongo.MongoClient[RawEvent] | None = None
        # Snapshot requests (the name option), read by the driver; whether the last plan read
        # every event there was (a requested copy begins only then).
        self._requests: source_requested.Requests | None = None
        self._caught_up = False

    # The reader is pickled to executors for read(): the client stays behind.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_raw_client"] = None
        state["_requests"] = None
        state["_planned"] = None
        state["_ahead"] = PlanAhead()
        return state

    # ------------------------------------------------------------------------------------------
    # driver side

    def initialOffset(self) -> dict[str, Any]:
        return self._first_offset().to_dict()

    def _first_offset(self) -> Offset:
        offset = self._retrying(self._initial_offset, None)
        if self.options.snapshot is not Snapshot.NEVER:
            # The copy's namespaces are fixed when the query begins, and the first one's bound
            # is read after the position was taken (see source_snapshot).
            options = self.options
            names = self._retrying(
                lambda: source_snapshot.namespaces(
                    self._client_for(), options.database, options.collection, options.selection
                ),
                None,
            )
            first = names[0] if names else None
            end_id = self._retrying(
                lambda: source_snapshot.bound(self._raw_client_for(), first, copy_filter(options.pipeline)),
                None,
            )
            token = resume_token(offset)
            assert token is not None, "a query with a snapshot starts at the stream's position"
            return source_snapshot.first_offset(token, names, end_id)
        return offset if self._buckets == 1 else PartitionedOffset((offset,) * self._buckets)

    def _initial_offset(self) -> TokenOffset | TimeOffset:
        position = self.options.start_position
        if position is StartPosition.AT_TIME:
            assert self.options.start_at is not None
            return TimeOffset(self.options.start_at)
        if position is StartPosition.EARLIEST:
            oldest = oplog_edge(self._client_for(), 1)
            if oldest is None:
                raise StreamError(
                    f"{_OWNER} {self.options.namespace}: start_position=EARLIEST needs to read the "
                    "oplog (local.oplog.rs; through a mongos, on every shard), which this user cannot; "
                    "grant read on 'local' (through a mongos: read on config.shards, and a shard-local "
                    "user with read on 'local' on every shard) or choose RESUME or AT_TIME",
                    stream=self.options.namespace,
                )
            return TimeOffset(oldest)
        # RESUME and LATEST: a new query starts at the stream's current position (a restarted
        # one continues from its offsets and never asks).
        with self._watch({}, position_only=True) as stream:
            token = stream.resume_token
        if token is None:
            raise StreamError(
                f"{_OWNER} {self.options.namespace}: the server returned no postBatchResumeToken; "
                "MongoDB 4.0.7+ replica sets and sharded clusters send one",
                stream=self.options.namespace,
            )
        return TokenOffset(token["_data"])

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_events_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an availableNow run: the position of the stream right now."""
        with self._watch({}, position_only=True) as stream:
            token = stream.resume_token
        self._target = TokenOffset(token["_data"]) if token is not None else None
        self._drained = {}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Read forward from ``start`` to find the end of the next micro-batch.

        The end is the token of the ``max_rows``-th event (or of the event that brings the
        micro-batch to :data:`PREFETCH_BYTES`), or, when fewer events are there, the stream's
        postBatchResumeToken (everything up to it has been seen). With no new event the offset
        stays ``start`` and Spark runs no micro-batch. The events read are kept for
        :meth:`partitions` to hand to the executor.
        """
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self._latest(self._parse(start), max_rows).to_dict()

    def _latest(self, offset: Offset, max_rows: int | None) -> Offset:
        if self._buckets > 1:
            return self._latest_partitioned(offset, max_rows)
        start = stream_offset(offset)
        if self.options.name is not None:
            self._retrying(self._look_for_requests, start)
        plan = self._ahead.take(start, max_rows, self._target)
        if plan is not None and isinstance(plan.end, RequestedOffset) and not self._copying(plan.end):
            plan = None  # a chunk planned ahead of a cancel: the copy ends now instead
        if plan is None:
            plan = self._retrying(lambda: self._plan(start, max_rows), start)
        self._planned = plan if plan.events is not None else None
        self._caught_up = plan.caught_up
        if plan.drained:
            self._drained[None] = plan.end
        elif plan.end != start:
            self._ahead.start(plan.end, max_rows, self._target, self._plan)
        return plan.end

    def _latest_partitioned(self, start: Offset, max_rows: int | None) -> Offset:
        """Each bucket's next range, planned at once on threads of its own; every bucket gets an
        equal share of ``max_rows``. Planning only counts: the executors read the events."""
        starts = bucket_offsets(start, self._buckets)
        share = None if max_rows is None else -(-max_rows // self._buckets)

        def plan(index: int) -> Plan:
            return self._retrying(lambda: self._plan(starts[index], share, index), starts[index])

        with ThreadPoolExecutor(self._buckets, thread_name_prefix="flowwarden-plan") as pool:
            plans = list(pool.map(plan, range(self._buckets)))
        for index, planned in enumerate(plans):
            if planned.drained:
                self._drained[index] = planned.end
        ends = tuple(bucket_offset(planned.end) for planned in plans)
        return start if ends == starts else PartitionedOffset(ends)

    def _plan(self, start: StreamOffset, max_rows: int | None, bucket: int | None = None) -> Plan:
        """The next micro-batch from ``start`` (of one hash bucket, when given); touches no state
        of the reader, so it also runs in planning threads."""
        if isinstance(start, SnapshotOffset):
            copied = self._plan_copy(start, max_rows)
            if copied is not None:
                return copied
        copying = bucket is None and self._requests is not None
        if copying:
            chunk = self._plan_requested(start, max_rows, self._caught_up)
            if chunk is not None:
                return chunk
        try:
            plan = self._scan(start, self._resume_options(start), max_rows, bucket)
        except OperationFailure as error:
            if error.code != codes.CHANGE_STREAM_HISTORY_LOST:
                raise
            return self._after_history_lost(start, max_rows, error, bucket)
        if copying and plan.end == start and plan.caught_up and not self._caught_up:
            # At the stream's head with nothing new (a query's first plan, say): a copy may begin.
            return self._plan_requested(start, max_rows, True) or plan
        return plan

    def _plan_copy(self, start: SnapshotOffset, max_rows: int | None) -> Plan | None:
        """The next micro-batch of the initial snapshot, the empty one that closes it, or None
        once it is closed and the changes follow (see :mod:`~flowwarden.spark.source.snapshot`)."""
        if start.done:
            if self.options.snapshot is Snapshot.INITIAL_ONLY:
                return Plan(start, start, None, drained=self._target is not None)
            return None
        chunk = source_snapshot.plan_chunk(
            self._raw_client_for(),
            start,
            min(max_rows or MAX_BATCH_EVENTS, MAX_BATCH_EVENTS),
            PREFETCH_BYTES,
            copy_filter(self.options.pipeline),
            self.options.snapshot_projection,
        )
        if chunk is None:
            return Plan(start, source_snapshot.done_offset(start), None, drained=False)
        end, rows = chunk
        return Plan(start, end, rows, drained=False)

    def _look_for_requests(self) -> None:
        if self._requests is None:
            self._requests = source_requested.Requests(self._client_for(), self.options)
        self._requests.poll()

    def _copying(self, offset: RequestedOffset) -> bool:
        """Whether the request of ``offset`` was still requested when last looked for."""
        requests = self._requests
        return requests is not None and requests.state_of(offset.request) is RequestState.REQUESTED

    def _plan_requested(self, start: StreamOffset, max_rows: int | None, caught_up: bool) -> Plan | None:
        """The next micro-batch of an incremental snapshot (see
        :mod:`~flowwarden.spark.source.requested`): one chunk after the changes up to its high
        watermark; None when no copy goes on from ``start`` (the scan plans the changes). A copy
        begins only at a plain offset the query has ``caught_up`` to."""
        requests = self._requests
        assert requests is not None
        namespace = self.options.namespace
        if isinstance(start, RequestedOffset):
            state = requests.state_of(start.request)
            if state is not RequestState.REQUESTED:
                why = "no longer in _fw_signals" if state is None else state.value
                ends = "%s %s: incremental snapshot %s ends: its request is %s"
                log.warning(ends, _OWNER, namespace, start.request, why)
                return None
            request = requests.known(start.request)
            if request is not None and requests.name in request.finished:
                return None  # copied to the end: the changes follow
            progress = start
        elif isinstance(start, TokenOffset) and caught_up and requests.pending is not None:
            request = requests.pending
            try:
                progress = source_requested.begin(
                    request,
                    self.options,
                    client=self._client_for(),
                    raw_client=self._raw_client_for(),
                    token=start.token,
                    query=copy_filter(self.options.pipeline),
                )
            except RequestProblem as problem:
                log.warning("%s %s: snapshot request %s refused: %s", _OWNER, namespace, request.id, problem)
                requests.refuse(request, str(problem))
                return None
            copying = ", ".join(progress.namespaces)
            log.info("%s %s: incremental snapshot %s of %s begins", _OWNER, namespace, request.id, copying)
        else:
            return None
        size = (request.chunk_size if request is not None else None) or max_rows or MAX_BATCH_EVENTS
        chunk = source_requested.plan_chunk(
            progress,
            raw_client=self._raw_client_for(),
            signals_database=self.options.signals_database,
            name=requests.name,
            query=copy_filter(self.options.pipeline),
            chunk_size=min(size, MAX_BATCH_EVENTS),
            watch=self._watch,
            max_bytes=PREFETCH_BYTES,
            projection=self.options.snapshot_projection,
        )
        if chunk is None:
            requests.finished(progress.request)
            log.info(
                "%s %s: incremental snapshot %s done: %d row(s)",
                _OWNER,
                namespace,
                progress.request,
                progress.copied,
            )
            return None
        return Plan(start, chunk.end, chunk.data, drained=False, caught_up=True)

    def _scan(
        self, start: StreamOffset, resume: dict[str, Any], max_rows: int | None, bucket: int | None
    ) -> Plan:
        """Where the micro-batch from ``start`` ends. The whole stream's planning keeps the
        events' BSON for the executor; a bucket's only counts them (the executor reads them)."""
        until = self._target
        target = None if until is None else resume_token(until)
        begin = resume_token(start)
        if target is not None and begin is not None:
            if compare_tokens(begin, target) >= 0 or start == self._drained.get(bucket):
                # An availableNow run that reached its end: no need to ask the server.
                return Plan(start, start, None, drained=False)
        count = size = 0
        last: dict[str, Any] | None = None
        caught_up = False
        events: list[bytes] = []
        keep = bucket is None
        # A batch no larger than the plan can take: the server fills a batch up to 16 MiB, which
        # for a filtered or counting stream means scanning far past where the plan stops.
        batch_size = None if max_rows is None else min(max_rows, MAX_BATCH_EVENTS)
        watch = self._watch(
            resume, raw=True, bucket=self._bucket(bucket), counting=not keep, batch_size=batch_size
        )
        with watch as stream:
            while (max_rows is None or count < max_rows) and size < PREFETCH_BYTES:
                if target is not None:
                    # Once the stream's postBatchResumeToken (after a batch's last event, or of
                    # an empty first batch) covers every event the availableNow run is to read,
                    # a getMore would only wait max_await_time_ms for nothing.
                    reached = _position(stream)
                    if reached is not None and reached != (last or begin) and covers(reached, target):
                        caught_up = True
                        break
                event = stream.try_next()
                if event is None:
                    caught_up = True
                    break
                token = event["_id"]
                if target is not None and compare_tokens(token, target) > 0:
                    break
                if keep:
                    raw = event.raw
                    events.append(raw if isinstance(raw, bytes) else bytes(raw))
                    size += len(raw)
                last = token
                count += 1
            position = stream.resume_token
        if last is None:
            drained = caught_up and target is not None
            return Plan(start, start, None, drained=drained, caught_up=caught_up)
        end = TokenOffset(last["_data"])
        if caught_up and position is not None and compare_tokens(position, last) > 0:
            end = TokenOffset(position["_data"])
            if until is not None and target is not None and compare_tokens(position, target) > 0:
                end = until
        kept = b"".join(events) if keep else None
        return Plan(start, end, kept, drained=caught_up and target is not None, caught_up=caught_up)

    def _after_history_lost(
        self, start: StreamOffset, max_rows: int | None, error: OperationFailure, bucket: int | None
    ) -> Plan:
        token = resume_token(start)
        client = self._client_for()
        recovery = recover_from_history_loss(
            self.options.on_history_lost,
            stream=f"{_OWNER} {self.options.namespace}",
            lost_from=token_datetime(token) if token else None,
            oldest=oplog_edge(client, 1),
            newest=oplog_edge(client, -1),
            error=error,
        )
        if recovery.start:
            plan = self._scan(start, recovery.start, max_rows, bucket)
            if plan.end == start:
                return plan
            end = resume_token(plan.end)
            assert end is not None, "a micro-batch that read events ends at a resume token"
            read_from = ReadFromOffset(end["_data"], recovery.start["start_at_operation_time"])
            return dataclasses.replace(plan, end=read_from)
        with self._watch({}, position_only=True) as stream:
            now = stream.resume_token
        if now is None:
            raise StreamError(
                f"{_OWNER} {self.options.namespace}: history lost and no current position to skip to",
                stream=self.options.namespace,
            ) from error
        return Plan(start, SkippedOffset(now["_data"]), None, drained=False)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """The range as one partition, carrying the events planning read for it, if it did; or
        one partition per hash bucket, each read by an executor of its own."""
        return self._partitions(self._parse(start), self._parse(end))

    def _partitions(self, first: Offset, last: Offset) -> list[InputPartition]:
        if self._buckets > 1:
            starts, ends = bucket_offsets(first, self._buckets), bucket_offsets(last, self._buckets)
            ranges = zip(starts, ends, strict=True)
            return [TokenRange(s, e, bucket=(i, self._buckets)) for i, (s, e) in enumerate(ranges)]
        start, end = stream_offset(first), stream_offset(last)
        planned = self._planned
        if planned is not None and planned.start == start and planned.end == end:
            return [TokenRange(start, end, planned.events)]
        return [TokenRange(start, end)]

    def commit(self, end: dict[str, Any]) -> None:
        """Drop the events planned up to ``end``: the server keeps no state for a reader."""
        committed = self._parse(end)
        if self._planned is not None and self._planned.end == committed:
            self._planned = None

    def stop(self) -> None:
        self._ahead.cancel()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._raw_client is not None:
            self._raw_client.close()
            self._raw_client = None

    # ------------------------------------------------------------------------------------------
    # executor side

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Yield the events of one token range as Arrow record batches, in stream order."""
        assert isinstance(partition, TokenRange)
        start, end = partition.start, partition.end
        if isinstance(end, SkippedOffset) or end == start:
            return
        end_token = resume_token(end)
        assert end_token is not None, f"a micro-batch must end at a resume token, got {end!r}"
        expected = _spark_arrow_schema(self.schema)
        if partition.events is not None:
            yield from self._batches(_planned_events(partition.events), expected)
            return
        events: Iterable[RawBSONDocument]
        if isinstance(end, SnapshotOffset):
            # A micro-batch of the initial snapshot that planning did not hand over, read again;
            # the one that closes the copy holds no document.
            assert isinstance(start, SnapshotOffset), f"a range of the copy starts in it, not at {start!r}"
            query = copy_filter(self.options.pipeline)
            if end.done:
                events = ()
            else:
                events = source_snapshot.replay_chunk(
                    self._raw_client_for(), start, end, query, self.options.snapshot_projection
                )
        elif isinstance(end, RequestedOffset):
            # A micro-batch of an incremental snapshot: its events, then its chunk read again.
            changes = self._replay(self._resume_options(start), end_token, None)
            events = source_requested.replay_rows(
                self._raw_client_for(),
                start,
                end,
                copy_filter(self.options.pipeline),
                changes,
                self.options.snapshot_projection,
            )
        else:
            if isinstance(end, ReadFromOffset):
                resume: dict[str, Any] = {"start_at_operation_time": end.read_from}
            else:
                resume = self._resume_options(start)
            events = self._replay(resume, end_token, partition.bucket)
        try:
            yield from self._batches(events, expected)
        finally:
            self.stop()

    def _replay(
        self, resume: dict[str, Any], end: dict[str, Any], bucket: tuple[int, int] | None = None
    ) -> Iterator[RawBSONDocument]:
        """The events after ``resume`` up to and including ``end``; after a transient error the
        stream is opened again after the last event returned, so none comes twice."""
        retry = TransientRetry(self.options.namespace)
        while True:
            try:
                for event in self._replay_once(resume, end, bucket):
                    yield event
                    resume = {"start_after": {"_data": event["_id"]["_data"]}}
                    retry.reset()
                return
            except Exception as error:
                retry.after(error, resume)

    def _replay_once(
        self, resume: dict[str, Any], end: dict[str, Any], bucket: tuple[int, int] | None
    ) -> Iterator[RawBSONDocument]:
        deadline = time.monotonic() + READ_STALL_SECONDS
        with self._watch(resume, raw=True, bucket=bucket, batch_size=REPLAY_BATCH_EVENTS) as stream:
            while True:
                event = stream.try_next()
                if event is None:
                    position = stream.resume_token
                    if position is not None and compare_tokens(position, end) >= 0:
                        return
                    if time.monotonic() > deadline:
                        raise StreamError(
                            f"{_OWNER} {self.options.namespace}: the events up to {end['_data']} "
                            f"did not come back within {READ_STALL_SECONDS:.0f} s while replaying a "
                            "micro-batch; the server or its oplog changed under the query",
                            stream=self.options.namespace,
                        )
                    continue
                order = compare_tokens(event["_id"], end)
                if order > 0:
                    return
                yield event
                if order == 0:
                    return
                # After a batch's last event the resume token is the batch's postBatchResumeToken:
                # once it reaches the end, no event is left in the range, and a getMore would only
                # wait max_await_time_ms to say so.
                reached = _position(stream)
                if reached is not None and compare_tokens(reached, end) >= 0:
                    return
                deadline = time.monotonic() + READ_STALL_SECONDS

    def _retrying(self, call: Callable[[], _T], start: StreamOffset | None) -> _T:
        """``call()``, tried again while it fails with transient errors (see the module docstring)."""
        retry = TransientRetry(self.options.namespace)
        while True:
            try:
                return call()
            except Exception as error:
                retry.after(error, None if start is None else start.to_dict())

    def _batches(self, events: Iterable[RawBSONDocument], expected: Any) -> Iterator[Any]:
        """``events`` as Arrow record batches, converted :data:`ARROW_BATCH_ROWS` at a time."""
        # Imported here: only executors convert, and the planning process Spark starts for each
        # query should not spend a quarter of a second importing pyarrow it never uses.
        from flowwarden.spark.convert.arrow import events_to_arrow

        hasher = self.options.hasher
        # Hashed fields are hashed in the events' BSON, before either converter reads them.
        iterator = iter(events) if hasher is None else map(hasher, events)
        while chunk := list(itertools.islice(iterator, ARROW_BATCH_ROWS)):
            batch = events_to_arrow(
                chunk,
                schema=self.document_schema,
                mode=self.options.mode,
                json_mode=self.options.json_mode,
                rescued_data=self.options.infer_schema,
            )
            yield from batch.table.cast(expected).to_batches()

    # ------------------------------------------------------------------------------------------
    # MongoDB

    def _client_for(self) -> pymongo.MongoClient[dict[str, Any]]:
        with _CLIENTS:  # planning threads may ask at once: one client, none left open
            if self._client is None:
                self._client = pymongo.MongoClient(self.options.uri, appname="flowwarden-spark")
            return self._client

    def _raw_client_for(self) -> pymongo.MongoClient[RawEvent]:
        """A client whose change streams deliver events as raw BSON, for ``read``."""
        with _CLIENTS:
            if self._raw_client is None:
                self._raw_client = pymongo.MongoClient(
                    self.options.uri, appname="flowwarden-spark", document_class=RawEvent
                )
            return self._raw_client

    def _resume_options(self, start: StreamOffset) -> dict[str, Any]:
        if isinstance(start, TimeOffset):
            return {"start_at_operation_time": start.at}
        # startAfter rather than resumeAfter: it also continues after an invalidate event.
        return {"start_after": resume_token(start)}

    def _parse(self, offset: dict[str, Any]) -> Offset:
        """An offset Spark hands the reader (see :mod:`~flowwarden.spark.source.offsets`)."""
        return parse_offset(offset, stream=self.options.namespace)

    def _bucket(self, index: int | None) -> tuple[int, int] | None:
        return None if index is None else (index, self._buckets)

    def _watch(
        self,
        resume: dict[str, Any],
        *,
        raw: bool = False,
        position_only: bool = False,
        bucket: tuple[int, int] | None = None,
        counting: bool = False,
        batch_size: int | None = None,
    ) -> Any:
        """A change stream with the source's options from ``resume``.

        ``raw`` streams deliver :class:`~flowwarden.mongo.raw_events.RawEvent` events.
        ``position_only`` streams return no event (``batchSize: 0``): their resume token is the
        position they opened at. ``bucket`` (index, count) keeps one hash bucket of the events
        (:func:`~flowwarden.mongo.buckets.bucket_stage`, ahead of the user's stages).
        ``counting`` streams only find where a micro-batch ends: they see the same events but
        bring back only ``_id``, and look up no document the pipeline does not read.
        A stream that splits large events returns them whole
        (:class:`~flowwarden.mongo.large_events.JoinedChangeStream`): every event it returns, and so every
        offset, ends at a whole event.
        """
        client: Any = self._raw_client_for() if raw else self._client_for()
        options = self.options
        target: Any = client
        if options.database is not None:
            target = client[options.database]
            if options.collection is not None:
                target = target[options.collection]
        kwargs: dict[str, Any] = {"max_await_time_ms": options.max_await_time_ms, **resume}
        if position_only:
            kwargs["batch_size"] = 0
        elif batch_size is not None:
            kwargs["batch_size"] = batch_size
        stages = options.stream_pipeline
        splits = splits_large_events(stages)
        if counting and not splits:
            stages = options.counting_pipeline
        documents = not counting or counting_needs_documents(stages)
        if options.full_document != "default" and documents:
            kwargs["full_document"] = options.full_document
        if options.full_document_before_change != "off" and documents:
            kwargs["full_document_before_change"] = options.full_document_before_change
        pipeline = [dict(stage) for stage in stages]
        if bucket is not None:
            pipeline.insert(0, bucket_stage(*bucket))
        if counting and not splits:
            # Never with the split stage (which must stay last anyway): an event projected to
            # _id is not split, and its token is not the last fragment's the executor reads.
            pipeline.append({"$project": {"_id": 1}})
        stream = target.watch(pipeline, comment=f"flowwarden-spark:{options.namespace}", **kwargs)
        if splits and not position_only:
            return JoinedChangeStream(stream, f"{_OWNER} {options.namespace}", options.namespace)
        return stream


def _position(stream: Any) -> Any:
    """``stream.resume_token``, for a look after every event: PyMongo's ``resume_token`` hands
    out a deep copy of the token it keeps, which cost a plan of 10,000 events a fifth of its
    time; its own token (``_resume_token``, read and never changed here) is taken where a stream
    has one."""
    token = getattr(stream, "_resume_token", _NO_TOKEN)
    return stream.resume_token if token is _NO_TOKEN else token


_NO_TOKEN = object()


def _planned_events(data: bytes) -> Iterator[RawBSONDocument]:
    """The events planning read for a micro-batch: BSON documents back to back.

    Each event is a view of ``data``, not a copy of its bytes (a ``RawBSONDocument`` takes any
    buffer, as PyMongo's own hand out views of the batch they came in): the converter reads the
    bytes in place."""
    view = memoryview(data)
    offset, end, size = 0, len(data), _INT32.unpack_from
    while offset < end:
        length = size(data, offset)[0]
        yield RawEvent(view[offset : offset + length])
        offset += length


_INT32 = Struct("<i")


def _spark_arrow_schema(schema: StructType) -> Any:
    """The exact Arrow schema Spark checks the record batches of ``read`` against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
