"""Fixtures shared by every test folder.

MongoDB-backed tests take ``mongodb_uri``: by default one EmbeddedReplicaSet started for the whole
run; with ``FLOWWARDEN_TEST_MONGODB_URI`` set, that server instead. A test is marked
``embedded_only`` when, and only when, it uses something only EmbeddedReplicaSet has: a helper
MongoDB has no command for (``outage()``, ``drop_connections()``, ``stop()``, a small
``oplog_max_events``) or an ``EmbeddedReplicaSet(...)`` of its own. Against a real server those
tests are deselected and the run's summary says how many; every other test runs there too.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pymongo
import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from flowwarden.testing import EmbeddedReplicaSet

REAL_URI = os.environ.get("FLOWWARDEN_TEST_MONGODB_URI") or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REAL_URI is None:
        return
    deselected = [item for item in items if item.get_closest_marker("embedded_only")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def pytest_report_header(config: pytest.Config) -> str:
    if REAL_URI:
        return "flowwarden: MongoDB tests run against FLOWWARDEN_TEST_MONGODB_URI (embedded_only deselected)"
    return "flowwarden: MongoDB tests run against EmbeddedReplicaSet"


@pytest.fixture(scope="session")
def shared_rs() -> Iterator[EmbeddedReplicaSet | None]:
    """The run's one EmbeddedReplicaSet, or None when testing a real server."""
    if REAL_URI is not None:
        yield None
        return
    from flowwarden.testing import EmbeddedReplicaSet

    with EmbeddedReplicaSet() as rs:
        yield rs


@pytest.fixture(scope="session")
def mongodb_uri(shared_rs: EmbeddedReplicaSet | None) -> str:
    if shared_rs is None:
        assert REAL_URI is not None
        return REAL_URI
    return shared_rs.uri


@pytest.fixture
def rs(shared_rs: EmbeddedReplicaSet | None) -> EmbeddedReplicaSet:
    """The shared EmbeddedReplicaSet itself, for ``embedded_only`` tests."""
    if shared_rs is None:
        pytest.fail("this test uses EmbeddedReplicaSet helpers; mark it embedded_only")
    return shared_rs


@pytest.fixture
def client(mongodb_uri: str) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(mongodb_uri, serverSelectionTimeoutMS=10_000) as c:
        yield c


@pytest.fixture
async def async_client(mongodb_uri: str) -> AsyncIterator[pymongo.AsyncMongoClient]:
    c: pymongo.AsyncMongoClient = pymongo.AsyncMongoClient(mongodb_uri, serverSelectionTimeoutMS=10_000)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def needs_hashed_index_key(client: pymongo.MongoClient) -> None:
    """Skips a test of partitioned streams on a server older than 7.0."""
    found = client.server_info()["versionArray"][0]
    if found < 7:
        pytest.skip(f"needs MongoDB 7.0+ ($toHashedIndexKey splits the stream); the deployment runs {found}")


@pytest.fixture
def db_name(mongodb_uri: str) -> Iterator[str]:
    """A database name of this test's own, so tests never see each other's data or events; the
    database is dropped after the test (a real server keeps no test data)."""
    name = f"fwtest_{uuid.uuid4().hex[:12]}"
    yield name
    with pymongo.MongoClient(mongodb_uri, serverSelectionTimeoutMS=10_000) as c:
        c.drop_database(name)


@pytest.fixture
def next_server_second(client: pymongo.MongoClient, db_name: str) -> Callable[[], datetime]:
    """``next_server_second()``: the start of a second of the server's clock that comes after
    every write made so far.

    Cluster times count whole seconds, so a cut between two writes needs the server's clock to
    move to its next second. The probe writes that wait for it go to a ``clock`` collection that
    no stream in the tests watches; the server's clock, not this machine's, decides.
    """
    probes = client[db_name]["clock"]

    def wait() -> datetime:
        with client.start_session() as session:
            probes.insert_one({}, session=session)
            last = session.operation_time.time
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                probes.insert_one({}, session=session)
                if session.operation_time.time > last:
                    return datetime.fromtimestamp(session.operation_time.time, tz=timezone.utc)
                time.sleep(0.02)
        raise AssertionError("the server's cluster time did not reach its next second in 20s")

    return wait


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """``flowwarden.cli.main`` configures logging for its process; run in a test, it would leave
    its handler and levels to every later test. They are put back after each test."""
    root, ours = logging.getLogger(), logging.getLogger("flowwarden")
    handlers, level = root.handlers[:], ours.level
    yield
    root.handlers[:] = handlers
    ours.setLevel(level)


@pytest.fixture
def cluster() -> Iterator[EmbeddedReplicaSet]:
    """An ``EmbeddedReplicaSet(topology="sharded")`` of the test's own: a mongos and its shard."""
    from flowwarden.testing import EmbeddedReplicaSet

    with EmbeddedReplicaSet(topology="sharded") as deployment:
        yield deployment


@pytest.fixture
def mongos(cluster: EmbeddedReplicaSet) -> Iterator[pymongo.MongoClient]:
    """A client of ``cluster``'s mongos (the contract tests have a ``mongos`` of their own)."""
    with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


# One local SparkSession for the whole test run, shared by every test that needs Spark (marked
# ``spark``): starting Spark costs seconds. Tests must not stop it or change its global settings.
@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from flowwarden.spark import get_or_create_session, register

    session = get_or_create_session(
        "local[2]",
        app_name="flowwarden-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        },
    )
    master = session.sparkContext.master
    if master != "local[2]":
        session.stop()
        pytest.fail(
            f"a Spark session ({master}) was started before the shared one and left running: a test "
            "that needs Spark takes the `spark` fixture (and passes it on, e.g. Connector(spark=spark))"
        )
    session.sparkContext.setLogLevel("ERROR")
    import pyspark

    from flowwarden.spark._extra import STREAMING_SOURCE_PYSPARK

    if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= STREAMING_SOURCE_PYSPARK:
        register(session)  # scripts/oldest-pyspark runs the DataFrame tests on a PySpark without it
    yield session
    session.stop()


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time nine hours ahead of UTC: a local time stored as UTC shows."""
    monkeypatch.setenv("TZ", "JST-9")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
