"""MongoDB's failCommand fail point through configureFailPoint (needs enableTestCommands on real servers)."""

from __future__ import annotations

from collections.abc import Callable

import pymongo
import pytest
from pymongo.errors import AutoReconnect, NetworkTimeout, OperationFailure, WriteConcernError

FailCommand = Callable[..., dict]
"""The ``fail_command`` fixture (conftest.py): it switches the fail point off after each test."""


def test_error_code_with_exactly_the_named_labels(
    client: pymongo.MongoClient, db_name: str, fail_command: FailCommand
) -> None:
    fail_command({"times": 1}, failCommands=["find"], errorCode=2, errorLabels=["CustomLabel"])
    with pytest.raises(OperationFailure) as info:
        client[db_name].c.find_one()
    error = info.value
    assert error.code == 2
    assert error.details["codeName"] == "BadValue"
    assert error.details["errmsg"] == "Failing command via 'failCommand' failpoint"
    assert error.details["errorLabels"] == ["CustomLabel"]
    assert client[db_name].c.find_one() is None


def test_error_without_labels_gets_none_added(
    client: pymongo.MongoClient, db_name: str, fail_command: FailCommand
) -> None:
    fail_command({"times": 1}, failCommands=["aggregate"], errorCode=2)
    with pytest.raises(OperationFailure) as info:
        list(client[db_name].c.aggregate([]))
    assert "errorLabels" not in info.value.details


def test_times_mode_counts_down_and_always_on_until_off(
    client: pymongo.MongoClient, db_name: str, fail_command: FailCommand
) -> None:
    coll = client[db_name].c
    fail_command({"times": 2}, failCommands=["count"], errorCode=8)
    for _ in range(2):
        with pytest.raises(OperationFailure):
            client[db_name].command("count", "c")
    assert client[db_name].command("count", "c")["n"] == 0

    fail_command("alwaysOn", failCommands=["distinct"], errorCode=8)
    for _ in range(3):
        with pytest.raises(OperationFailure):
            coll.distinct("x")
    fail_command("off")
    assert coll.distinct("x") == []


async def test_error_code_async(
    async_client: pymongo.AsyncMongoClient, db_name: str, fail_command: FailCommand
) -> None:
    fail_command({"times": 1}, failCommands=["insert"], errorCode=262, errorLabels=["RetryableWriteError"])
    # Retryable writes retry once on a labelled error, so the second attempt succeeds. (A
    # "not primary"/"shutting down" code would also make the client wait for its next heartbeat.)
    await async_client[db_name].c.insert_one({"_id": 1})
    assert await async_client[db_name].c.count_documents({}) == 1


def test_close_connection(
    mongodb_uri: str, db_name: str, client: pymongo.MongoClient, fail_command: FailCommand
) -> None:
    with pymongo.MongoClient(mongodb_uri, retryReads=False, retryWrites=False) as plain:
        plain.admin.command("ping")
        fail_command({"times": 1}, failCommands=["find"], closeConnection=True)
        with pytest.raises(AutoReconnect):
            plain[db_name].c.find_one()
        assert plain[db_name].c.find_one() is None


def test_retryable_write_survives_a_closed_connection_once(
    client: pymongo.MongoClient, db_name: str, fail_command: FailCommand
) -> None:
    fail_command({"times": 1}, failCommands=["insert"], closeConnection=True)
    client[db_name].c.insert_one({"_id": "exactly-once"})
    assert client[db_name].c.count_documents({}) == 1


def test_block_connection(
    mongodb_uri: str, db_name: str, client: pymongo.MongoClient, fail_command: FailCommand
) -> None:
    with pymongo.MongoClient(mongodb_uri, socketTimeoutMS=300, retryReads=False) as impatient:
        impatient.admin.command("ping")
        fail_command({"times": 1}, failCommands=["find"], blockConnection=True, blockTimeMS=2000)
        with pytest.raises(NetworkTimeout):
            impatient[db_name].c.find_one()


def test_app_name_filters_the_clients_it_fails(
    mongodb_uri: str, db_name: str, client: pymongo.MongoClient, fail_command: FailCommand
) -> None:
    with (
        pymongo.MongoClient(mongodb_uri, appname="victim") as victim,
        pymongo.MongoClient(mongodb_uri, appname="bystander") as bystander,
    ):
        fail_command("alwaysOn", failCommands=["find"], errorCode=2, appName="victim")
        assert bystander[db_name].c.find_one() is None
        with pytest.raises(OperationFailure):
            victim[db_name].c.find_one()


def test_write_concern_error(client: pymongo.MongoClient, db_name: str, fail_command: FailCommand) -> None:
    fail_command(
        {"times": 1},
        failCommands=["insert"],
        writeConcernError={
            "code": 64,
            "codeName": "WriteConcernFailed",
            "errmsg": "waiting for replication timed out",
        },
    )
    with pytest.raises(WriteConcernError) as info:
        client[db_name].c.insert_one({"_id": "written"})
    assert info.value.code == 64
    # The write itself happened; only its write concern reported an error.
    assert client[db_name].c.find_one({"_id": "written"}) == {"_id": "written"}


def test_configure_fail_point_only_on_admin(client: pymongo.MongoClient, db_name: str) -> None:
    with pytest.raises(OperationFailure) as info:
        client[db_name].command("configureFailPoint", "failCommand", mode="off")
    assert info.value.code == 13


async def test_close_and_block_connection_async(
    mongodb_uri: str, db_name: str, fail_command: FailCommand
) -> None:
    plain = pymongo.AsyncMongoClient(mongodb_uri, retryReads=False, socketTimeoutMS=300)
    try:
        await plain.admin.command("ping")
        fail_command({"times": 1}, failCommands=["find"], closeConnection=True)
        with pytest.raises(AutoReconnect):
            await plain[db_name].c.find_one()
        fail_command({"times": 1}, failCommands=["find"], blockConnection=True, blockTimeMS=2000)
        with pytest.raises(NetworkTimeout):
            await plain[db_name].c.find_one()
        assert await plain[db_name].c.find_one() is None
    finally:
        await plain.close()


async def test_app_name_async(
    mongodb_uri: str, db_name: str, client: pymongo.MongoClient, fail_command: FailCommand
) -> None:
    victim = pymongo.AsyncMongoClient(mongodb_uri, appname="async-victim")
    try:
        fail_command({"times": 1}, failCommands=["insert"], errorCode=2, appName="async-victim")
        client[db_name].c.insert_one({"_id": "bystander"})
        with pytest.raises(OperationFailure) as info:
            await victim[db_name].c.insert_one({"_id": "victim"})
        assert info.value.code == 2
        assert await victim[db_name].c.count_documents({}) == 1
    finally:
        await victim.close()
