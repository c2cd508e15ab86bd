"""Partitioned handler classes for ``flowwarden run partition_handlers:<Class>`` (and ``flowwarden
dlq replay --handler``) in the process tests of partitioned streams.

Configured by environment variables (the command line names only the class):

- ``FW_TEST_DB``: the database whose ``orders`` collection is watched;
- ``FW_TEST_LOG``: a file that gets one line per handled event, flushed at once, so it holds
  every handling that finished even when the process is killed with SIGKILL;
- ``FW_TEST_PARTITIONS`` (default 3): the number of buckets;
- ``FW_TEST_SAVE_EVERY_N`` (default 10) and ``FW_TEST_SAVE_INTERVAL`` (default 60 seconds);
- ``FW_TEST_FAIL_KEYS``: comma-separated ``_id`` values (ints) whose events :class:`OrdersDlq`
  fails on, so they are dead-lettered; without it every method succeeds (the fix);
- ``FW_TEST_LAG_SECONDS`` (default 0.05): how long :class:`LaggingOrders` takes for each event of
  its first bucket;
- ``FW_TEST_LEASE_TTL`` (default 30): :class:`FleetOrders`' ``lease_ttl_seconds``.
"""

from __future__ import annotations

import asyncio
import os

from flowwarden import (
    ChangeEvent,
    OnError,
    StreamContext,
    change_stream,
    checkpoint,
    on_change,
    on_delete,
    on_insert,
    on_update,
    retry_policy,
)

_log = open(os.environ["FW_TEST_LOG"], "a", buffering=1)
_fail_keys = {int(key) for key in os.environ.get("FW_TEST_FAIL_KEYS", "").split(",") if key}


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    partitions=int(os.environ.get("FW_TEST_PARTITIONS", "3")),
    max_await_time_ms=50,
)
@checkpoint(
    save_every_n=int(os.environ.get("FW_TEST_SAVE_EVERY_N", "10")),
    save_interval_seconds=float(os.environ.get("FW_TEST_SAVE_INTERVAL", "60")),
)
class Orders:
    """Logs ``<bucket stream> <token _data>`` for each event it handled."""

    @on_change
    def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
        _log.write(f"{ctx.stream} {event.token['_data']}\n")


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    partitions=int(os.environ.get("FW_TEST_PARTITIONS", "3")),
    max_await_time_ms=50,
)
@checkpoint(
    save_every_n=int(os.environ.get("FW_TEST_SAVE_EVERY_N", "10")),
    save_interval_seconds=float(os.environ.get("FW_TEST_SAVE_INTERVAL", "60")),
)
class LaggingOrders:
    """:class:`Orders` whose first bucket is slow (it waits without holding the event loop), so
    at a stop it is behind the others: the buckets stored different positions."""

    _lag = float(os.environ.get("FW_TEST_LAG_SECONDS", "0.05"))

    @on_change
    async def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
        if ctx.stream.startswith("orders[0/"):
            await asyncio.sleep(self._lag)
        _log.write(f"{ctx.stream} {event.token['_data']}\n")


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    partitions=int(os.environ.get("FW_TEST_PARTITIONS", "3")),
    deployment="single_leader",
    lease_ttl_seconds=float(os.environ.get("FW_TEST_LEASE_TTL", "30")),
    max_await_time_ms=50,
)
@checkpoint(
    save_every_n=int(os.environ.get("FW_TEST_SAVE_EVERY_N", "10")),
    save_interval_seconds=float(os.environ.get("FW_TEST_SAVE_INTERVAL", "60")),
)
class FleetOrders:
    """:class:`Orders` with ``deployment="single_leader"``: the processes running it share its
    buckets. Logs ``<bucket stream> <token _data> <pid>`` for each event it handled."""

    @on_change
    def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
        _log.write(f"{ctx.stream} {event.token['_data']} {os.getpid()}\n")


class HandlerFailed(Exception):
    pass


@change_stream("orders", os.environ["FW_TEST_DB"], name="orders", partitions=3, max_await_time_ms=50)
@checkpoint(save_every_n=1)
@retry_policy(max_attempts=1, on_exhausted=OnError.DEAD_LETTER)
class OrdersDlq:
    """One method per operation type; each logs ``<method> <token _data> <ctx.stream>``, or
    fails for the keys of ``FW_TEST_FAIL_KEYS`` (the event is dead-lettered by its bucket)."""

    @on_insert
    def inserted(self, event: ChangeEvent, ctx: StreamContext) -> None:
        self._record("inserted", event, ctx)

    @on_update
    def updated(self, event: ChangeEvent, ctx: StreamContext) -> None:
        self._record("updated", event, ctx)

    @on_delete
    def deleted(self, event: ChangeEvent, ctx: StreamContext) -> None:
        self._record("deleted", event, ctx)

    def _record(self, method: str, event: ChangeEvent, ctx: StreamContext) -> None:
        key = event.document_key["_id"] if event.document_key else None
        if key in _fail_keys:
            raise HandlerFailed(f"{method} fails for document {key}")
        _log.write(f"{method} {event.token['_data']} {ctx.stream}\n")
