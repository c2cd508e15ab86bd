"""Fixtures shared by every test folder.

MongoDB-backed tests take ``mongodb_uri``: by default one EmbeddedReplicaSet started for the whole
run; with ``FLOWWARDEN_TEST_MONGODB_URI`` set, that server instead. Tests that need a helper MongoDB
has no command for (``outage()``, ``drop_connections()``, a small ``oplog_max_events``) are marked
``embedded_only``; against a real server they are deselected and the run's summary says how many.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pymongo
import pytest

if TYPE_CHECKING:
    from flowwarden.testing import EmbeddedReplicaSet

REAL_URI = os.environ.get("FLOWWARDEN_TEST_MONGODB_URI") or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "embedded_only: needs EmbeddedReplicaSet helpers")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REAL_URI is None:
        deselected = [item for item in items if item.get_closest_marker("real_mongodb")]
    else:
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
def db_name() -> str:
    """A database name of this test's own, so tests never see each other's data or events."""
    return f"fwtest_{uuid.uuid4().hex[:12]}"
