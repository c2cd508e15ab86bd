"""Positions in a deployment's history: where a stream opens, and whether a stored one can be right.

A position is a resume token. A stream that has none stored (a first run, a start at a point in
time, a new start after lost history) gets one from the server before it handles anything: a
change stream opened at the start point with ``batchSize: 0`` returns no event, and its
post-batch resume token is that start point itself (a high-water-mark token, resumable like an
event's). Storing that token first is what makes the very first events of a stream as safe as
any other: whatever happens after the open, the next run resumes there.

A stored position is checked against the server's cluster time on open: a token dated ahead of
it (from another deployment, or written by hand) would make the server wait for that time and
deliver nothing, silently. Nothing here writes a checkpoint; the callers do.

The helpers accept PyMongo's sync and asyncio clients (and motor's) alike.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bson import Timestamp
from pymongo.errors import OperationFailure

from flowwarden.config import OnHistoryLost
from flowwarden.errors import HistoryLostError
from flowwarden.events import ResumeToken, check_resume_token, timestamp_datetime

# Codes with which the server refuses a resume token it was given.
REFUSED_TOKEN_CODES = frozenset(
    {
        9,  # FailedToParse: _data is not hex
        260,  # InvalidResumeToken
        40649,  # a token too short or of an unknown format
    }
)
CHANGE_STREAM_FATAL = 280  # among others: "the resume token was not found"
HISTORY_LOST = 286  # ChangeStreamHistoryLost: the resume point left the oplog

FUTURE_TOLERANCE_SECONDS = 30
"""How far ahead of the server's cluster time a stored position may be before it is refused. A
position this process wrote is never ahead at all; the margin only covers a cluster time read
from a member that had not yet heard the newest one."""


def reachable(client: Any) -> bool:
    """Whether the client knows a server it could write to right now (its monitors' view; no I/O).

    A stop uses it to skip waits that would only end in the driver's server selection timeout.
    Clients without a topology description count as reachable.
    """
    description = getattr(client, "topology_description", None)
    if description is None:
        return True
    try:
        return bool(description.has_writable_server())
    except Exception:  # an unfamiliar client: assume it can be reached, waits stay bounded anyway
        return True


def refused_position(error: OperationFailure) -> bool:
    """Whether the server refused a resume token it was given, or did not find it in the stream's
    history (after a startAfter retry for invalidate tokens, where that applies)."""
    if error.code in REFUSED_TOKEN_CODES:
        return True
    return error.code == CHANGE_STREAM_FATAL and "resume token" in str(error).lower()


async def maybe_await(value: Any) -> Any:
    """``value``, awaited when it is awaitable (asyncio and motor clients return coroutines)."""
    return await value if inspect.isawaitable(value) else value


async def open_change_stream(target: Any, **watch_options: Any) -> Any:
    """``target.watch(**watch_options)``, with the server's answer to the open already in.

    PyMongo's clients run the aggregate inside ``watch()``; motor's defer it to the first read,
    which would move a refused position or pipeline from the open to some later read. Entering
    the stream's context runs it now.
    """
    stream = await maybe_await(target.watch(**watch_options))
    enter = getattr(stream, "__aenter__", None)
    if enter is not None:
        await enter()
    return stream


async def opening_token(target: Any, start: Mapping[str, Any], **watch_options: Any) -> dict[str, Any]:
    """The resume token of ``start`` on ``target`` (a client, database or collection).

    ``start`` holds ``watch()``'s start options: none (now), or ``start_at_operation_time``.
    The change stream opened here returns no event (``batch_size=0``), so its post-batch resume
    token is the start point; the server errors of an open (a pipeline it refuses, history
    already lost) are raised here, before anything was stored.
    """
    # batchSize 0 replaces the stream's own: the first batch must be empty whatever follows it.
    stream = await open_change_stream(target, **{**watch_options, **start, "batch_size": 0})
    try:
        token: Mapping[str, Any] | None = stream.resume_token
    finally:
        await maybe_await(stream.close())
    if token is None:
        raise OperationFailure(
            "the server returned no postBatchResumeToken for a change stream's first batch; "
            "MongoDB 4.0.7+ replica sets and sharded clusters send one"
        )
    return dict(token)


async def server_cluster_time(client: Any) -> Timestamp | None:
    """The deployment's cluster time as a ``ping`` reports it; None when the reply has none."""
    return cluster_time_of(await maybe_await(client.admin.command("ping")))


def cluster_time_of(reply: Mapping[str, Any]) -> Timestamp | None:
    """The cluster time a command's reply carries (``$clusterTime``, else ``operationTime``)."""
    cluster = reply.get("$clusterTime")
    value = cluster.get("clusterTime") if isinstance(cluster, Mapping) else None
    if not isinstance(value, Timestamp):
        value = reply.get("operationTime")
    return value if isinstance(value, Timestamp) else None


def ahead_of_server(token: ResumeToken, server_time: Timestamp | None) -> str | None:
    """Why ``token`` cannot be a position of this deployment, or None when it can be.

    Checks its form (:func:`flowwarden.events.check_resume_token`) and that its cluster time is
    not more than :data:`FUTURE_TOLERANCE_SECONDS` ahead of ``server_time``.
    """
    at = check_resume_token(token)
    if server_time is None or at.time <= server_time.time + FUTURE_TOLERANCE_SECONDS:
        return None
    return (
        f"its cluster time {timestamp_datetime(at).isoformat()} is ahead of the server's "
        f"({timestamp_datetime(server_time).isoformat()}); it was written by another deployment or "
        "by hand, and the server would wait until then before delivering anything"
    )


def oplog_edge(client: Any, direction: int) -> Timestamp | None:
    """The ts of the oldest (1) or newest (-1) oplog entry; None when it cannot be read
    (mongos, or a user without read on ``local``). PyMongo's sync client."""
    try:
        return _edge(client["local"]["oplog.rs"].find_one(**_edge_query(direction)))
    except OperationFailure:
        return None


async def oplog_edge_async(client: Any, direction: int) -> Timestamp | None:
    """:func:`oplog_edge` for PyMongo's asyncio client and motor's."""
    try:
        return _edge(await maybe_await(client["local"]["oplog.rs"].find_one(**_edge_query(direction))))
    except OperationFailure:
        return None


def _edge_query(direction: int) -> dict[str, Any]:
    return {"filter": {}, "projection": {"ts": 1}, "sort": [("$natural", direction)]}


def _edge(document: Mapping[str, Any] | None) -> Timestamp | None:
    ts = None if document is None else document.get("ts")
    return ts if isinstance(ts, Timestamp) else None


@dataclass(frozen=True)
class Recovery:
    """Where a stream goes on after its position left the oplog, by its ``on_history_lost``."""

    start: dict[str, Any]
    """``watch()`` start options: ``{}`` (now) or ``{"start_at_operation_time": <oldest entry>}``."""
    lost_to: datetime
    """Where the gap ends: the oldest entry's time, or now."""
    fell_back: bool
    """RESUME_FROM_OPLOG_START could not read the oplog and starts now instead."""


def recover_from_history_loss(
    strategy: OnHistoryLost,
    *,
    stream: str,
    lost_from: datetime | None,
    oldest: Timestamp | None,
    newest: Timestamp | None,
    error: BaseException,
) -> Recovery:
    """The one rule for lost history, for the connector and the Spark source alike.

    FAIL raises :class:`~flowwarden.errors.HistoryLostError` (naming the last position's time
    and the oplog's window); RESUME_FROM_OPLOG_START goes on at the oldest entry still kept, or
    now when the oplog cannot be read; RESUME_FROM_NOW goes on now.
    """
    if strategy is OnHistoryLost.FAIL:
        raise HistoryLostError(
            stream,
            checkpoint_time=lost_from,
            oplog_start=timestamp_datetime(oldest) if oldest else None,
            oplog_end=timestamp_datetime(newest) if newest else None,
            server_message=str(error),
        ) from error
    if strategy is OnHistoryLost.RESUME_FROM_OPLOG_START and oldest is not None:
        return Recovery({"start_at_operation_time": oldest}, timestamp_datetime(oldest), False)
    return Recovery({}, datetime.now(timezone.utc), strategy is OnHistoryLost.RESUME_FROM_OPLOG_START)


__all__ = [
    "FUTURE_TOLERANCE_SECONDS",
    "HISTORY_LOST",
    "REFUSED_TOKEN_CODES",
    "Recovery",
    "ahead_of_server",
    "cluster_time_of",
    "maybe_await",
    "open_change_stream",
    "opening_token",
    "oplog_edge",
    "oplog_edge_async",
    "reachable",
    "recover_from_history_loss",
    "refused_position",
    "server_cluster_time",
]
