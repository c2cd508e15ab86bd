"""pytest plugin (entry point ``pytest11``): the ``embedded_rs`` fixture.

``embedded_rs`` starts an :class:`~flowwarden_embedded.EmbeddedReplicaSet` for one test and stops
it afterwards, so every test sees an empty server with a fresh oplog.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from flowwarden_embedded import EmbeddedReplicaSet


@pytest.fixture
def embedded_rs() -> Iterator[EmbeddedReplicaSet]:
    """A running single-node replica set; connect with ``pymongo.MongoClient(embedded_rs.uri)``."""
    from flowwarden_embedded import EmbeddedReplicaSet

    with EmbeddedReplicaSet() as rs:
        yield rs
