"""Who may run a stream: the single-leader lease, or a watch for a second writer without one.

With ``deployment="single_leader"`` a stream runs only while this connector holds its lease
(:class:`~flowwarden.runtime.lease.LeaseManager`): :meth:`Ownership.acquire` stands by until it
does, saying who holds it, :meth:`Ownership.keep` renews it and says when it is lost, and every
checkpoint write carries the lease's epoch so a former leader is fenced. Without a lease, nothing
stops two connectors from running one stream; :meth:`Ownership.keep` then watches the checkpoint
and warns, naming both, when another one writes it.

A bucket of a partitioned ``single_leader`` stream also asks its fleet
(:mod:`flowwarden.runtime.fleet`): it tries to take its lease only while the fleet gives the bucket
to this connector, and :meth:`Ownership.keep` says when the fleet gives it to another member, so
that the stream hands it over (stops reading, finishes, saves, then releases the lease).

A connector is told apart from others by its instance token, never by its instance id alone:
two processes configured with the same instance id are two connectors, for the lease and for the
watch alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pymongo.errors import PyMongoError

from flowwarden.checkpoints import CheckpointCommitter
from flowwarden.checkpoints.store import AwaitableStore
from flowwarden.config import Deployment
from flowwarden.config.spec import StreamSpec
from flowwarden.runtime.context import stream_logger
from flowwarden.runtime.fleet import Fleet
from flowwarden.runtime.lease import Holder, LeaseManager, Presence


class Ownership:
    """One stream's lease (or, without one, its watch for a second writer)."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        locks_collection: Any,
        store: AwaitableStore,
        instance_id: str,
        instance_token: str,
        stopping: asyncio.Event,
        fleet: Fleet | None = None,
    ) -> None:
        self.name = spec.name
        self._store = store
        self._instance_id = instance_id
        self._instance_token = instance_token
        self.log = stream_logger(__name__, spec.name)
        self._stopping = stopping
        self._save_interval = spec.checkpoint.save_interval_seconds
        self.lease = (
            LeaseManager(
                locks_collection, spec.name, instance_id, instance_token, spec.stream.lease_ttl_seconds
            )
            if spec.stream.deployment == Deployment.SINGLE_LEADER
            else None
        )
        # Without a lease, a connector records that it runs the stream where `flowwarden checkpoints`
        # looks before moving a checkpoint by hand: only with a store in MongoDB (the command moves
        # those only; a connector whose checkpoints live elsewhere writes nothing into MongoDB).
        self._presence = (
            Presence(locks_collection, spec.name, instance_id, instance_token, spec.stream.lease_ttl_seconds)
            if self.lease is None and store.in_mongodb
            else None
        )
        self.fleet = fleet if self.lease is not None else None
        """The fleet this stream is a bucket of (partitioned, single_leader), or None."""
        self.lost = False
        """The lease was held and is not any more: the stream must stop reading."""
        self.handing_over = False
        """The fleet gives the held bucket to another member: the stream stops reading, saves, and
        :meth:`hand_over` releases the lease."""
        self.given_to: str | None = None
        """The member the bucket is handed over to, while :attr:`handing_over`."""
        self._holder: Holder | None = None  # who held the lease when last read (non-fleet streams)
        self._warned: set[tuple[str, str | None]] = set()

    @property
    def epoch(self) -> int | None:
        """The held lease's epoch, which checkpoint writes carry; None without a lease."""
        held = self.lease.lease if self.lease is not None else None
        return held.epoch if held is not None else None

    @property
    def leaving(self) -> bool:
        """The stream must not read on: its lease is lost, or it hands its bucket over."""
        return self.lost or self.handing_over

    def holder(self) -> Holder | None:
        """Who holds the lease, as last known: this connector while it holds it; else as last read
        (by the fleet, for a bucket of one). None without a lease, or while nobody holds it."""
        if self.lease is None:
            return None
        if self.lease.lease is not None and not self.lost:
            return Holder(self._instance_id, self._instance_token)
        holder = self.fleet.holder(self.name) if self.fleet is not None else self._holder
        if holder is not None and holder.token == self._instance_token:
            return None  # read while this connector held it, since released
        return holder

    def fenced(self) -> bool:
        """A checkpoint write was fenced: with a lease, it is lost (True); without, the error
        is the stream's to report (False)."""
        if self.lease is None:
            return False
        self.lease.lease = None
        return True

    async def acquire(self, standing_by: Callable[[str | None, str | None], None]) -> bool:
        """Stand by until this connector holds the lease (at once without one); False if stopped
        meanwhile. ``standing_by(error, reason)`` hears each round spent waiting: the error the
        round met, if any, and why the stream waits (who holds the lease)."""
        lease = self.lease
        if lease is None:
            await self._announce()
            return True
        if self.fleet is not None:
            return await self._acquire_in_fleet(lease, self.fleet, standing_by)
        reason: str | None = None
        told: tuple[str | None, str | None] | None = None  # the holder the log last named
        while not self._stopping.is_set():
            error = None
            try:
                if await self._try_acquire(lease):
                    return True
                holder = self._holder = await lease.holder()
                reason = self._standing_by_reason(holder)
                if holder is not None and holder.owner is not None and (holder.owner, holder.token) != told:
                    told = (holder.owner, holder.token)
                    self._tell_holder(holder)
            except PyMongoError as failure:
                error = f"lease: {type(failure).__name__}: {failure}"
            standing_by(error, reason)
            try:
                await asyncio.wait_for(self._stopping.wait(), lease.renew_interval)
            except asyncio.TimeoutError:
                pass
        return False

    async def _try_acquire(self, lease: LeaseManager) -> bool:
        if await lease.try_acquire() is None:
            return False
        self.lost = False
        self.handing_over = False
        self.given_to = None
        self.log.info("stream %s: lease acquired (epoch %s)", self.name, self.epoch)
        return True

    async def _acquire_in_fleet(
        self, lease: LeaseManager, fleet: Fleet, standing_by: Callable[[str | None, str | None], None]
    ) -> bool:
        """:meth:`acquire` for a bucket of a fleet: try the lease only while the fleet gives the
        bucket to this connector and, as last read, nobody else holds it; look again at each read
        of the fleet (about once a second), so a bucket handed over is taken about then."""
        while not self._stopping.is_set():
            error = None
            held = fleet.holder(self.name)
            try:
                if fleet.mine(self.name) and (held is None or held.token == self._instance_token):
                    if await self._try_acquire(lease):
                        return True
            except PyMongoError as failure:
                error = f"lease: {type(failure).__name__}: {failure}"
            if fleet.view is not None:
                # Until the first read of the fleet the stream is still STARTING: a connector alone
                # takes every bucket then, and opens them before Connector.start() returns.
                standing_by(error, fleet.standing_by_reason(self.name))
            waits = {
                asyncio.ensure_future(self._stopping.wait()),
                asyncio.ensure_future(fleet.next_view(lease.renew_interval)),
            }
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        return False

    def _standing_by_reason(self, holder: Holder | None) -> str:
        if holder is None or holder.owner is None:
            return "standing by for the lease"
        token = holder.token or "no instance token"
        if holder.owner == self._instance_id:
            return (
                f"standing by: another process with the same instance id {holder.owner!r} holds the "
                f"lease ({token})"
            )
        return f"standing by: instance {holder.owner!r} holds the lease ({token})"

    def _tell_holder(self, holder: Holder) -> None:
        """Log who holds the lease, once per holder: a WARNING when it has this connector's
        instance id, which then no longer tells the two processes apart."""
        if holder.owner != self._instance_id:
            self.log.info(
                "stream %s: instance %r (%s) holds the lease; standing by until it stops or its lease "
                "expires",
                self.name,
                holder.owner,
                holder.token or "no instance token",
            )
            return
        self.log.warning(
            "stream %s: another process with the same instance id %r holds the lease (%s; this "
            "process is %s); standing by until it stops or its lease expires. Give each process its "
            "own instance_id so that checkpoints, logs and `flowwarden status` tell them apart",
            self.name,
            holder.owner,
            holder.token or "no instance token",
            self._instance_token,
        )

    async def keep(
        self, committer: Callable[[], CheckpointCommitter | None], on_lost: Callable[[], None]
    ) -> None:
        """While the stream runs: renew the lease, and call ``on_lost`` once it cannot be kept or
        (:attr:`handing_over`) the fleet gives the bucket to another member; without a lease,
        watch for a second writer of the checkpoint."""
        if self.lease is None:
            await asyncio.gather(self._watch_for_other_writers(committer), self._keep_announcing())
            return
        if self.fleet is None:
            await self._renew(on_lost)
            return
        handing = asyncio.ensure_future(self._until_given_away(self.fleet, on_lost))
        try:
            await self._renew(on_lost)
        finally:
            handing.cancel()
            await asyncio.gather(handing, return_exceptions=True)

    async def _until_given_away(self, fleet: Fleet, on_lost: Callable[[], None]) -> None:
        """Call ``on_lost`` once a read of the fleet gives the held bucket to another member; the
        lease is still renewed meanwhile, until :meth:`hand_over` releases it."""
        assert self.lease is not None
        while fleet.mine(self.name) or fleet.view is None:
            await fleet.next_view(self.lease.renew_interval)
        view = fleet.view
        assert view is not None
        self.log.info(
            "stream %s: the fleet of %d member(s) gives this bucket to %s; handing it over (handlers in "
            "flight finish, the checkpoint is saved, then the lease is released)",
            self.name,
            len(view.members),
            view.describe(view.assignment.get(self.name)),
        )
        self.handing_over = True
        self.given_to = view.describe(view.assignment.get(self.name))
        on_lost()

    async def _renew(self, on_lost: Callable[[], None]) -> None:
        assert self.lease is not None
        while True:
            await asyncio.sleep(self.lease.renew_interval)
            try:
                renewed = await self.lease.renew()
            except PyMongoError as error:
                self.log.warning("stream %s: lease renewal failed: %s", self.name, error)
                renewed = self.lease.held()
            if not renewed or not self.lease.held():
                self.lost = True
                on_lost()
                return

    async def _announce(self) -> None:
        """Say that this connector runs the stream; a failure only means a hand-made checkpoint
        change is not refused while it runs, so it is logged, not raised."""
        if self._presence is None:
            return
        try:
            await self._presence.announce()
        except PyMongoError as error:
            self.log.warning("stream %s: could not record that it runs (%s)", self.name, error)

    async def _keep_announcing(self) -> None:
        assert self._presence is not None
        while True:
            await asyncio.sleep(self._presence.renew_interval)
            await self._announce()

    async def hand_over(self, timeout: float) -> None:
        """Release the lease of a bucket handed over (its checkpoint saved): the member it is given
        to takes it at its next read of the fleet."""
        self.handing_over = False
        self.given_to = None
        await self.release(timeout)

    async def release(self, timeout: float) -> None:
        """Give the lease back, or withdraw the presence, at once (a graceful stop), waiting at
        most ``timeout`` seconds."""
        if self._presence is not None:
            try:
                await asyncio.wait_for(self._presence.withdraw(), timeout)
            except (PyMongoError, asyncio.TimeoutError):
                pass  # it expires after lease_ttl_seconds
            return
        if self.lease is None or self.lease.lease is None:
            return
        try:
            await asyncio.wait_for(self.lease.release(), timeout)
        except (PyMongoError, asyncio.TimeoutError) as error:
            self.log.warning(
                "stream %s: could not release its lease (%s); it expires after lease_ttl_seconds",
                self.name,
                error or "timed out",
            )

    async def _watch_for_other_writers(self, committer: Callable[[], CheckpointCommitter | None]) -> None:
        """Every processed save writes this connector's instance id and token into the record;
        once this run has saved, any other id or token found there was written since by someone
        else, who handles the same events and overwrites this connector's positions. A record
        without a token (a store that does not keep it, FlowWarden for Java) is judged by its id."""
        interval = max(self._save_interval or 5.0, 1.0)
        while True:
            await asyncio.sleep(interval)
            current = committer()
            if current is None or current.saved_sequence == 0:
                continue
            try:
                stored = await self._store.load(self.name)
            except Exception:  # the committer reports a store in trouble
                continue
            if stored is None or stored.instance_id is None:
                continue
            other, token = stored.instance_id, stored.instance_token
            self.log.debug(
                "stream %s: checked for other writers; last saved by %r (%s)",
                self.name,
                other,
                token or "no instance token",
            )
            ours = other == self._instance_id and token in (None, self._instance_token)
            if ours or (other, token) in self._warned:
                continue
            self._warned.add((other, token))
            advice = (
                "Run one instance per stream, or set @change_stream(deployment='single_leader') so that "
                "one instance at a time holds it"
            )
            if other != self._instance_id:
                self.log.warning(
                    "stream %s: instance %r also writes this stream's checkpoint (this instance is %r): "
                    "both handle every event and overwrite each other's positions. %s",
                    self.name,
                    other,
                    self._instance_id,
                    advice,
                )
                continue
            self.log.warning(
                "stream %s: another process with the same instance id %r (%s; this process is %s) also "
                "writes this stream's checkpoint: both handle every event and overwrite each other's "
                "positions. %s, and give each process its own instance_id",
                self.name,
                other,
                token,
                self._instance_token,
                advice,
            )


__all__ = ["Ownership"]
