"""Fixtures of the contract tests (the suite every MongoDB server here must pass).

A test marked ``through_mongos`` runs twice on the embedded server: against the replica set, and
through the mongos of an ``EmbeddedReplicaSet(topology="sharded")``, so that what clients observe
through a mongos is held to the same contract. Against FLOWWARDEN_TEST_MONGODB_URI it runs once,
against that deployment, whichever kind it is. ``mongos_uri`` is for tests about a mongos itself,
``replica_set_member`` for tests of what only a replica set member has.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pymongo
import pytest

if TYPE_CHECKING:
    from flowwarden.testing import EmbeddedReplicaSet

# The switch tests/conftest.py reads: a real deployment is tested as it is, in one topology.
TESTING_A_REAL_DEPLOYMENT = bool(os.environ.get("FLOWWARDEN_TEST_MONGODB_URI"))
TOPOLOGIES = ("replica_set", "sharded")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "through_mongos: runs against the embedded replica set and through an embedded mongos "
        "(once, against FLOWWARDEN_TEST_MONGODB_URI)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        not TESTING_A_REAL_DEPLOYMENT
        and metafunc.definition.get_closest_marker("through_mongos")
        and "mongodb_uri" in metafunc.fixturenames
    ):
        metafunc.parametrize("topology", TOPOLOGIES, indirect=True, scope="session")


@pytest.fixture(scope="session")
def topology(request: pytest.FixtureRequest) -> str:
    """The embedded deployment a test runs against: ``replica_set`` unless parametrized."""
    return str(getattr(request, "param", "replica_set"))


@pytest.fixture(scope="session")
def shared_sharded() -> Iterator[EmbeddedReplicaSet]:
    """The run's one embedded sharded cluster: a mongos and two shards."""
    from flowwarden.testing import EmbeddedReplicaSet

    with EmbeddedReplicaSet(topology="sharded", shards=2) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def mongodb_uri(mongodb_uri: str, topology: str, request: pytest.FixtureRequest) -> str:
    if topology == "sharded":
        cluster: EmbeddedReplicaSet = request.getfixturevalue("shared_sharded")
        return cluster.uri
    return mongodb_uri


@pytest.fixture
def rs(rs: EmbeddedReplicaSet, topology: str, request: pytest.FixtureRequest) -> EmbeddedReplicaSet:
    """The embedded deployment the test runs against, for ``embedded_only`` tests."""
    if topology == "sharded":
        cluster: EmbeddedReplicaSet = request.getfixturevalue("shared_sharded")
        return cluster
    return rs


@pytest.fixture
def replica_set_member(client: pymongo.MongoClient) -> None:
    """Skips the test, saying why, when the deployment answers as a mongos: the test reads what
    only a replica set member has (its oplog, the replica set fields of its hello)."""
    if client.admin.command("hello").get("msg") == "isdbgrid":
        pytest.skip("reads what only a replica set member has; the deployment tested is a mongos")


@pytest.fixture(scope="session")
def mongos_uri(request: pytest.FixtureRequest) -> str:
    """A mongos to test: the embedded one, or FLOWWARDEN_TEST_MONGODB_URI when that deployment is
    a sharded cluster (the test is skipped, saying so, when it is not)."""
    if not TESTING_A_REAL_DEPLOYMENT:
        cluster: EmbeddedReplicaSet = request.getfixturevalue("shared_sharded")
        return cluster.uri
    uri = os.environ["FLOWWARDEN_TEST_MONGODB_URI"]
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        if client.admin.command("hello").get("msg") != "isdbgrid":
            pytest.skip("needs a sharded cluster; FLOWWARDEN_TEST_MONGODB_URI names a replica set")
    return uri


@pytest.fixture
def mongos(mongos_uri: str) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(mongos_uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


@pytest.fixture
def fail_command(client: pymongo.MongoClient) -> Iterator[Callable[..., dict[str, Any]]]:
    """``fail_command(mode, **data)`` configures MongoDB's ``failCommand`` fail point.

    The fail point is server-wide and the run shares one server, so whatever the test did with it,
    passed or failed, it is switched off when the test ends.
    """

    def configure(mode: object, **data: object) -> dict[str, Any]:
        reply: dict[str, Any] = client.admin.command(
            "configureFailPoint", "failCommand", mode=mode, data=data
        )
        return reply

    yield configure
    client.admin.command("configureFailPoint", "failCommand", mode="off")


@pytest.fixture
def fail_get_more(client: pymongo.MongoClient) -> Iterator[Callable[..., dict[str, Any]]]:
    """``fail_get_more(mode, error_code)`` configures ``failGetMoreAfterCursorCheckout``; switched
    off when the test ends."""

    def configure(mode: object, error_code: int) -> dict[str, Any]:
        reply: dict[str, Any] = client.admin.command(
            "configureFailPoint",
            "failGetMoreAfterCursorCheckout",
            mode=mode,
            data={"errorCode": error_code},
        )
        return reply

    yield configure
    client.admin.command("configureFailPoint", "failGetMoreAfterCursorCheckout", mode="off")


@pytest.fixture
def requires_mongodb(client: pymongo.MongoClient) -> Callable[[int, str], None]:
    """``requires_mongodb(major, why)`` skips the test, saying why, when the deployment runs a
    MongoDB older than ``major``."""

    def check(major: int, why: str) -> None:
        found = client.server_info()["versionArray"][0]
        if found < major:
            pytest.skip(f"needs MongoDB {major}.0+ ({why}); the deployment runs {found}")

    return check
