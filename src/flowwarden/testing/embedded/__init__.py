"""EmbeddedReplicaSet: a single-node MongoDB replica set speaking the wire protocol on 127.0.0.1.

Modules, from the socket inwards: ``server`` (the public class, thread and connections), ``wire``
(message framing), ``host`` (state and the per-command pipeline), the ``commands`` package (every
command, one module per group), ``crud`` and ``storage`` (documents, indexes, namespaces),
``sessions`` (transactions and retryable writes), ``failpoints`` (``failCommand``), ``cursors``,
``ttl`` (the TTL monitor); the oplog and change streams live in ``oplog``, ``tokens``, ``updates``
and ``changestream``.
"""

from __future__ import annotations

from flowwarden.testing.embedded.server import EmbeddedReplicaSet

__all__ = ["EmbeddedReplicaSet"]
