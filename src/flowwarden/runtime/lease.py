"""Single-leader leases: one active instance per stream, through documents in ``_fw_locks``.

A lease document is ``{_id: <stream>, owner, epoch, expiresAt, acquiredAt}``. Acquiring a free or
expired lease increments ``epoch``; renewing keeps it. The epoch goes with every checkpoint write
of the holder, so an instance that lost its lease is fenced by the checkpoint store even if it has
not noticed yet.

The holder also fences itself: it treats the lease as lost once ``ttl`` has passed since its last
successful renewal, whether or not the server can be reached. Renewals run every third of the TTL,
so a healthy holder never gets close to that deadline, and a partitioned one stops before a standby
can acquire (a standby only acquires after ``expiresAt``, which is at least ``ttl`` after the last
renewal). Expiry times are written with this host's UTC clock: instances' clocks must agree to
well within the TTL (NTP does this).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pymongo.errors import DuplicateKeyError

LOCKS_COLLECTION = "_fw_locks"


@dataclass(frozen=True)
class Lease:
    stream: str
    owner: str
    epoch: int


class LeaseManager:
    """Acquires, renews and releases the lease of one stream for one instance."""

    def __init__(self, collection: Any, stream: str, owner: str, ttl_seconds: float) -> None:
        self._coll = collection
        self.stream = stream
        self.owner = owner
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
        """Take the lease if nobody holds it or the holder's lease expired; None if another holds it."""
        now = datetime.now(timezone.utc)
        started = time.monotonic()
        try:
            doc = await self._coll.find_one_and_update(
                {
                    "_id": self.stream,
                    "$or": [{"expiresAt": {"$lt": now}}, {"owner": None}, {"owner": self.owner}],
                },
                {
                    "$set": {
                        "owner": self.owner,
                        "expiresAt": now + timedelta(seconds=self.ttl),
                        "acquiredAt": now,
                    },
                    "$inc": {"epoch": 1},
                },
                upsert=True,
                return_document=True,
            )
        except DuplicateKeyError:
            # The document exists and its live lease belongs to another instance.
            return None
        if doc is None:
            return None
        self.lease = Lease(self.stream, self.owner, int(doc["epoch"]))
        self._valid_until = started + self.ttl
        return self.lease

    async def renew(self) -> bool:
        """Extend the held lease; False (and the lease dropped) when it is no longer ours."""
        if self.lease is None:
            return False
        now = datetime.now(timezone.utc)
        started = time.monotonic()
        result = await self._coll.update_one(
            {"_id": self.stream, "owner": self.owner, "epoch": self.lease.epoch},
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
            {"_id": self.stream, "owner": self.owner, "epoch": lease.epoch},
            {"$set": {"owner": None, "expiresAt": datetime.fromtimestamp(0, timezone.utc)}},
        )
