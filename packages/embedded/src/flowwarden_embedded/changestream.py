"""Change streams of the embedded replica set: ``aggregate`` with a first ``$changeStream`` stage.

:func:`open_change_stream` checks the request like MongoDB, with the same codes and messages (the
stage's options in :mod:`~flowwarden_embedded.changestream_request`, the user stages in
:mod:`~flowwarden_embedded.stages`), and returns a :class:`ChangeStreamCursor`, which
turns oplog records into change events batch by batch.

What a cursor promises, as MongoDB does:

* every reply carries ``postBatchResumeToken``: the token of the last event returned, or, once
  the cursor has read past events that were not returned (filtered out, other namespaces), a
  high-water-mark token at the newest cluster time read. Resuming from it never repeats a returned
  event and never skips one that would have passed the pipeline;
* resuming (``resumeAfter``/``startAfter``) swallows every event up to and including the token's
  event, and fails with code 280 if that event is not in the stream; resuming or starting before
  the oldest kept oplog entry fails with code 286, at ``aggregate`` or at ``getMore``;
* a drop or rename of the watched collection (a ``dropDatabase`` for a database stream) produces
  that event, then an ``invalidate``, then the cursor is exhausted;
* a user stage that removes or changes ``_id`` fails the batch with code 280 when such an event
  is produced;
* an event over 16 MiB + 16 KiB fails the batch with BSONObjectTooLarge (10334), unless the
  pipeline ends with ``$changeStreamSplitLargeEvent``: then an event over 16 MiB + 8 KiB arrives as
  fragments (:mod:`~flowwarden_embedded.largeevents`), each with its own token. Resuming
  from a fragment's token splits that event again and delivers the fragments after it (the next
  event, after the last fragment);
* a batch holds at most 16 MiB of events, except that its first event may be bigger; an event that
  does not fit waits for the next batch.

Hot-path rule: event documents are built once per oplog record and stream shape, encoded to BSON
once, and shared by every stream (the oplog encodes document events in the background right after
their writes); a batch then costs a namespace check and a list append per event.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import bson
from bson import Int64, Timestamp
from bson.raw_bson import RawBSONDocument

from flowwarden_embedded.changestream_request import check_namespace, parse_spec, resume_token_of
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.eventbson import classic_document_event_bson
from flowwarden_embedded.largeevents import split_event, too_large
from flowwarden_embedded.limits import MAX_CHANGE_EVENT_SIZE, MAX_INTERNAL_OBJECT_SIZE
from flowwarden_embedded.oplog import CLASSIC_OPS, DOCUMENT_OPS, NOOP, Oplog, OplogRecord
from flowwarden_embedded.rawstrings import encode
from flowwarden_embedded.stages import (
    SPLIT_STAGE,
    Stage,
    compile_pipeline,
    ends_with_split,
    run_pipeline,
    stage_touches,
)
from flowwarden_embedded.tokens import (
    TOKEN_TYPE_EVENT,
    ResumeTokenData,
    high_water_mark,
    key_timestamp,
    ts_key,
)
from flowwarden_embedded.updates import bson_equal, oplog_diff, update_description
from flowwarden_embedded.views import VIEWS_COLLECTION, definition_event, is_definition_write

NON_RESUMABLE = ("NonResumableChangeStreamError",)
DEFAULT_AWAIT_MS = 1000
"""How long a getMore waits for events when the client sends no ``maxTimeMS`` (MongoDB's default)."""

DEFAULT_FIRST_BATCH = 101
MAX_BATCH_BYTES = 16 * 1024 * 1024
INTERNAL_DATABASES = frozenset({"admin", "config", "local"})


class ChangeSource(Protocol):
    """Where a change stream reads its records: a replica set member's
    :class:`~flowwarden_embedded.oplog.Oplog`, or the
    :class:`~flowwarden_embedded.shardmerge.MergedOplog` of a mongos's shards."""

    @property
    def clock_key(self) -> int: ...

    @property
    def first_seq(self) -> int: ...

    @property
    def end_seq(self) -> int: ...

    def history_lost_before(self, key: int, *, event: bool = False) -> bool: ...

    def seek(self, key: int, index: int = 0) -> int: ...

    def view(self) -> tuple[list[OplogRecord], int]: ...

    def release(self, seq: int) -> None: ...

    async def wait(self, timeout: float) -> None: ...

    def wake_all(self) -> None: ...


class ChangeStreamHost(Protocol):
    """What a change stream needs from the server (implemented by the server's host)."""

    oplog: Oplog
    """What a stream reads unless it is given a source of its own."""

    def lookup_document(self, db: str, coll: str, document_key: dict[str, Any]) -> dict[str, Any] | None:
        """The current document with this key (``fullDocument: updateLookup``), or None."""
        ...

    def collection_options(self, db: str, coll: str) -> dict[str, Any] | None:
        """The collection's options (e.g. ``changeStreamPreAndPostImages``); None if it does not exist."""
        ...


async def open_change_stream(
    host: ChangeStreamHost,
    db: str,
    coll: str | None,
    pipeline: list[Any],
    cmd: Mapping[str, Any],
    *,
    source: ChangeSource | None = None,
) -> ChangeStreamCursor:
    """Open the change stream an ``aggregate`` asks for; ``pipeline[0]`` is its ``$changeStream``.

    ``coll`` None is a database stream (``aggregate: 1``); ``db`` "admin" with
    ``allChangesForCluster: true`` is a cluster stream. ``cmd`` is the whole command; nothing in
    it beyond the pipeline changes a stream here (batch size and maxTimeMS reach
    :meth:`ChangeStreamCursor.fetch`; a collation is accepted and not applied). ``source`` is
    what the stream reads (``host.oplog`` when None). Raises :class:`CommandError` exactly where
    MongoDB refuses the request.
    """
    first = pipeline[0] if pipeline else None
    if not isinstance(first, Mapping) or len(first) != 1 or "$changeStream" not in first:
        raise CommandError(40602, "$changeStream is only valid as the first stage in a pipeline.")
    spec = parse_spec(first["$changeStream"])
    read_concern = cmd.get("readConcern")
    level = read_concern.get("level") if isinstance(read_concern, Mapping) else None
    if level is not None and level != "majority":
        raise CommandError(
            72,
            "Aggregation stage $changeStream cannot run with a readConcern other than 'majority', or "
            f'in a multi-document transaction. Current readConcern: {{ level: "{level}" }}',
            code_name="InvalidOptions",
        )
    user_stages = list(pipeline[1:])
    stages = compile_pipeline(user_stages)
    # MongoDB moves a $match that does not read the images ahead of the stages adding them, so
    # such a filter also spares the image lookup (and its "required" error) for what it drops.
    early = 0
    for stage in user_stages:
        if not (isinstance(stage, Mapping) and "$match" in stage):
            break
        if stage_touches(stage["$match"], ("fullDocument",)):
            break
        early += 1

    cluster = check_namespace(db, coll, spec)
    token = resume_token_of(spec, coll)
    split = ends_with_split(user_stages)
    if token is not None and token.fragment_num is not None and not split:
        raise CommandError(
            280,
            "To resume from a split event, the $changeStream pipeline must include a "
            "$changeStreamSplitLargeEvent stage",
        )
    filters_only = all(isinstance(s, Mapping) and ("$match" in s or SPLIT_STAGE in s) for s in user_stages)
    return ChangeStreamCursor(
        host,
        db,
        None if cluster else coll,
        stages,
        spec,
        token,
        cluster=cluster,
        early_matches=early,
        filters_only=filters_only,
        split=split,
        source=source,
    )


class ChangeStreamCursor:
    """One open change stream; implements the server's cursor protocol (``fetch``/``exhausted``/``close``)."""

    # A change stream's cursor waits for new events, as a tailable awaitData cursor does.
    tailable = True

    def __init__(
        self,
        host: ChangeStreamHost,
        db: str,
        coll: str | None,
        stages: list[Stage],
        spec: Mapping[str, Any],
        token: ResumeTokenData | None,
        *,
        cluster: bool,
        early_matches: int = 0,
        filters_only: bool = False,
        split: bool = False,
        source: ChangeSource | None = None,
    ) -> None:
        self._host = host
        self._oplog: ChangeSource = host.oplog if source is None else source
        self._db = db
        self._coll = coll
        self._cluster = cluster
        if cluster:
            self.ns = "admin.$cmd.aggregate"
        elif coll is None:
            self.ns = f"{db}.$cmd.aggregate"
        else:
            self.ns = f"{db}.{coll}"
        self._stages = stages
        self._early = stages[:early_matches] if self._needs_images_for(spec) else []
        self._late = stages[len(self._early) :]
        self._expanded = bool(spec.get("showExpandedEvents"))
        self._system = bool(spec.get("showSystemEvents"))
        self._raw_update = bool(spec.get("showRawUpdateDescription"))
        self._full_document = str(spec.get("fullDocument", "default"))
        self._before = str(spec.get("fullDocumentBeforeChange", "off"))
        self._needs_images = self._needs_images_for(spec)
        self._fast = not stages and not self._needs_images and not self._raw_update
        # Filters never change an event: what passes them is the cached encoding, as unfiltered.
        self._filters_only = bool(stages) and filters_only and not self._needs_images and not self._raw_update
        self._shape = int(self._expanded)
        self._exhausted = False
        self._closed = False
        self._pending_invalidate: OplogRecord | None = None
        self._match = self._namespace_matcher()
        self._split = split
        # Events produced but not yet returned, in order: the rest of a split event, or an event
        # that did not fit its batch. Each with its token and cluster time.
        self._ready: deque[tuple[RawBSONDocument, dict[str, str], int]] = deque()
        # The client's token is a fragment: the whole event's token, and the fragment's number.
        self._resume_split: tuple[str, int] | None = None
        # The record the client's fragment token belongs to, once met, until its event is split.
        self._split_resume: tuple[OplogRecord, int] | None = None

        oplog = self._oplog
        self._resume_position: tuple[int, int, int, int] | None = None
        self._resume_data: str | None = None
        self._must_find = False
        if token is not None:
            if oplog.history_lost_before(token.ts_key, event=not token.is_high_water_mark):
                raise _history_lost()
            self._resume_position = token.position()
            self._resume_data = token.data
            if token.fragment_num is not None:
                self._resume_split = (token.event_data, token.fragment_num)
            self._must_find = not token.is_high_water_mark
            index = 0 if token.is_high_water_mark else token.txn_op_index
            self._next_seq = oplog.seek(token.ts_key, index)
            self._pbrt: dict[str, Any] = {"_data": token.data}
            self._latest_key = token.ts_key
        else:
            start_time = spec.get("startAtOperationTime")
            if start_time is not None:
                start_key = ts_key(start_time)
                if oplog.history_lost_before(start_key):
                    raise _history_lost()
                self._next_seq = oplog.seek(start_key)
            else:
                # A new stream starts one tick after the newest operation, as MongoDB does.
                start_key = oplog.clock_key + 1
                self._next_seq = oplog.end_seq
            self._pbrt = high_water_mark(key_timestamp(start_key))
            self._latest_key = start_key

    @staticmethod
    def _needs_images_for(spec: Mapping[str, Any]) -> bool:
        return bool(
            spec.get("fullDocument", "default") != "default"
            or spec.get("fullDocumentBeforeChange", "off") != "off"
        )

    # -- cursor protocol --------------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._exhausted = True
            self._ready.clear()
            self._oplog.wake_all()

    @property
    def post_batch_resume_token(self) -> dict[str, Any]:
        return self._pbrt

    async def fetch(
        self, batch_size: int | None, max_time_ms: int | None, *, first: bool
    ) -> tuple[list[Any], dict[str, Any]]:
        """Next batch and ``{"postBatchResumeToken": ...}``.

        The first batch answers at once; a getMore with nothing to return waits for new oplog
        entries up to ``max_time_ms`` (1000 ms when the client sends none), then returns an empty
        batch carrying an up-to-date post-batch resume token.
        """
        if batch_size is not None and batch_size < 0:
            raise CommandError(
                51024, f"BSON field 'batchSize' value must be >= 0, actual value '{batch_size}'"
            )
        limit = batch_size if batch_size else (DEFAULT_FIRST_BATCH if first and batch_size is None else None)
        if first and batch_size == 0:
            return [], {"postBatchResumeToken": self._pbrt}
        batch = self._scan(limit)
        if batch or first or self._exhausted:
            return batch, {"postBatchResumeToken": self._pbrt}
        wait_ms = DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms
        deadline = time.monotonic() + wait_ms / 1000.0
        while not batch and not self._exhausted:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self._oplog.wait(remaining)
            if self._closed:
                break
            batch = self._scan(limit)
        return batch, {"postBatchResumeToken": self._pbrt}

    # -- scanning ---------------------------------------------------------------------------------

    def _scan(self, limit: int | None) -> list[Any]:
        """Events from the cursor's position on, at most ``limit`` (None: up to 16 MiB).

        The stream is a sequence of items: each matching record's event, followed by an
        invalidate when the record ends this stream. Items up to the client's resume token are
        swallowed; the rest go through the user stages into the batch.
        """
        if self._exhausted:
            return []
        batch: list[Any] = []
        cap = -1 if limit is None else limit
        ready = self._ready
        size = self._drain(batch, cap, 0) if ready else 0
        if ready or len(batch) == cap:
            return batch
        oplog = self._oplog
        if self._next_seq < oplog.first_seq:
            self._exhausted = True
            raise _history_lost()
        if self._pending_invalidate is not None:
            self._emit_invalidate(batch)
            if self._exhausted:
                return batch
        records, base = oplog.view()
        index = self._next_seq - base
        end = len(records)
        match = self._match
        fast = self._fast
        shape = self._shape
        expanded = self._expanded
        # Most records of a collection stream are its own document writes: test those inline.
        quick_db = self._db if self._coll is not None else None
        quick_coll = self._coll
        last: OplogRecord | None = None
        batch_limit = MAX_BATCH_BYTES
        # Events over this size take the slow path; -1 sends the next one there too, while the
        # event of a client's fragment token is still to be split.
        large = -1 if self._split_resume is not None else MAX_CHANGE_EVENT_SIZE
        try:
            while index < end and len(batch) != cap and size < batch_limit:
                record = records[index]
                index += 1
                if record.coll == quick_coll and record.db == quick_db and record.kind in DOCUMENT_OPS:
                    verdict = 1
                else:
                    verdict = match(record)
                    if not verdict:
                        continue
                if self._resume_position is None:
                    wanted = expanded or record.kind in CLASSIC_OPS
                else:
                    wanted = self._passes_resume_point(record, 0) and (expanded or record.kind in CLASSIC_OPS)
                    if self._split_resume is not None:
                        large = -1
                if wanted:
                    if fast:
                        raw = record.raw if shape == 0 else None
                        if raw is None:
                            raw = self._encoded_base(record)
                    else:
                        raw = self._transform(record)
                    if raw is not None:
                        length = len(raw.raw)
                        if length > large:
                            if last is not None:
                                self._pbrt = last.token()
                                self._latest_key = last.key
                                last = None
                            self._queue_large(record, raw)
                            large = MAX_CHANGE_EVENT_SIZE
                            size = self._drain(batch, cap, size)
                            if ready:
                                if verdict == 2:
                                    self._pending_invalidate = record
                                break
                        elif batch and size + length > batch_limit:
                            # Held for the next batch, as MongoDB stashes a result that does not fit.
                            ready.append((raw, record.token(), record.key))
                            if verdict == 2:
                                self._pending_invalidate = record
                            break
                        else:
                            size += length
                            batch.append(raw)
                            last = record
                if verdict == 2:
                    self._pending_invalidate = record
                    if len(batch) == cap:
                        break
                    if last is record:
                        self._pbrt = record.token()
                    self._emit_invalidate(batch)
                    if self._exhausted:
                        return batch
        finally:
            self._next_seq = base + index
            oplog.release(self._next_seq)
        if last is not None:
            self._pbrt = last.token()
            self._latest_key = last.key
        if index >= end and self._pending_invalidate is None and not ready:
            newest = oplog.clock_key
            if newest > self._latest_key:
                self._pbrt = high_water_mark(key_timestamp(newest))
                self._latest_key = newest
        return batch

    def _drain(self, batch: list[Any], cap: int, size: int) -> int:
        """Move ready events into ``batch`` while they fit; the batch's new size in bytes.

        A batch takes up to ``cap`` events (-1: any number) and at most 16 MiB of them, though its
        first event may be bigger, as MongoDB fills a batch.
        """
        ready = self._ready
        while ready and len(batch) != cap:
            raw, token, key = ready[0]
            length = len(raw.raw)
            if batch and size + length > MAX_BATCH_BYTES:
                break
            ready.popleft()
            batch.append(raw)
            size += length
            self._pbrt = token
            self._latest_key = key
        return size

    def _queue_large(self, record: OplogRecord, raw: RawBSONDocument) -> None:
        """Queue an event that may be over the size limits: whole, split, or refused.

        Also where a stream resumed from a fragment's token finds that token's event: it is split
        again and the fragments up to the client's are swallowed, as mongod's split stage and
        resume check do between them.
        """
        skip = 0
        resume = self._split_resume
        self._split_resume = None
        length = len(raw.raw)
        if resume is not None and resume[0] is record:
            if length <= MAX_CHANGE_EVENT_SIZE:
                raise CommandError(
                    280,
                    "Attempted to resume from a split event fragment, but the event in the resumed "
                    "stream was not large enough to be split",
                    labels=NON_RESUMABLE,
                )
            skip = resume[1] + 1
        if length <= MAX_CHANGE_EVENT_SIZE or (not self._split and length <= MAX_INTERNAL_OBJECT_SIZE):
            self._ready.append((raw, record.token(), record.key))
            return
        event = bytes(raw.raw)  # the same object: RawBSONDocument keeps bytes
        if not self._split:
            raise too_large(event)
        fragments = split_event(event, record.data())
        if skip > len(fragments):
            raise CommandError(
                280,
                "Attempted to resume from a split event, but the resumed stream produced a different "
                "split. Ensure that the pipeline used to resume is the same as the original",
                labels=NON_RESUMABLE,
            )
        self._ready.extend((fragment, token, record.key) for fragment, token in fragments[skip:])

    def _emit_invalidate(self, batch: list[Any]) -> None:
        """The pending invalidate: swallowed when it is the ``startAfter`` token, else the end."""
        record = self._pending_invalidate
        assert record is not None
        self._pending_invalidate = None
        if self._resume_position is not None and not self._passes_resume_point(record, 1):
            return
        event = self._deliver(self._invalidate_event(record), self._stages)
        if event is not None:
            batch.append(event)
        # The stream ends here: nothing after an invalidate is ever read.
        self._pbrt = record.invalidate_token()
        self._exhausted = True

    def _namespace_matcher(self) -> Callable[[OplogRecord], int]:
        """0: not this stream's; 1: an event of this stream; 2: an event that invalidates it."""
        db, coll = self._db, self._coll
        system = self._system
        expanded = self._expanded
        if self._cluster:

            def cluster(record: OplogRecord) -> int:
                if record.db in INTERNAL_DATABASES or record.kind == NOOP:
                    return 0
                name = record.coll
                if name == VIEWS_COLLECTION:
                    return 1 if expanded and is_definition_write(record) else 0
                if name is not None and name.startswith("system.") and not system:
                    return 0
                return 1

            return cluster
        if coll is None:

            def database(record: OplogRecord) -> int:
                if record.db != db:
                    return 0
                name = record.coll
                if name is None:
                    return 2  # dropDatabase
                if name == VIEWS_COLLECTION:
                    return 1 if expanded and is_definition_write(record) else 0
                if name.startswith("system.") and not system:
                    if (
                        record.kind != "rename"
                        or record.to_db != db
                        or (record.to_coll or "").startswith("system.")
                    ):
                        return 0
                return 1

            return database

        def collection(record: OplogRecord) -> int:
            if record.coll == coll and record.db == db:
                kind = record.kind
                return 2 if kind == "drop" or kind == "rename" else 1
            if record.to_coll == coll and record.to_db == db and record.kind == "rename":
                return 2
            return 0

        return collection

    def _passes_resume_point(self, record: OplogRecord, sub: int) -> bool:
        """Swallow items up to the client's token; True once an item lies beyond it.

        ``sub`` is 0 for the record's event and 1 for the invalidate that follows it. An event
        token must be met exactly on the way (else code 280, as MongoDB checks); a high-water
        mark only marks where delivery starts.
        """
        position = self._resume_position
        assert position is not None
        mine = (record.key, TOKEN_TYPE_EVENT, record.index, sub)
        if mine < position:
            return False
        if mine == position:
            data = record.invalidate_token()["_data"] if sub else record.data()
            if data == self._resume_data:
                self._must_find = False
                self._resume_position = None
                return False
            split = self._resume_split
            if split is not None and not sub and data == split[0]:
                # The client's token is a fragment of this event: the event is produced again, to
                # be split again, and the fragments up to the client's are swallowed then.
                self._must_find = False
                self._resume_position = None
                self._split_resume = (record, split[1])
                return True
            if self._resume_data is not None and data < self._resume_data:
                return False
        if self._must_find:
            raise CommandError(
                280,
                "cannot resume stream; the resume token was not found. "
                f'{{_data: "{(record.invalidate_token() if sub else record.token())["_data"]}"}}',
                labels=NON_RESUMABLE,
            )
        self._resume_position = None
        return True

    # -- events -----------------------------------------------------------------------------------

    def _encoded_base(self, record: OplogRecord) -> RawBSONDocument:
        """The event as every stream of this shape sees it, encoded once and kept."""
        if self._shape == 0:
            if record.kind in DOCUMENT_OPS:
                encoded = classic_document_event_bson(record)
            else:
                encoded = encode(self._base_event(record))
            raw = record.raw = RawBSONDocument(encoded)
            return raw
        cache = record.cache
        if cache is None:
            cache = record.cache = {}
        found = cache.get(self._shape)
        if found is None:
            found = cache[self._shape] = RawBSONDocument(encode(self._base_event(record)))
        return found

    def _base_event(self, record: OplogRecord) -> dict[str, Any]:
        """The event as every stream of this shape sees it, before images and user stages."""
        if record.coll == VIEWS_COLLECTION and self._coll is None:
            return definition_event(record)
        op = record.op
        kind = record.kind
        expanded = self._expanded
        # Field order as MongoDB documents it (the wire puts _id first at the top level anyway).
        event: dict[str, Any] = {"_id": record.token(), "operationType": kind}
        event["clusterTime"] = record.ts
        if expanded and record.uuid is not None:
            event["collectionUUID"] = bson.Binary(record.uuid, 4)
        event["wallTime"] = record.wall
        if kind in ("insert", "replace"):
            event["fullDocument"] = op.after
        event["ns"] = record.ns_doc()
        if kind == "rename":
            event["to"] = {"db": record.to_db, "coll": record.to_coll}
        if kind in DOCUMENT_OPS:
            event["documentKey"] = op.document_key
        description = None if kind in DOCUMENT_OPS else record.operation_description()
        if expanded and description is not None:
            event["operationDescription"] = description
        if kind == "update":
            if self._raw_update:
                event["rawUpdateDescription"] = {"$v": 2, "diff": oplog_diff(record.update_diff())}
            else:
                event["updateDescription"] = update_description(record.update_diff(), expanded=expanded)
        if expanded and kind == "modify" and op.description and "stateBeforeChange" in op.description:
            event["stateBeforeChange"] = op.description["stateBeforeChange"]
        if expanded and kind == "create":
            event["nsType"] = "collection"
        if record.lsid is not None:
            event["lsid"] = record.lsid
        if record.txn_number is not None:
            event["txnNumber"] = Int64(record.txn_number)
        return event

    def _transform(self, record: OplogRecord) -> RawBSONDocument | None:
        """The event through images and user stages, encoded; None when a stage dropped it."""
        event = self._base_event(record)
        if self._filters_only:
            for stage in self._stages:
                if stage(event) is None:
                    return None
            cached = record.raw if self._shape == 0 else None
            return cached if cached is not None else self._encoded_base(record)
        for stage in self._early:
            if stage(event) is None:
                return None
        return self._deliver(self._with_images(record, event), self._late)

    def _with_images(self, record: OplogRecord, event: dict[str, Any]) -> dict[str, Any]:
        """The event with this stream's images; a fresh dict only when something was added."""
        kind = record.kind
        # A view's DDL event (a system.views write) has no images, as in mongod.
        if (
            kind not in ("update", "replace", "delete")
            or not self._needs_images
            or record.coll == VIEWS_COLLECTION
        ):
            return event
        event = dict(event)
        op = record.op
        if self._before != "off":
            before = op.before if op.pre_image_recorded else None
            if before is None and self._before == "required":
                raise CommandError(
                    47,
                    "Change stream was configured to require a pre-image for all update, delete and "
                    f"replace events, but the pre-image was not found for event: {_describe(record)}",
                    code_name="NoMatchingDocument",
                )
            event["fullDocumentBeforeChange"] = before
        if kind == "update" and self._full_document != "default":
            if self._full_document == "updateLookup":
                after = self._host.lookup_document(record.db, record.coll or "", op.document_key or {})
            else:
                after = op.after if op.pre_image_recorded else None
                if after is None and self._full_document == "required":
                    raise CommandError(
                        47,
                        "Change stream was configured to require a post-image for all update events, "
                        f"but the post-image was not found for event: {_describe(record)}",
                        code_name="NoMatchingDocument",
                    )
            event.pop("fullDocument", None)
            event["fullDocument"] = after
        return event

    def _invalidate_event(self, record: OplogRecord) -> dict[str, Any]:
        return {
            "_id": record.invalidate_token(),
            "operationType": "invalidate",
            "clusterTime": record.ts,
            "wallTime": record.wall,
        }

    def _deliver(self, event: dict[str, Any], stages: list[Stage]) -> RawBSONDocument | None:
        """Run user stages on one event, check its ``_id`` survived, encode it."""
        token = event["_id"]
        out = run_pipeline(stages, event) if stages else event
        if out is None:
            return None
        found = out.get("_id", _MISSING_ID)
        if found is not token and not bson_equal(found, token):
            shown = "{}" if found is _MISSING_ID else f"{{ _id: {_show(found)} }}"
            raise CommandError(
                280,
                "Encountered an event whose _id field, which contains the resume token, was modified by "
                "the pipeline. Modifying the _id field of an event makes it impossible to resume the "
                "stream from that point. Only transformations that retain the unmodified _id field are "
                f"allowed. Expected: {{ _id: {_show(token)} }} but found: {shown}",
                labels=NON_RESUMABLE,
            )
        return RawBSONDocument(encode(out))


_MISSING_ID = object()


def _show(value: Any) -> str:
    """A value the way MongoDB prints BSON in error messages."""
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k}: {_show(v)}" for k, v in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    return repr(value)


def _describe(record: OplogRecord) -> str:
    """MongoDB's description of an event whose image is missing."""
    parts = [f'operationType: "{record.kind}"']
    ns = ", ".join(f'{k}: "{v}"' for k, v in record.ns_doc().items())
    parts.append(f"ns: {{{ns}}}")
    parts.append(f"clusterTime: Timestamp({record.ts.time}, {record.ts.inc})")
    if record.txn_number is not None:
        parts.append(f"txnNumber: {record.txn_number}")
    return "{" + ", ".join(parts) + "}"


def _history_lost() -> CommandError:
    return CommandError(
        286,
        "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
        labels=NON_RESUMABLE,
    )


__all__ = [
    "DEFAULT_AWAIT_MS",
    "ChangeSource",
    "ChangeStreamCursor",
    "ChangeStreamHost",
    "open_change_stream",
    "stage_touches",
]
