"""The server processes of an embedded deployment, as clients see them, and where a sharded
cluster's writes are logged.

A ``replica_set`` deployment is one process: the member of the replica set ``rs0``. A ``sharded``
deployment of N shards is N + 1: a mongos, which clients connect to, and one replica set member
per shard (``shard0``, ``shard1``, ...; each the only member of the replica set of that name), on
ports of their own, so that a client can also connect to a shard directly, as MongoDB's
documentation allows for per-shard work such as reading a shard's oplog. ``config.shards`` (and
``listShards``) through the mongos list them all.

What is per process is what MongoDB keeps per process: the identity ``hello`` reports, the
commands it has, its fail points, and, for a member, its oplog: its own entries, its own
retention, its own cluster time. What a mongos refuses or answers differently is here too: the
``local`` database (IllegalOperation, as every mongos command on it) and ``config.shards``,
``config.databases``, ``config.collections``.

Where a write through the mongos is logged (:class:`Placement`):

* every database has a primary shard, given when the mongos first logs something of it (or by
  ``enableSharding``'s ``primaryShard``): round-robin, the k-th database on shard ``k mod N``
  (``admin`` and ``config`` on ``shard0``). Its unsharded collections, and every DDL of the
  database (create, drop, rename, indexes, collMod, dropDatabase, views), are logged there;
* ``shardCollection`` with the shard key ``{_id: "hashed"}`` (the only one modelled) spreads a
  collection's documents over all shards: a document belongs to the shard whose share of the
  64-bit hash range holds the hash of its ``_id`` (``hashed_index_key``, mongod's hash; the N
  shares are equal, as the initial chunks of a hashed collection are). A document write is logged,
  and its change event made, by the shard that owns the document, at that shard's cluster time;
  a multi-document write is one entry per document, each on its own shard;
* before a command's first write to a shard, the mongos tells it the mongos's cluster time, so a
  write that follows another in time is logged after it whatever the shards; the parts of one
  command on different shards get their shards' next times, which may tie (as the sub-batches
  a mongos sends the shards in parallel do);
* a transaction that wrote to several shards is logged on each of them, its part as one entry,
  all at one commit time (MongoDB's two-phase commit), each part's ``txnOpIndex`` counted on its
  own shard;
* a write a client sends a shard directly is logged by that shard, wherever the document
  belongs.

Where it differs from a real cluster:

* the data itself is one store: the mongos and every shard read every document of the cluster
  (a shard connected to directly is not limited to its own); only oplogs, cluster times and
  change events are per shard. Documents do not migrate: sharding a collection that has
  documents moves them to their hash's shard at once, without migration entries, and there is
  no balancer, no chunk, no ``movePrimary`` and no ``shardCollection`` change event;
* the mongos does not send its work to the shards as commands, so a fail point set on a shard
  fails only what clients send that shard directly;
* cursors and sessions are the deployment's, not each process's.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId, Timestamp

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.failpoints import FailPoints
from flowwarden_embedded.hashing import hashed_index_key
from flowwarden_embedded.oplog import DOCUMENT_OPS, Oplog, OplogOp
from flowwarden_embedded.storage import Document

REPLICA_SET_NAME = "rs0"
HASHED_ID = {"_id": "hashed"}
"""The one shard key the embedded cluster shards by."""
# Databases a real cluster keeps on its config servers: logged on the first shard here.
_CLUSTER_DATABASES = frozenset({"admin", "config"})


def shard_name(index: int) -> str:
    """The ``index``-th shard's id in ``config.shards`` and the name of its replica set
    (MongoDB's default: ``addShard`` names a shard after its replica set)."""
    return f"shard{index}"


class Role(enum.Enum):
    """What a process is: a replica set member (``mongod``) or a query router (``mongos``)."""

    MEMBER = "mongod"
    MONGOS = "mongos"


@dataclass(slots=True, eq=False)
class Process:
    """One server process: its role, its replica set and oplog (members only), its port and its
    fail points."""

    role: Role
    set_name: str | None = None
    port: int = 0
    oplog: Oplog | None = None
    process_id: ObjectId = field(default_factory=ObjectId)
    # A member's replica set's id, as its configuration's settings.replicaSetId.
    replica_set_id: ObjectId = field(default_factory=ObjectId)
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


def hash_share(value: Any, shards: int) -> int:
    """Which of ``shards`` equal shares of the hashed-index-key range holds ``value``'s hash."""
    return ((int(hashed_index_key(value)) + (1 << 63)) * shards) >> 64


@dataclass(slots=True)
class _ShardedCollection:
    key: Document
    epoch: ObjectId = field(default_factory=ObjectId)


class Placement:
    """Which shard logs a write the mongos routes (the module docstring states the rules), and
    the catalog of shards, databases and sharded collections a mongos reads from its config
    servers."""

    def __init__(self, shards: Sequence[Process], added: Timestamp) -> None:
        if not shards:
            raise ValueError("a sharded cluster has at least one shard")
        self.shards = tuple(shards)
        self._added = added
        self._primaries: dict[str, Process] = {}
        self._round_robin = itertools.count()
        self._sharded: dict[tuple[str, str], _ShardedCollection] = {}

    def shard(self, name: str) -> Process | None:
        return next((shard for shard in self.shards if shard.set_name == name), None)

    def primary(self, db: str) -> Process:
        """The database's primary shard, chosen (round-robin) the first time it is needed."""
        found = self._primaries.get(db)
        if found is None:
            if db in _CLUSTER_DATABASES:
                return self.shards[0]
            found = self._primaries[db] = self.shards[next(self._round_robin) % len(self.shards)]
        return found

    def owner(self, op: OplogOp) -> Process:
        """The shard that logs ``op`` when it reaches the mongos."""
        if op.op in DOCUMENT_OPS and op.coll is not None and op.document_key is not None:
            if (op.db, op.coll) in self._sharded:
                return self.shards[hash_share(op.document_key.get("_id"), len(self.shards))]
        return self.primary(op.db)

    def is_sharded(self, db: str, coll: str) -> bool:
        return (db, coll) in self._sharded

    # -- sharding commands ------------------------------------------------------------------------

    def enable_sharding(self, db: str, primary_shard: str | None) -> None:
        """``enableSharding``: the database's primary shard, ``primary_shard`` when it is given."""
        if primary_shard is None:
            self.primary(db)
            return
        wanted = self.shard(primary_shard)
        if wanted is None:
            raise CommandError(70, f"Shard {primary_shard} not found", code_name="ShardNotFound")
        current = self._primaries.get(db)
        if current is not None and current is not wanted:
            raise CommandError(
                48,
                f"database {db} already exists with the primary shard {current.set_name}; the embedded "
                "cluster has no movePrimary: name the primary shard before the database's first write",
                code_name="NamespaceExists",
            )
        self._primaries[db] = wanted

    def shard_collection(self, db: str, coll: str, key: Mapping[str, Any]) -> bool:
        """``shardCollection``; False when the collection was sharded already with this key."""
        if dict(key) != HASHED_ID:
            raise CommandError(
                2,
                f"the embedded cluster shards a collection by {{_id: 'hashed'}} only, not by {dict(key)}; "
                "use that key, or a real sharded cluster for other shard keys",
                code_name="BadValue",
            )
        existing = self._sharded.get((db, coll))
        if existing is not None:
            if existing.key != dict(key):
                raise CommandError(
                    23,
                    f"sharding already enabled for collection {db}.{coll} with options {{ key: "
                    f"{existing.key} }}",
                    code_name="AlreadyInitialized",
                )
            return False
        self.primary(db)
        self._sharded[(db, coll)] = _ShardedCollection(dict(key))
        return True

    def observe(self, op: OplogOp) -> None:
        """Follow the catalog: a dropped collection is no longer sharded, a renamed one keeps its
        key under its new name, a dropped database forgets its primary shard."""
        if op.op == "drop" and op.coll is not None:
            self._sharded.pop((op.db, op.coll), None)
        elif op.op == "rename" and op.coll is not None and op.to is not None:
            moved = self._sharded.pop((op.db, op.coll), None)
            if moved is not None:
                self._sharded[op.to] = moved
        elif op.op == "dropDatabase":
            for ns in [ns for ns in self._sharded if ns[0] == op.db]:
                del self._sharded[ns]
            self._primaries.pop(op.db, None)

    # -- the config servers' catalog ----------------------------------------------------------------

    def config_documents(self, name: str) -> list[Document] | None:
        """``config.<name>`` as a mongos reads it: ``shards``, ``databases`` and ``collections``
        (None for any other collection)."""
        if name == "shards":
            # ``host`` in the ``<replica set>/<host:port>,...`` form a client can connect to directly.
            return [
                {
                    "_id": shard.set_name,
                    "host": f"{shard.set_name}/{shard.address}",
                    "state": 1,
                    "topologyTime": self._added,
                }
                for shard in self.shards
            ]
        if name == "databases":
            return [
                {"_id": db, "primary": shard.set_name, "version": {"timestamp": self._added, "lastMod": 1}}
                for db, shard in sorted(self._primaries.items())
            ]
        if name == "collections":
            return [
                {
                    "_id": f"{db}.{coll}",
                    "lastmodEpoch": sharded.epoch,
                    "timestamp": self._added,
                    "key": dict(sharded.key),
                    "unique": False,
                    "noBalance": False,
                }
                for (db, coll), sharded in sorted(self._sharded.items())
            ]
        return None


__all__ = [
    "HASHED_ID",
    "REPLICA_SET_NAME",
    "Placement",
    "Process",
    "Role",
    "hash_share",
    "refuse_local_through_mongos",
    "shard_name",
]
