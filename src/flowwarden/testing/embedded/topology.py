"""The server processes of an embedded deployment, as clients see them.

A ``replica_set`` deployment is one process: the member of the replica set ``rs0``. A ``sharded``
deployment is two: a mongos, which clients connect to, and the member of the shard's replica set
(``shard0``), on a port of its own so that a client can also connect to the shard directly, as
MongoDB's documentation allows for per-shard work such as reading a shard's oplog.

Both processes answer from one :class:`~flowwarden.testing.embedded.host.ReplicaSetHost`: the same
data, oplog, cursors and sessions, as a sharded cluster whose every collection lives on its one
shard. What is per process is what MongoDB keeps per process: the identity ``hello`` reports, the
commands it has, and its fail points. What a mongos refuses or answers differently is here too:
the ``local`` database (IllegalOperation, as every mongos command on it) and ``config.shards``.

Where it differs from a real cluster: the mongos does not send its work to the shard as
commands, so a fail point set on the shard fails only what clients send the shard directly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bson import ObjectId, Timestamp

from flowwarden.testing.embedded.errors import CommandError
from flowwarden.testing.embedded.failpoints import FailPoints
from flowwarden.testing.embedded.storage import Document

REPLICA_SET_NAME = "rs0"
SHARD_NAME = "shard0"
"""The shard's id in ``config.shards`` and the name of its replica set (MongoDB's default:
``addShard`` names a shard after its replica set)."""


class Role(enum.Enum):
    """What a process is: a replica set member (``mongod``) or a query router (``mongos``)."""

    MEMBER = "mongod"
    MONGOS = "mongos"


@dataclass(slots=True, eq=False)
class Process:
    """One server process: its role, its replica set (members only), its port and its fail points."""

    role: Role
    set_name: str | None = None
    port: int = 0
    process_id: ObjectId = field(default_factory=ObjectId)
    failpoints: FailPoints = field(default_factory=FailPoints)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_mongos(self) -> bool:
        return self.role is Role.MONGOS


def refuse_local_through_mongos(process: Process, db: str) -> None:
    """Every command a mongos gets for the ``local`` database fails, before authorization: each
    shard has a ``local`` database of its own, and a mongos routes to none of them."""
    if process.is_mongos and db == "local":
        raise CommandError(20, "Can't use 'local' database through mongos", code_name="IllegalOperation")


def shard_documents(member: Process, added: Timestamp) -> list[Document]:
    """``config.shards`` as a mongos reads it: one document per shard, ``host`` in the
    ``<replica set>/<host:port>,...`` form that a client can connect to directly."""
    return [
        {"_id": SHARD_NAME, "host": f"{member.set_name}/{member.address}", "state": 1, "topologyTime": added}
    ]


__all__ = [
    "REPLICA_SET_NAME",
    "SHARD_NAME",
    "Process",
    "Role",
    "refuse_local_through_mongos",
    "shard_documents",
]
