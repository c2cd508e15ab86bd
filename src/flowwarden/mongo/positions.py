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

The oplog's edges (its oldest and newest entries) are read from ``local.oplog.rs``; through a
mongos, which refuses the ``local`` database, they are read on each shard directly.

The helpers accept PyMongo's sync and asyncio clients (and motor's) alike: the oplog's edges are
read by one procedure that :mod:`flowwarden.mongo.calls` runs on either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bson import Timestamp
from pymongo.errors import ConfigurationError, ConnectionFailure, OperationFailure

from flowwarden.config import OnHistoryLost
from flowwarden.errors import HistoryLostError
from flowwarden.events import ResumeToken, check_resume_token, timestamp_datetime
from flowwarden.mongo import codes
from flowwarden.mongo.calls import Call, Procedure, call, maybe_await, run, run_async

# Codes with which the server refuses a resume token it was given.
REFUSED_TOKEN_CODES = frozenset(
    {codes.FAILED_TO_PARSE, codes.INVALID_RESUME_TOKEN, codes.MALFORMED_RESUME_TOKEN}
)

log = logging.getLogger(__name__)

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
    return error.code == codes.CHANGE_STREAM_FATAL_ERROR and "resume token" in str(error).lower()


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
    """The ts of the oldest (1) or newest (-1) oplog entry; None when it cannot be read. PyMongo's
    sync client; :func:`oplog_edge_async` says how a mongos is handled."""
    return run(_read_edges(client, (direction,)))[0]


async def oplog_edge_async(client: Any, direction: int) -> Timestamp | None:
    """The ts of the oldest (1) or newest (-1) oplog entry, for PyMongo's asyncio client and
    motor's; None when it cannot be read (a user without read on ``local``), with a WARNING
    naming why the first time when the reason is a shard's.

    Through a mongos (``hello`` says ``msg: "isdbgrid"``), which refuses the ``local`` database,
    the entry is read on every shard that ``config.shards`` lists, with a client of the same
    options and credentials connected to the shard's replica set (:func:`shard_client_for`). The
    cluster's edge is the newest of the shards' edges, in both directions: a change stream
    through a mongos starts only where every shard still has its history, so the oldest safe
    start is the newest of the shards' oldest entries; and the cluster's history reaches its most
    recent write, the newest of the shards' newest entries, so the window (newest minus oldest)
    is what a stream can still resume into. See :data:`SHARD_PRIVILEGES` for what that needs.
    """
    return (await run_async(_read_edges(client, (direction,))))[0]


async def oplog_window_async(client: Any) -> tuple[Timestamp | None, Timestamp | None]:
    """The oldest and the newest oplog entry's ts, as :func:`oplog_edge_async` reads each, read
    together (through a mongos, with one client per shard for both)."""
    oldest, newest = await run_async(_read_edges(client, (1, -1)))
    return oldest, newest


SHARD_PRIVILEGES = (
    "through a mongos the oplog is read on each shard directly, which needs read on config.shards "
    "through the mongos and, on every shard, a shard-local user with read on 'local' and this "
    "client's user name and password (users created through a mongos exist on the config servers only)"
)
"""What reading the oplog through a mongos needs, as the WARNING says it when it cannot."""


def _read_edges(client: Any, directions: tuple[int, ...]) -> Procedure[tuple[Timestamp | None, ...]]:
    """The edge in each of ``directions`` (1: oldest, -1: newest), each None when unreadable; the
    clients it opens on shards are closed before it returns."""
    unreadable = (None,) * len(directions)
    hello = yield call(client.admin, "command", "hello")
    if hello.get("msg") != "isdbgrid":
        edges: list[Timestamp | None] = []
        for direction in directions:
            try:
                entry = yield _find_edge(client, direction)
            except OperationFailure:
                return unreadable
            edges.append(_edge(entry))
        return tuple(edges)
    try:
        listed = yield call(
            client["config"],
            "command",
            {"find": "shards", "projection": {"host": 1}, "batchSize": 100_000, "singleBatch": True},
        )
    except OperationFailure as error:
        _unreadable(
            f"config.shards {error.code}",
            f"cannot list the shards in config.shards: {_failure(error)}; {SHARD_PRIVILEGES}",
        )
        return unreadable
    opened: list[Any] = []
    try:
        per_shard = yield from _shard_edges(client, listed["cursor"]["firstBatch"], directions, opened)
    finally:
        for shard_client in opened:
            yield call(shard_client, "close")
    if not per_shard:
        return unreadable
    # Per direction, the newest of the shards' edges (oplog_edge_async says why).
    return tuple(max(edges) for edges in zip(*per_shard, strict=True))


def _shard_edges(
    client: Any, shards: list[Mapping[str, Any]], directions: tuple[int, ...], opened: list[Any]
) -> Procedure[list[list[Timestamp]] | None]:
    """Each shard's edges in ``directions``, read with a client of its own (kept in ``opened``);
    None as soon as one shard's cannot be read."""
    per_shard: list[list[Timestamp]] = []
    for doc in shards:
        shard, host = str(doc.get("_id")), str(doc.get("host", ""))
        try:
            shard_client = shard_client_for(client, host)
        except ConfigurationError as error:
            _unreadable(f"{host} client", f"cannot connect to shard {shard!r} ({host}): {error}")
            return None
        opened.append(shard_client)
        found: list[Timestamp] = []
        for direction in directions:
            try:
                entry = yield _find_edge(shard_client, direction)
            except OperationFailure as error:
                _unreadable(
                    f"{host} {error.code}",
                    f"cannot read local.oplog.rs on shard {shard!r} ({host}): {_failure(error)}; "
                    f"{SHARD_PRIVILEGES}",
                )
                return None
            except ConnectionFailure as error:
                _unreadable(
                    f"{host} unreachable",
                    f"cannot reach shard {shard!r} at {host}: {error}; reading a shard's oplog needs "
                    "the hosts config.shards names for it to be reachable from this process",
                )
                return None
            edge = _edge(entry)
            if edge is None:
                log.debug("the oplog of shard %r (%s) has no entry", shard, host)
                return None
            found.append(edge)
        per_shard.append(found)
    return per_shard


def _find_edge(client: Any, direction: int) -> Call:
    oplog = client["local"]["oplog.rs"]
    return call(oplog, "find_one", filter={}, projection={"ts": 1}, sort=[("$natural", direction)])


def _failure(error: OperationFailure) -> str:
    details = error.details or {}
    return f"{details.get('errmsg', error)} ({details.get('codeName', 'code')} {error.code})"


_REPORTED: set[str] = set()
"""The reasons already logged at WARNING in this process, by ``_unreadable``'s key."""


def _unreadable(key: str, message: str) -> None:
    """Say why the oplog cannot be read: a WARNING the first time this process meets the reason
    ``key`` names (a shard's host and the error's kind), DEBUG after that, since the oplog-window
    metric asks again every minute."""
    if key in _REPORTED:
        log.debug("%s", message)
        return
    _REPORTED.add(key)
    log.warning("%s", message)


# Options that name a deployment rather than describe a connection: a shard's client sets its own.
_DEPLOYMENT_OPTIONS = frozenset(
    {"replicaset", "directconnection", "loadbalanced", "srvservicename", "srvmaxhosts"}
)


def shard_client_for(client: Any, shard_host: str) -> Any:
    """A client of ``client``'s class, options and credentials for one shard's replica set.

    ``shard_host`` is a ``config.shards`` host: ``<replica set>/<host:port>,...`` (or a bare
    ``host:port``). PyMongo has no public way to derive a client for other hosts; this reads the
    arguments the client was created with (``_init_kwargs``, what PyMongo's own ``_duplicate``
    copies), so TLS files, credentials, timeouts and the rest carry over exactly as given. In a
    URI only the host list is replaced, and the options that name a deployment (``replicaSet``,
    ``directConnection``, ``loadBalanced``, SRV's) are dropped; a ``mongodb+srv`` URI becomes a
    ``mongodb`` one, with TLS on unless it says otherwise, as SRV implies. The authentication
    database is the one the client resolved, which an SRV record may have given.
    """
    set_name, _, seeds = shard_host.rpartition("/")
    # motor's clients wrap a PyMongo client (a PyMongo client answers any attribute: a database).
    motor = getattr(type(client), "__delegate_class__", None) is not None
    source = client.delegate if motor else client
    given = getattr(source, "_init_kwargs", None)
    if not isinstance(given, dict):
        raise ConfigurationError(
            f"cannot derive a client for the shard from a {type(client).__name__} "
            "(it does not keep the arguments it was created with)"
        )
    kwargs = {k: v for k, v in given.items() if k.lower() not in _DEPLOYMENT_OPTIONS}
    hosts = kwargs.pop("host", None)
    kwargs.pop("port", None)
    if motor:
        kwargs.pop("driver", None)  # motor adds its own again
    uri = next((h for h in ([hosts] if isinstance(hosts, str) else hosts or []) if "://" in h), None)
    target: str | list[str] = seeds.split(",")
    if uri is not None:
        target, srv = _with_hosts(uri, seeds)
        if srv and not any(k.lower() in ("tls", "ssl") for k in kwargs):
            kwargs["tls"] = True
    credentials = getattr(source.options.pool_options, "_credentials", None)
    if credentials is not None and not any(k.lower() == "authsource" for k in kwargs):
        kwargs["authSource"] = credentials.source
    if set_name:
        kwargs["replicaSet"] = set_name
    return type(client)(target, **kwargs)


def _with_hosts(uri: str, seeds: str) -> tuple[str, bool]:
    """``uri`` with its host list replaced by ``seeds`` and its deployment options dropped; and
    whether it was a ``mongodb+srv`` URI that did not set TLS itself."""
    scheme, _, rest = uri.partition("://")
    # Split as PyMongo's parser does: the host part ends at the first "/", user info at its last "@".
    host_part, _, path = rest.partition("/")
    userinfo, at, _ = host_part.rpartition("@")
    database, _, query = path.partition("?")
    kept = [
        option
        for option in query.replace(";", "&").split("&")
        if option and option.partition("=")[0].lower() not in _DEPLOYMENT_OPTIONS
    ]
    names = {option.partition("=")[0].lower() for option in kept}
    srv = scheme == "mongodb+srv" and not names & {"tls", "ssl"}
    options = f"?{'&'.join(kept)}" if kept else ""
    return f"mongodb://{userinfo}{at}{seeds}/{database}{options}", srv


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
    "REFUSED_TOKEN_CODES",
    "SHARD_PRIVILEGES",
    "Recovery",
    "ahead_of_server",
    "cluster_time_of",
    "open_change_stream",
    "opening_token",
    "oplog_edge",
    "oplog_edge_async",
    "oplog_window_async",
    "reachable",
    "recover_from_history_loss",
    "refused_position",
    "server_cluster_time",
    "shard_client_for",
]
