"""Test doubles for flowwarden and its users' tests.

:class:`EmbeddedReplicaSet` is a single-node MongoDB replica set speaking the wire protocol on
127.0.0.1, for tests, examples and demos. It is not a database to run production on: point
production at a real MongoDB replica set (see docker-compose.yml).
"""

from __future__ import annotations

from flowwarden.testing.embedded import EmbeddedReplicaSet

__all__ = ["EmbeddedReplicaSet"]
