"""The connector's connection pool: one connection for each stream's waiting getMore, and more.

A client made from a URI is sized for its streams unless the URI says otherwise; a pool the user
sized (URI or client) with no connection beyond one per stream is refused with the numbers and
the fix; a stream whose opening waits long says so in its status and the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pymongo
import pytest

from flowwarden import ConfigurationError, Connector, StreamState
from flowwarden.runtime import stream as stream_module
from flowwarden.runtime.connections import make_client, uri_pool_size
from helpers import wait_until_async

from .conftest import FailCommand
from .handlers import recording_handler

UNREACHED = "mongodb://127.0.0.1:1/?replicaSet=rs0"  # nothing connects while a Connector is built


@pytest.mark.parametrize(
    ("uri", "size"),
    [
        ("mongodb://db1/?replicaSet=rs0&maxPoolSize=5", 5),
        ("mongodb://db1,db2:27018/shop?w=1;MAXPOOLSIZE=0", 0),
        ("mongodb+srv://app:p%3Fss@cluster.example.com/?maxpoolsize=300&authSource=admin", 300),
        ("mongodb://db1/?replicaSet=rs0", None),
        ("mongodb://db1", None),
        ("mongodb://db1/?maxPoolSize=many", None),  # the driver warns and ignores it
    ],
)
def test_the_pool_size_a_uri_sets_is_read_from_its_options(uri: str, size: int | None) -> None:
    assert uri_pool_size(uri) == size


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (UNREACHED, 128 + 100),
        (f"{UNREACHED}&maxPoolSize=500", 500),
        (f"{UNREACHED}&maxPoolSize=0", 0),
    ],
)
async def test_the_connectors_own_client_has_a_connection_per_stream_beside_the_drivers_default(
    uri: str, expected: int
) -> None:
    client = make_client(uri, 128)
    try:
        assert client.options.pool_options.max_pool_size == expected
    finally:
        await client.close()


def _partitioned(count: int) -> type:
    handler, _ = recording_handler("shop", stream={"partitions": count})
    return handler


@pytest.mark.parametrize("size", [1, 100, 129])
def test_a_uri_whose_pool_has_no_connection_beyond_the_streams_is_refused(size: int) -> None:
    other, _ = recording_handler("shop", name="other")  # 128 buckets and one more stream: 129
    with pytest.raises(ConfigurationError) as refused:
        Connector(f"{UNREACHED}&maxPoolSize={size}", [_partitioned(128), other])
    message = str(refused.value)
    assert f"the URI sets maxPoolSize={size}" in message and "runs 129 stream(s)" in message
    assert "Set maxPoolSize=229 (at least 130) in the URI, or leave it out" in message


@pytest.mark.parametrize("size", [130, 0])
def test_a_uri_whose_pool_leaves_a_connection_beyond_the_streams_is_accepted(size: int) -> None:
    other, _ = recording_handler("shop", name="other")
    connector = Connector(f"{UNREACHED}&maxPoolSize={size}", [_partitioned(128), other])
    assert len(connector.specs) == 129


async def test_a_client_whose_pool_has_no_connection_beyond_the_streams_is_refused() -> None:
    default = pymongo.AsyncMongoClient(UNREACHED, connect=False)  # the driver's 100
    sized = pymongo.AsyncMongoClient(UNREACHED, connect=False, maxPoolSize=129)
    try:
        with pytest.raises(ConfigurationError) as refused:
            Connector(default, [_partitioned(128)])
        message = str(refused.value)
        assert "the client passed in has maxPoolSize=100" in message and "runs 128 stream(s)" in message
        assert "Create the client with maxPoolSize=228 (at least 129), or pass the URI" in message
        assert len(Connector(sized, [_partitioned(128)]).specs) == 128
    finally:
        await default.close()
        await sized.close()


def test_a_motor_client_whose_pool_is_too_small_is_refused() -> None:
    motor_asyncio = pytest.importorskip("motor.motor_asyncio", reason="motor is the 'motor' extra")
    motor = motor_asyncio.AsyncIOMotorClient(UNREACHED, connect=False, maxPoolSize=8)
    try:
        with pytest.raises(ConfigurationError, match="the client passed in has maxPoolSize=8"):
            Connector(motor, [_partitioned(8)])
    finally:
        motor.close()


async def test_a_stream_that_waits_long_to_open_says_so_until_it_opens(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    fail_command: FailCommand,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(stream_module, "SLOW_OPEN_SECONDS", 0.2)
    # The opening's first aggregate (where the stream starts) waits on the server.
    fail_command(["aggregate"], mode={"times": 1}, blockConnection=True, blockTimeMS=1500)
    handler, seen = recording_handler(db_name)
    connector = Connector(mongodb_uri, [handler])
    caplog.set_level(logging.WARNING, logger="flowwarden")
    task = asyncio.create_task(connector.run_async())
    try:
        status = await wait_until_async(
            lambda: (s := connector.status()["orders"]).reason is not None and s, what="the slow-open reason"
        )
        assert status.state is StreamState.STARTING
        assert status.reason == (
            "not open after 0.2s: waiting for the deployment to answer or for a free connection in the "
            "client's pool (maxPoolSize 101)"
        )
        assert f"stream orders: {status.reason}" in caplog.messages
        await wait_until_async(lambda: connector.status()["orders"].state is StreamState.RUNNING, what="open")
        assert connector.status()["orders"].reason is None
        client[db_name].orders.insert_one({"_id": 1})
        await wait_until_async(lambda: seen == [("insert", 1)], what="the event")
    finally:
        connector.stop()
        await task
    assert fail_command.off() == 1
