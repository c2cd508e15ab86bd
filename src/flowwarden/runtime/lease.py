"""Single-leader leases: one active instance per stream, through documents in ``_fw_locks``.

A lease document is ``{_id: <stream>, owner, ownerToken, epoch, expiresAt, acquiredAt}``: ``owner``
is the holder's configured instance id, for people to read; ``ownerToken`` names the holder itself,
one connector object (:func:`instance_token`), so that two processes given the same instance id are
still two holders. A live lease is taken only by the token that holds it (a stream of the holder
that re-opens), never by another connector, whatever its instance id; anyone takes a free or
expired one. Acquiring increments ``epoch``; renewing keeps it. The epoch goes with every
checkpoint write of the holder, so an instance that lost its lease is fenced by the checkpoint
store even if it has not noticed yet.

The holder also fences itself: it treats the lease as lost once ``ttl`` has passed since its last
successful renewal, whether or not the server can be reached. Renewals run every third of the TTL,
so a healthy holder never gets close to that deadline, and a partitioned one stops before a standby
can acquire (a standby only acquires after ``expiresAt``, which is at least ``ttl`` after the last
renewal). Expiry times are written with this host's UTC clock: instances' clocks must agree to
well within the TTL (NTP does this).

A stream without a lease announces itself instead: :class:`Presence` keeps a document
``{_id: "<stream>#<token>", stream, kind: "presence", owner, ownerToken, expiresAt}`` in the same
collection while it runs (renewed every third of the TTL, deleted at a graceful stop, expired after
a crash), so that whoever would move the stream's checkpoint by hand can tell it is running.

A connector running the buckets of a partitioned ``single_leader`` stream is a member of that
stream's fleet (:mod:`flowwarden.runtime.fleet`): :class:`Membership` keeps a document
``{_id: "<stream>#member#<token>", stream, kind: "member", partitions, owner, ownerToken,
expiresAt}`` in the same collection, renewed every third of the TTL, deleted when it leaves and
expired after a crash. Membership only says who takes which bucket's lease; the leases alone
decide who runs a bucket, and their epochs fence it as above.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pymongo.errors import DuplicateKeyError

LOCKS_COLLECTION = "_fw_locks"


def instance_token() -> str:
    """A new token naming one connector: ``host:pid:random``, unique even among connectors that
    share a host, a process and an instance id; the host and pid tell an operator where it runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Lease:
    stream: str
    owner: str
    token: str
    epoch: int


@dataclass(frozen=True)
class Holder:
    """Who the lease document names, as read: the holder's instance id and its token."""

    owner: str | None
    token: str | None


class LeaseManager:
    """Acquires, renews and releases the lease of one stream for one connector.

    ``owner`` is the connector's instance id, ``token`` its :func:`instance_token`: only the token
    decides whose lease it is.
    """

    def __init__(self, collection: Any, stream: str, owner: str, token: str, ttl_seconds: float) -> None:
        self._coll = collection
        self.stream = stream
        self.owner = owner
        self.token = token
        self.ttl = ttl_seconds
        self.lease: Lease | None = None
        self._valid_until = 0.0  # monotonic deadline of the held lease

    @property
    def renew_interval(self) -> float:
        return self.ttl / 3

    def held(self) -> bool:
        """True while a lease is held and its TTL since the last renewal has not run out."""
        return self.lease is not None and time.monotonic() < self._valid_until

    async def try_acquire(self) -> Lease | None:
        """Take the lease if nobody holds it, its holder's lease expired, or this connector holds
        it already; None if another connector holds it (:meth:`holder` says which)."""
        now = datetime.now(timezone.utc)
        started = time.monotonic()
        try:
            doc = await self._coll.find_one_and_update(
                {
                    "_id": self.stream,
                    # The token, not the instance id: another process configured with the same
                    # id must wait for expiry like any other, or both would lead by turns.
                    "$or": [{"expiresAt": {"$lt": now}}, {"owner": None}, {"ownerToken": self.token}],
                },
                {
                    "$set": {
                        "owner": self.owner,
                        "ownerToken": self.token,
                        "expiresAt": now + timedelta(seconds=self.ttl),
                        "acquiredAt": now,
                    },
                    "$inc": {"epoch": 1},
                },
                upsert=True,
                return_document=True,
            )
        except DuplicateKeyError:
            # The document exists and its live lease belongs to another connector.
            return None
        if doc is None:
            return None
        self.lease = Lease(self.stream, self.owner, self.token, int(doc["epoch"]))
        self._valid_until = started + self.ttl
        return self.lease

    async def renew(self) -> bool:
        """Extend the held lease; False (and the lease dropped) when it is no longer ours."""
        if self.lease is None:
            return False
        now = datetime.now(timezone.utc)
        started = time.monotonic()
        result = await self._coll.update_one(
            {"_id": self.stream, "ownerToken": self.token, "epoch": self.lease.epoch},
            {"$set": {"expiresAt": now + timedelta(seconds=self.ttl)}},
        )
        if result.matched_count != 1:
            self.lease = None
            return False
        self._valid_until = started + self.ttl
        return True

    async def release(self) -> None:
        """Give the lease up at once so a standby takes over without waiting for expiry."""
        if self.lease is None:
            return
        lease, self.lease = self.lease, None
        await self._coll.update_one(
            {"_id": self.stream, "ownerToken": self.token, "epoch": lease.epoch},
            {
                "$set": {
                    "owner": None,
                    "ownerToken": None,
                    "expiresAt": datetime.fromtimestamp(0, timezone.utc),
                }
            },
        )

    async def holder(self) -> Holder | None:
        """Who the lease document names now (None without one); the holder's lease may have
        expired meanwhile."""
        doc = await self._coll.find_one({"_id": self.stream})
        if doc is None:
            return None
        owner, token = doc.get("owner"), doc.get("ownerToken")
        return Holder(None if owner is None else str(owner), None if token is None else str(token))


class Presence:
    """That one connector runs one stream without a lease, for as long as it does."""

    def __init__(self, collection: Any, stream: str, owner: str, token: str, ttl_seconds: float) -> None:
        self._coll = collection
        self.stream = stream
        self.ttl = ttl_seconds
        self._id = f"{stream}#{token}"
        self._fields = {"stream": stream, "kind": "presence", "owner": owner, "ownerToken": token}

        self._written = 0.0  # monotonic time of the last write, 0: none since the last withdrawal

    @property
    def renew_interval(self) -> float:
        return self.ttl / 3

    async def announce(self) -> None:
        """Write (or renew) the document, valid for ``ttl`` seconds from now; a stream re-opening
        within a renew interval of the last write writes nothing (each write is an oplog entry)."""
        started = time.monotonic()
        if self._written and started - self._written < self.renew_interval:
            return
        expires = datetime.now(timezone.utc) + timedelta(seconds=self.ttl)
        await self._coll.update_one(
            {"_id": self._id}, {"$set": {**self._fields, "expiresAt": expires}}, upsert=True
        )
        self._written = started

    async def withdraw(self) -> None:
        self._written = 0.0
        await self._coll.delete_one({"_id": self._id})


class Membership:
    """That one connector runs the buckets of one partitioned single_leader stream, for as long as
    it does: the record the stream's other members count to find their share."""

    def __init__(
        self, collection: Any, stream: str, partitions: int, owner: str, token: str, ttl_seconds: float
    ) -> None:
        self._coll = collection
        self.stream = stream
        self.ttl = ttl_seconds
        self._id = f"{stream}#member#{token}"
        self._fields = {
            "stream": stream,
            "kind": "member",
            "partitions": partitions,
            "owner": owner,
            "ownerToken": token,
        }

    @property
    def renew_interval(self) -> float:
        return self.ttl / 3

    async def announce(self) -> None:
        """Write (or renew) the record, valid for ``ttl`` seconds from now; forget the records of
        members whose own expired more than a TTL ago (crashed processes)."""
        now = datetime.now(timezone.utc)
        await self._coll.update_one(
            {"_id": self._id},
            {"$set": {**self._fields, "expiresAt": now + timedelta(seconds=self.ttl)}},
            upsert=True,
        )
        await self._coll.delete_many(
            {"stream": self.stream, "kind": "member", "expiresAt": {"$lt": now - timedelta(seconds=self.ttl)}}
        )

    async def withdraw(self) -> None:
        await self._coll.delete_one({"_id": self._id})


def member_filter(stream: str, partitions: int, now: datetime) -> dict[str, Any]:
    """The live member records of ``stream`` run with ``partitions`` buckets at ``now``."""
    return {"stream": stream, "kind": "member", "partitions": partitions, "expiresAt": {"$gt": now}}


def running_filter(stream: str, now: datetime) -> dict[str, Any]:
    """The ``_fw_locks`` documents that say ``stream`` runs somewhere at ``now``: its held lease,
    or a live presence."""
    return {
        "$or": [{"_id": stream, "ownerToken": {"$ne": None}}, {"stream": stream, "kind": "presence"}],
        "expiresAt": {"$gt": now},
    }
