"""Fixtures of the test double's own tests: one EmbeddedReplicaSet for the run, clients of it,
a database per test, and a sharded deployment per test that asks for one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pymongo
import pytest

from flowwarden_embedded import EmbeddedReplicaSet


@pytest.fixture(scope="session")
def rs() -> Iterator[EmbeddedReplicaSet]:
    """The run's one replica set; tests keep to a database of their own (``db_name``)."""
    with EmbeddedReplicaSet() as server:
        yield server


@pytest.fixture
def client(rs: EmbeddedReplicaSet) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=10_000) as c:
        yield c


@pytest.fixture
def db_name(client: pymongo.MongoClient) -> Iterator[str]:
    """A database of this test's own, dropped afterwards."""
    name = f"embtest_{uuid.uuid4().hex[:12]}"
    yield name
    client.drop_database(name)


@pytest.fixture
def cluster() -> Iterator[EmbeddedReplicaSet]:
    """An ``EmbeddedReplicaSet(topology="sharded")`` of the test's own: a mongos and its shard."""
    with EmbeddedReplicaSet(topology="sharded") as deployment:
        yield deployment


@pytest.fixture
def mongos(cluster: EmbeddedReplicaSet) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=10_000) as client:
        yield client
