"""Where one stream opens, and how: its start position, its change stream, and lost history.

The rules this module keeps:

- a stored position is checked against the server before it is resumed from (one ahead of the
  server's cluster time, or one the server refuses or cannot find, fails the stream with
  :class:`~flowwarden.errors.ResumePositionError`);
- a stream with no stored position (or one going on after lost history) asks the server where
  its start position is, and that position is stored before the first event is handled (see
  :mod:`flowwarden.mongo.positions`);
- lost history is handled by :func:`flowwarden.mongo.positions.recover_from_history_loss`, and the gap
  given up on purpose is recorded in the checkpoint's metadata with the new position;
- a stream that splits large events (``split_large_events``, or a pipeline ending with
  ``$changeStreamSplitLargeEvent``) is opened with that stage last and read through
  :class:`~flowwarden.mongo.large_events.AsyncJoinedChangeStream`, so nothing past the opening sees a
  fragment; one that does not fails on an event over 16 MB with an error naming the option.

Nothing here reads events or handles them; :class:`~flowwarden.runtime.stream.StreamRunner` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from pymongo.errors import OperationFailure, PyMongoError

from flowwarden.checkpoints import Checkpoint, CheckpointCommitter
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config import StartPosition
from flowwarden.config.spec import StreamSpec
from flowwarden.errors import FlowWardenError, ResumePositionError, StreamError
from flowwarden.events import timestamp_datetime, token_data, token_datetime
from flowwarden.mongo import codes
from flowwarden.mongo.calls import maybe_await
from flowwarden.mongo.large_events import (
    AsyncJoinedChangeStream,
    is_too_large,
    splits_large_events,
    too_large_error,
    with_split_stage,
)
from flowwarden.mongo.positions import (
    ahead_of_server,
    open_change_stream,
    opening_token,
    oplog_edge_async,
    recover_from_history_loss,
    refused_position,
    server_cluster_time,
)
from flowwarden.mongo.raw_events import RAW_EVENT_OPTIONS
from flowwarden.runtime.context import stream_logger

CLOSE_TIMEOUT_SECONDS = 2.0


class StreamOpener:
    """Opens one stream at the right position; keeps what the next open must know.

    ``forced_start`` (set after lost history, or after an invalidate with
    ``on_invalidate="restart"``) overrides the stored position once; ``replay_end`` is the stored
    batch end the next batch must end at (see :mod:`flowwarden.runtime.batching`).
    """

    def __init__(
        self,
        spec: StreamSpec,
        *,
        client: Any,
        store: AwaitableStore,
        batch_wait_seconds: float | None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._client = client
        self._store = store
        self.log = stream_logger(__name__, spec.name)
        self._batch_wait_seconds = batch_wait_seconds
        self.first_run = True
        self.forced_start: dict[str, Any] | None = None
        self.history_audit: dict[str, Any] | None = None
        self.replay_end: dict[str, Any] | None = None

    # -- the position --------------------------------------------------------------------------

    async def position(self, checkpoint: Checkpoint | None) -> tuple[dict[str, Any], bool]:
        """The watch option that opens this run (``resume_after`` or ``start_after`` a token), and
        whether that position is new and must be stored before the first event is handled.

        A stored position is checked against the server first. Without one (or after lost
        history), the position the start options name is asked of the server.
        """
        self.replay_end = None
        forced, self.forced_start = self.forced_start, None
        if forced is not None:
            if "start_after" in forced:
                # Just after an invalidate event, which the committer holds.
                self.log.info(
                    "stream %s: opening after the invalidate event %s (on_invalidate=restart)",
                    self.name,
                    describe_token(forced["start_after"]),
                )
                return forced, False
            return {"resume_after": await self._token_of(forced)}, True
        options = self.spec.checkpoint
        position = options.start_position
        ignore_checkpoint = position == StartPosition.LATEST and self.first_run
        stored = None if checkpoint is None or ignore_checkpoint else checkpoint.resume_token
        if stored is not None:
            await self._check_stored(stored)
            assert checkpoint is not None
            self.replay_end = checkpoint.pending_batch_end
            self.log.info("stream %s: opening after %s", self.name, _why_stored(checkpoint))
            return {"resume_after": stored}, False
        if ignore_checkpoint and checkpoint is not None and checkpoint.resume_token is not None:
            self.log.info(
                "stream %s: start_position LATEST: the stored position (%s) is ignored at process start",
                self.name,
                describe_token(checkpoint.resume_token),
            )
        start: dict[str, Any] = {}
        if position == StartPosition.EARLIEST:
            oldest = await oplog_edge_async(self._client, 1)
            if oldest is None:
                raise StreamError(
                    f"stream {self.name!r}: start_position=EARLIEST needs to read the oplog "
                    "(local.oplog.rs; through a mongos, on every shard), which this user cannot; grant "
                    "read on 'local' (through a mongos: read on config.shards, and a shard-local user "
                    "with read on 'local' on every shard; a WARNING names the shard) or choose another "
                    "start_position",
                    stream=self.name,
                )
            start = {"start_at_operation_time": oldest}
        elif position == StartPosition.AT_TIME:
            at = options.start_at_operation_time
            now = await server_cluster_time(self._client)
            if at is not None and now is not None and at.time > now.time:
                # The server would wait for that time to come: the stream would store a position
                # in the future and say RUNNING while it delivers nothing until then.
                raise StreamError(
                    f"stream {self.name!r}: start_at {timestamp_datetime(at).isoformat()} is after the "
                    f"deployment's current time {timestamp_datetime(now).isoformat()}; a stream starts "
                    "at a time that has come. Give a past time, or start_position=LATEST",
                    stream=self.name,
                )
            start = {"start_at_operation_time": at}
        return {"resume_after": await self._token_of(start)}, True

    async def store_position(
        self,
        committer: CheckpointCommitter,
        token: dict[str, Any],
        *,
        events_processed: int,
        metadata: Mapping[str, Any],
    ) -> None:
        """Make a new opening position durable: as lastSeen, or after lost history as
        lastProcessed together with the audit entry."""
        if self.history_audit is not None:
            await self._store_history_audit(committer, token, events_processed, metadata)
            return
        committer.observe_seen(token)
        await committer.flush()
        self.log.info(
            "stream %s: no stored position; opened at %s (start_position %s), stored before the first event",
            self.name,
            describe_token(token),
            self.spec.checkpoint.start_position.value,
        )

    async def current_position(self) -> dict[str, Any]:
        """The stream's position now, as the server names it (the token a stream opened now
        would resume after)."""
        return await self._token_of({})

    async def _token_of(self, start: Mapping[str, Any]) -> dict[str, Any]:
        return await opening_token(self.watch_target(), start, **self.watch_options())

    async def _check_stored(self, token: Mapping[str, Any]) -> None:
        """Refuse a stored position the server cannot resume from as it stands (see positions)."""
        server_time = await server_cluster_time(self._client)
        try:
            reason = ahead_of_server(token, server_time)
        except FlowWardenError as error:  # a custom store returned a token of the wrong form
            reason = str(error)
        if reason is not None:
            raise ResumePositionError(self.name, token=dict(token), reason=reason)

    # -- the change stream ---------------------------------------------------------------------

    def watch_target(self, codec_options: CodecOptions[Any] | None = None) -> Any:
        """The client, database or collection the stream watches (with ``codec_options``)."""
        opts = self.spec.stream
        if opts.database is None:
            target = self._client
        elif opts.collection is None:
            target = self._client[opts.database]
        else:
            target = self._client[opts.database][opts.collection]
        if codec_options is not None:
            target = (
                target.with_options(codec_options=codec_options) if target is not self._client else target
            )
        return target

    @property
    def watches_cluster(self) -> bool:
        """A cluster stream: watched on the client itself, whose codec cannot change per stream."""
        return self.spec.stream.database is None

    @staticmethod
    async def close(stream: Any, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Close a change stream; with the deployment out of reach, give up after ``timeout``
        (the server drops an abandoned cursor after its idle timeout)."""
        try:
            await asyncio.wait_for(maybe_await(stream.close()), timeout)
        except (PyMongoError, asyncio.TimeoutError):
            pass

    def read_options(self) -> CodecOptions[Any] | None:
        """How the stream's events are decoded: as the client says (None), except for DataFrame
        streams, which keep each event's BSON as the server sent it
        (:class:`~flowwarden.mongo.raw_events.RawEvent`).

        The Arrow conversion reads those bytes directly (flowwarden.spark's compiled converter)
        and maps BSON types to columns by its own documented rules, so decoding them into dicts
        first would only cost time, and type-registry decoders would only hand it Python types
        it has no column for. Not when the client tolerates invalid UTF-8 (a lenient
        ``unicode_decode_error_handler``): that choice is the user's, and the decoded path honours
        it. Nor for cluster-level streams, whose codec cannot be set per stream.
        """
        if self.spec.dataframe is None:
            return None
        target = self.watch_target()
        options: CodecOptions[Any] | None = getattr(target, "codec_options", None)
        if target is self._client or options is None or options.unicode_decode_error_handler != "strict":
            return None
        return RAW_EVENT_OPTIONS

    @property
    def splits_large_events(self) -> bool:
        """Whether the stream's events over 16 MB come as fragments (which :meth:`open` joins)."""
        return self.spec.stream.split_large_events or splits_large_events(self.spec.pipeline)

    def watch_options(self) -> dict[str, Any]:
        options: dict[str, Any] = self.spec.stream.watch_options()
        pipeline = self.spec.pipeline
        options["pipeline"] = (
            with_split_stage(pipeline) if self.spec.stream.split_large_events else list(pipeline)
        )
        options["max_await_time_ms"] = self._await_ms()
        options["comment"] = f"flowwarden:{self.name}"
        return options

    async def open(self, start: Mapping[str, Any], codec_options: CodecOptions[Any] | None = None) -> Any:
        """The change stream from ``start``; a token the server refuses raises ResumePositionError.

        A stream that splits large events is returned joining their fragments
        (:class:`~flowwarden.mongo.large_events.AsyncJoinedChangeStream`).
        """
        kwargs: dict[str, Any] = {**self.watch_options(), **start}
        target = self.watch_target(codec_options)
        try:
            try:
                stream = await open_change_stream(target, **kwargs)
            except InvalidBSON:
                # The first batch holds an event this client cannot decode, and nothing read at
                # an open is handed to the read loop: open again with an empty first batch, so
                # that the event comes in a getMore, where the loop gives up on it alone.
                stream = await open_change_stream(target, **{**kwargs, "batch_size": 0})
            except OperationFailure as error:
                if error.code == codes.INVALID_RESUME_TOKEN and "resume_after" in kwargs:
                    # The token is an invalidate notification's: only startAfter may start after it.
                    kwargs["start_after"] = kwargs.pop("resume_after")
                    stream = await open_change_stream(target, **kwargs)
                else:
                    raise
        except OperationFailure as error:
            token = kwargs.get("resume_after", kwargs.get("start_after"))
            if token is not None and refused_position(error):
                raise ResumePositionError(
                    self.name, token=dict(token), reason=f"the server refused it: {error}"
                ) from error
            if is_too_large(error):
                raise self.read_error(error) from error
            raise
        if self.splits_large_events:
            return AsyncJoinedChangeStream(stream, f"stream {self.name!r}", self.name)
        return stream

    def read_error(self, error: BaseException) -> BaseException:
        """What reading the stream failed with, as the stream fails with it: ``error`` itself, but
        for an event over 16 MB without the split stage an error that names ``split_large_events``
        (raised from ``error``)."""
        if is_too_large(error):
            described = too_large_error(
                error,
                owner=f"stream {self.name!r}",
                stream=self.name,
                remedy="@change_stream(split_large_events=True)",
            )
            described.__cause__ = error
            return described
        return error

    def _await_ms(self) -> int:
        """getMore's maxAwaitTimeMS: short enough for batch deadlines and a prompt stop."""
        wait = self.spec.stream.max_await_time_ms
        if self._batch_wait_seconds is not None:
            wait = min(wait, max(10, int(self._batch_wait_seconds * 1000)))
        return wait

    # -- lost history --------------------------------------------------------------------------

    async def history_lost(self, error: OperationFailure) -> None:
        """Apply on_history_lost (flowwarden.mongo.positions.recover_from_history_loss): fail, or plan
        the next opening position and the audit entry stored with it."""
        strategy = self.spec.checkpoint.on_history_lost
        checkpoint = await self._store.load(self.name)
        lost_from = None
        if checkpoint is not None:
            lost_from = checkpoint.last_processed_at or checkpoint.last_seen_at
        recovery = recover_from_history_loss(
            strategy,
            stream=self.name,
            lost_from=lost_from,
            oldest=await oplog_edge_async(self._client, 1),
            newest=await oplog_edge_async(self._client, -1),
            error=error,
        )
        if recovery.fell_back:
            self.log.warning(
                "stream %s: the oplog cannot be read; RESUME_FROM_OPLOG_START falls back to now", self.name
            )
        self.forced_start = recovery.start
        self.history_audit = {
            "at": datetime.now(timezone.utc),
            "strategy": str(strategy),
            "lostFrom": lost_from,
            "lostTo": recovery.lost_to,
            "serverMessage": str(error),
        }
        self.log.warning(
            "stream %s: history lost; events between %s and %s were not delivered (strategy %s)",
            self.name,
            lost_from.isoformat() if lost_from else "the beginning",
            recovery.lost_to.isoformat(),
            strategy,
        )

    async def _store_history_audit(
        self,
        committer: CheckpointCommitter,
        token: Mapping[str, Any],
        events_processed: int,
        metadata: Mapping[str, Any],
    ) -> None:
        """Write the history-lost audit entry at the new opening position.

        Metadata travels only with a stored processed position, so the opening token (nothing
        before it is unfinished: the gap was given up on purpose) is saved as the processed
        position together with the audit, before anything is read.
        """
        assert self.history_audit is not None
        saved = await self._store.save(
            Checkpoint(
                stream_id=self.name,
                instance_id=committer.instance_id,
                instance_token=committer.instance_token,
                last_processed_token=dict(token),  # its time is the token's
                events_processed=events_processed,
                epoch=committer.epoch,
                metadata={**metadata, "historyLost": self.history_audit},
            )
        )
        self.log.info(
            "stream %s: history lost, strategy %s: opened at %s, stored with the audit entry (%s)",
            self.name,
            self.history_audit["strategy"],
            describe_token(token),
            saved.value,
        )
        self.history_audit = None


def _why_stored(checkpoint: Checkpoint) -> str:
    """Which stored token a stream resumes after, and why that one."""
    processed, seen = checkpoint.last_processed_token, checkpoint.last_seen_token
    if seen is not None and checkpoint.resume_token == seen:
        if processed is None:
            return f"lastSeen {describe_token(seen)} (stored when the stream first opened or last idled)"
        return f"lastSeen {describe_token(seen)}, newer than lastProcessed {describe_token(processed)}"
    extra = f", {checkpoint.events_processed} events processed so far"
    if checkpoint.pending_batch_end is not None:
        extra += f"; the next batch is formed again up to {describe_token(checkpoint.pending_batch_end)}"
    return f"lastProcessed {describe_token(processed)}{extra}"


def describe_token(token: Mapping[str, Any] | None) -> str:
    """A token for a log line: its cluster time and the start of its ``_data``."""
    if token is None:
        return "none"
    try:
        at = token_datetime(token)
        data = token_data(token)
    except FlowWardenError:
        return repr(dict(token))
    return f"{at.isoformat() if at else '?'} ({data[:26]}...)"


__all__ = ["StreamOpener", "describe_token"]
