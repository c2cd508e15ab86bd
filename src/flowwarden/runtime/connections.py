"""How many connections the connector's client may hold: one per stream, and room for the rest.

Each running stream keeps one change stream ``getMore`` in flight (its read-ahead task), and a
``getMore`` holds a pooled connection for up to ``maxAwaitTimeMS``; the next one is asked for as
soon as it returns. The driver's pool (``maxPoolSize``, 100 by default) is not first come, first
served: a task that checks a connection in and at once asks for another takes it back before any
task queued for one wakes. With as many streams as the pool has connections, the readers that
hold them keep them for good, and everything queued behind them (other streams' openings,
checkpoint saves, lease renewals) waits forever, with no error.

The hard rule: the client's pool has more connections than the connector runs streams. A client
flowwarden makes from a URI gets ``maxPoolSize`` = streams + the driver's default (100) unless the
URI sets one; a ``maxPoolSize`` the user set (in the URI or on a client passed in) that is not
larger than the number of streams is refused when the connector is built. ``0`` (no limit) is
always enough. The pool opens connections only as they are needed, so a larger limit costs
nothing until the streams use it.
"""

from __future__ import annotations

from typing import Any

from flowwarden.errors import ConfigurationError

DRIVER_POOL_SIZE = 100
"""PyMongo's default maxPoolSize: the room a flowwarden-made client keeps beside its streams."""


def pool_size_for(streams: int) -> int:
    """The ``maxPoolSize`` of a client flowwarden makes for ``streams`` streams: one connection for
    each stream's waiting ``getMore``, and the driver's default for everything else."""
    return streams + DRIVER_POOL_SIZE


def uri_pool_size(uri: str) -> int | None:
    """The ``maxPoolSize`` a MongoDB URI sets, or None when it sets none.

    Read from the options after the host list as the driver splits them (``&`` or ``;``); a value
    that is not a number is left for the driver to refuse with its own message.
    """
    _, _, after_scheme = uri.partition("://")
    _, _, path = after_scheme.partition("/")
    _, _, options = path.partition("?")
    found: int | None = None
    for pair in options.replace(";", "&").split("&"):
        key, _, value = pair.partition("=")
        if key.strip().lower() == "maxpoolsize":
            try:
                found = int(value)
            except ValueError:
                return None
    return found


def make_client(uri: str, streams: int) -> Any:
    """The connector's own client for ``uri``: ``maxPoolSize`` sized for ``streams`` unless the URI
    sets it (then :func:`check_pool_size` has checked it)."""
    from pymongo import AsyncMongoClient

    options: dict[str, Any] = {"tz_aware": True, "appname": "flowwarden"}
    if uri_pool_size(uri) is None:
        options["maxPoolSize"] = pool_size_for(streams)
    return AsyncMongoClient(uri, **options)


def client_pool_size(client: Any) -> int | None:
    """The ``maxPoolSize`` of a client passed in (PyMongo or motor), or None when it cannot be read."""
    pool_options = getattr(getattr(client, "options", None), "pool_options", None)
    size = getattr(pool_options, "max_pool_size", None)
    return size if isinstance(size, int) else None


def check_pool_size(max_pool_size: int | None, streams: int, *, given_client: bool) -> None:
    """Refuse a ``maxPoolSize`` that cannot serve ``streams`` streams (see the module docstring)."""
    if max_pool_size is None or max_pool_size == 0 or max_pool_size > streams:
        return
    needed, size = streams + 1, pool_size_for(streams)
    if given_client:
        where = "the client passed in has"
        fix = (
            f"Create the client with maxPoolSize={size} (at least {needed}), or pass the URI and "
            "flowwarden sizes the pool itself"
        )
    else:
        where = "the URI sets"
        fix = (
            f"Set maxPoolSize={size} (at least {needed}) in the URI, or leave it out and flowwarden "
            "sizes the pool itself"
        )
    raise ConfigurationError(
        f"{where} maxPoolSize={max_pool_size}, but the connector runs {streams} stream(s) and each "
        "holds one connection while its getMore waits for events; without a connection beyond "
        "those, the streams holding them keep them and the others wait forever to open or to save "
        f"their checkpoints. {fix}",
        owner="Connector",
        option="uri_or_client",
        value=max_pool_size,
    )


__all__ = [
    "DRIVER_POOL_SIZE",
    "check_pool_size",
    "client_pool_size",
    "make_client",
    "pool_size_for",
    "uri_pool_size",
]
