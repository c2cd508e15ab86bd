"""EmbeddedReplicaSet: a single-node MongoDB replica set speaking the wire protocol on 127.0.0.1,
or a sharded cluster: a mongos in front of N single-node shards.

Modules, from the socket inwards: ``server`` (the public class, thread and connections), ``wire``
(message framing), ``topology`` (the processes clients reach: the member, or a mongos and its
shards; and which shard logs a write through the mongos), ``host``
(state and the per-command pipeline), the ``commands`` package (every command, one module per
group), ``crud`` and ``storage`` (documents, indexes, namespaces),
``sessions`` (transactions and retryable writes), ``failpoints`` (``failCommand``), ``cursors``,
``ttl`` (the TTL monitor); the oplog and change streams live in ``oplog``, ``tokens``, ``updates``,
``changestream``, ``shardmerge`` (a mongos's merge of its shards' oplogs) and ``largeevents``
(events over 16 MB).
"""

from __future__ import annotations

import importlib

from flowwarden.errors import MissingDependencyError


def _require_the_embedded_extra() -> None:
    """Import the ``embedded`` extra's packages, or fail with the pip line that installs them.

    Run before any module of the test double is imported, so a missing package is reported as
    what to install rather than as a bare ImportError from deep inside the server.
    """
    for module, package in (("mongomock", "mongomock"), ("google_crc32c", "google-crc32c")):
        try:
            importlib.import_module(module)
        except ImportError as missing:
            raise MissingDependencyError(
                "flowwarden.testing.EmbeddedReplicaSet", extra="embedded", package=package
            ) from missing


_require_the_embedded_extra()

from flowwarden.testing.embedded.server import EmbeddedReplicaSet  # noqa: E402

__all__ = ["EmbeddedReplicaSet"]
