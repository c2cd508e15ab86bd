"""What tests of flowwarden handlers import.

:class:`EmbeddedReplicaSet` is the MongoDB test double of the ``flowwarden-embedded``
distribution (the ``embedded`` extra: ``pip install "flowwarden[embedded]"``), re-exported here: a
replica set or sharded cluster speaking the wire protocol on 127.0.0.1, for tests, examples and
demos. It is not a database to run production on: point production at a real MongoDB deployment
(see docker-compose.yml). Without the extra, asking for it raises
:class:`~flowwarden.errors.MissingDependencyError` with the pip line to run. Its pytest plugin
(the ``embedded_rs`` fixture) comes with the distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowwarden_embedded import EmbeddedReplicaSet

__all__ = ["EmbeddedReplicaSet"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that only using the test double needs the extra.
    if name == "EmbeddedReplicaSet":
        try:
            from flowwarden_embedded import EmbeddedReplicaSet
        except ImportError as missing:
            from flowwarden.errors import MissingDependencyError

            raise MissingDependencyError(
                "flowwarden.testing.EmbeddedReplicaSet", extra="embedded", package="flowwarden-embedded"
            ) from missing
        return EmbeddedReplicaSet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
