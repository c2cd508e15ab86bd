"""A fleet: the connectors running one partitioned ``single_leader`` stream share its buckets.

Every connector running such a stream is a member: it keeps a record in ``_fw_locks``
(:class:`~flowwarden.runtime.lease.Membership`, renewed every third of ``lease_ttl_seconds``) and
reads, once a second, the live member records and the buckets' leases. From the members alone,
each one computes the same assignment (:func:`assign`): every member gets the floor or the ceiling
of buckets / members, the buckets chosen by rendezvous hashing of bucket and member token, so the
members agree without talking to each other. A bucket's stream takes its lease only while the
assignment gives the bucket to this member; a member holding a bucket the assignment gives to
another one hands it over: that stream stops reading, its handlers in flight finish, its checkpoint
is saved, then its lease is released, and the other member takes it.

The hard rule: the assignment only decides who *tries* to take a lease. Members' views may disagree
for a moment (one that joined is seen by the others at their next read), but the lease still lets
one connector at a time run a bucket, and its epoch fences a former holder: a disagreement costs a
handover, never a second reader.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pymongo.errors import PyMongoError

from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.lease import Holder, Membership, member_filter

REFRESH_SECONDS = 1.0
"""How often a member reads the fleet (at most; a third of the lease TTL when that is shorter): a
member that joins gets its buckets about this long after the others hand them over."""


def _score(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest(), "big")


def assign(stream: str, buckets: Sequence[str], members: Sequence[str]) -> dict[str, str]:
    """Which member (by token) runs each bucket: every member gets ``len(buckets) // len(members)``
    buckets, and the first ``len(buckets) % len(members)`` members by rank one more.

    Deterministic in its arguments (the members' order does not matter), so every member computes
    the same answer from the same records. Buckets go by rendezvous hashing: the (bucket, member)
    pairs are taken in order of a hash of both, each bucket by the first member with room left, so
    a member that joins or leaves moves few buckets besides its own."""
    tokens = sorted(set(members))
    if not tokens:
        return {}
    share, extra = divmod(len(buckets), len(tokens))
    ranked = sorted(tokens, key=lambda token: (_score(stream, token), token))
    room = {token: share + (1 if rank < extra else 0) for rank, token in enumerate(ranked)}
    pairs = sorted(
        ((_score(stream, bucket, token), bucket, token) for bucket in buckets for token in tokens),
        reverse=True,
    )
    assignment: dict[str, str] = {}
    for _, bucket, token in pairs:
        if bucket not in assignment and room[token] > 0:
            assignment[bucket] = token
            room[token] -= 1
    return assignment


@dataclass(frozen=True)
class FleetView:
    """The fleet as one read found it."""

    members: Mapping[str, str]
    """Each live member's instance id, by its token."""
    assignment: Mapping[str, str]
    """Which member (token) runs each bucket."""
    holders: Mapping[str, Holder]
    """Who holds each bucket's lease, for the buckets whose lease is live."""

    def describe(self, token: str | None) -> str:
        """A member for a log line or a reason: ``'orders-1' (host:pid:random)``."""
        if token is None:
            return "nobody"
        return f"instance {self.members.get(token, '?')!r} ({token})"


class Fleet:
    """This connector's membership in one partitioned stream's fleet, and its latest view of it."""

    def __init__(
        self,
        collection: Any,
        stream: str,
        buckets: Sequence[str],
        *,
        owner: str,
        token: str,
        ttl_seconds: float,
    ) -> None:
        self.stream = stream
        self.buckets = tuple(buckets)
        self.owner = owner
        self.token = token
        self._coll = collection
        self._membership = Membership(collection, stream, len(self.buckets), owner, token, ttl_seconds)
        self.refresh_interval = min(REFRESH_SECONDS, self._membership.renew_interval)
        self.view: FleetView | None = None
        """The latest view; None until the first read succeeded."""
        self._refreshed = asyncio.Event()
        self._told: tuple[int, tuple[str, ...]] | None = None  # what the log last said
        self._failing = False
        self.log = stream_logger(__name__, stream)

    # -- what a bucket's stream asks -------------------------------------------------------------

    def mine(self, bucket: str) -> bool:
        """The latest view gives ``bucket`` to this member."""
        view = self.view
        return view is not None and view.assignment.get(bucket) == self.token

    def holder(self, bucket: str) -> Holder | None:
        """Who holds ``bucket``'s lease, as last read (None: nobody, or it expired)."""
        view = self.view
        return view.holders.get(bucket) if view is not None else None

    def elsewhere(self, bucket: str) -> bool:
        """Another member runs ``bucket`` (holds its lease) or is to run it, as last read."""
        view = self.view
        if view is None:
            return False
        held = view.holders.get(bucket)
        if held is not None and held.token != self.token:
            return True
        return view.assignment.get(bucket, self.token) != self.token

    def standing_by_reason(self, bucket: str) -> str:
        """Why ``bucket`` stands by here, for its status: whom the fleet gives it, who holds it."""
        view = self.view
        if view is None:
            return "standing by: reading the members of the stream's fleet"
        count = len(view.members)
        held = view.holders.get(bucket)
        if not self.mine(bucket):
            text = (
                f"standing by: the fleet of {count} member(s) gives this bucket to "
                f"{view.describe(view.assignment.get(bucket))}"
            )
        else:
            text = f"standing by: the fleet of {count} member(s) gives this bucket to this instance"
        if held is not None and held.token != self.token:
            text += f", and instance {held.owner!r} ({held.token}) holds its lease"
            if held.token not in view.members:
                text += " (not a member now: it hands over or its lease expires)"
        return text

    async def next_view(self, timeout: float) -> None:
        """Wait for the next read of the fleet, at most ``timeout`` seconds."""
        refreshed = self._refreshed
        try:
            await asyncio.wait_for(refreshed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # -- the member's own work -------------------------------------------------------------------

    async def run(self) -> None:
        """Renew this member's record and read the fleet, until cancelled (:meth:`leave` then
        withdraws the record)."""
        announced = -float("inf")
        while True:
            try:
                if time.monotonic() - announced >= self._membership.renew_interval:
                    await self._membership.announce()
                    announced = time.monotonic()
                await self.read()
                self._failing = False
            except PyMongoError as error:
                # The leases decide who runs what: until a read gets through, the last view stands
                # (a member out of reach loses its leases anyway, by their own TTL).
                if not self._failing:
                    self._failing = True
                    self.log.warning("stream %s: cannot read its fleet's members (%s)", self.stream, error)
            await asyncio.sleep(self.refresh_interval)

    async def read(self) -> FleetView:
        """Read the live members and the buckets' leases; the new view wakes whoever waits."""
        now = datetime.now(timezone.utc)
        members = member_filter(self.stream, len(self.buckets), now)
        cursor = self._coll.find({"$or": [members, {"_id": {"$in": list(self.buckets)}}]})
        documents: list[Any] = await cursor.to_list(None)
        found: dict[str, str] = {self.token: self.owner}  # this member runs, whatever its record says
        holders: dict[str, Holder] = {}
        for document in documents:
            if document.get("kind") == "member":
                found[str(document["ownerToken"])] = str(document.get("owner"))
                continue
            token, expires = document.get("ownerToken"), document.get("expiresAt")
            if token is None or not isinstance(expires, datetime):
                continue
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=timezone.utc)
            if expires > now:
                owner = document.get("owner")
                holders[str(document["_id"])] = Holder(None if owner is None else str(owner), str(token))
        view = FleetView(found, assign(self.stream, self.buckets, list(found)), holders)
        self.view = view
        self._tell(view)
        refreshed, self._refreshed = self._refreshed, asyncio.Event()
        refreshed.set()
        return view

    def _tell(self, view: FleetView) -> None:
        """One INFO line whenever the members or this member's buckets change."""
        ours = tuple(bucket for bucket in self.buckets if view.assignment.get(bucket) == self.token)
        told = (len(view.members), ours)
        if told == self._told:
            return
        self._told = told
        self.log.info(
            "stream %s: %d member(s) share its %d buckets; this instance (%s) runs %d: %s",
            self.stream,
            len(view.members),
            len(self.buckets),
            self.token,
            len(ours),
            ", ".join(ours) or "none",
        )

    async def leave(self, timeout: float) -> None:
        """Withdraw this member's record, waiting at most ``timeout`` seconds (it expires after
        ``lease_ttl_seconds`` otherwise)."""
        try:
            await asyncio.wait_for(self._membership.withdraw(), timeout)
        except (PyMongoError, asyncio.TimeoutError):
            pass


__all__ = ["REFRESH_SECONDS", "Fleet", "FleetView", "assign"]
