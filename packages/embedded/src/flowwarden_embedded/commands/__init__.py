"""The commands the embedded replica set answers, with MongoDB's reply shapes and error codes.

Each handler takes a :class:`Context` and returns the reply document without ``$clusterTime``
(the host adds it). Handlers raise :class:`~flowwarden_embedded.errors.CommandError` for
``ok: 0`` replies; per-statement failures of write commands go into ``writeErrors`` as MongoDB
reports them. The host finds a command with :func:`lookup`; its :class:`CommandSpec` says which
opcounter it bumps, whether ``failCommand`` may fail it and whether it is a retryable write.

One module per group of commands:

* ``handshake``: hello/isMaster, ping, and the version and limits they advertise;
* ``server_status``: buildInfo, serverStatus, replSetGetStatus, replSetGetConfig and the other
  self-reports;
* ``admin``: getCmdLineOpts, getParameter/setParameter, configureFailPoint;
* ``sessions``: sessions and transactions (start, end, refresh, kill, commit, abort);
* ``catalog``: namespaces (list, create, drop, rename, collMod);
* ``indexes``: createIndexes, listIndexes, dropIndexes;
* ``writes``: insert, update, delete, findAndModify;
* ``reads``: find, count, distinct, aggregate (and so opening change streams);
* ``cursors``: getMore, killCursors;
* ``stats``: collStats, dbStats and the ``$collStats`` stage;
* ``explain``: explain of find, aggregate, count, distinct, update, delete and findAndModify;
* ``current_op``: currentOp, killOp and the ``$currentOp`` stage;
* ``sharding``: what only a mongos has (listShards, enableSharding, shardCollection).

``registry`` holds the table, ``arguments`` the field checks and ``replies`` the reply shapes
they share.
"""

from __future__ import annotations

from flowwarden_embedded.commands import (
    admin,
    catalog,
    current_op,
    cursors,
    explain,
    handshake,
    indexes,
    reads,
    server_status,
    sessions,
    sharding,
    stats,
    writes,
)
from flowwarden_embedded.commands.registry import CommandSpec, Context, lookup, namespace_of

# Importing a group registers its commands in the table: all of them are imported here, so the
# table is complete as soon as anything uses this package.
GROUPS = (
    handshake,
    server_status,
    admin,
    sessions,
    catalog,
    indexes,
    writes,
    reads,
    cursors,
    sharding,
    stats,
    explain,
    current_op,
)

__all__ = ["GROUPS", "CommandSpec", "Context", "lookup", "namespace_of"]
