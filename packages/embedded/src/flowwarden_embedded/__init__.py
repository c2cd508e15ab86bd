"""flowwarden-embedded: a MongoDB replica set, or a sharded cluster, that speaks the wire protocol
on 127.0.0.1 from inside a Python process, for tests of code that reads change streams.

Unmodified PyMongo (sync and async) and motor clients connect to :class:`EmbeddedReplicaSet` with a
normal URI. It is a test double, never a database to run production on.

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

from flowwarden_embedded.server import EmbeddedReplicaSet

__version__ = "0.1.0"

__all__ = ["EmbeddedReplicaSet"]
