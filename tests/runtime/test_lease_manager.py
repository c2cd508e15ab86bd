"""LeaseManager on its own against a server: who may take a lease, what its document says, how the
epoch moves, and when the holder stops trusting it (its own clock, not the server's)."""

from __future__ import annotations

import os
import socket
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pymongo
import pytest
from bson.codec_options import CodecOptions

from flowwarden.runtime import lease as lease_module
from flowwarden.runtime.lease import Holder, Lease, LeaseManager, instance_token

TTL = 30.0
EPOCH_START = datetime.fromtimestamp(0, timezone.utc)


class Clock:
    """time.monotonic() for the lease module alone, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(lease_module, "time", fake)
    return fake


@pytest.fixture
def locks(async_client: pymongo.AsyncMongoClient[Any], db_name: str) -> Any:
    return async_client.get_database(db_name, codec_options=CodecOptions(tz_aware=True))["_fw_locks"]


def manager(locks: Any, token: str, owner: str = "orders-1") -> LeaseManager:
    return LeaseManager(locks, "orders", owner, token, TTL)


def test_an_instance_token_names_the_host_the_process_and_one_connector() -> None:
    host, pid, nonce = instance_token().rsplit(":", 2)
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert len(nonce) == 8 and int(nonce, 16) >= 0
    assert instance_token() != instance_token()


def test_renewals_run_every_third_of_the_ttl(locks: Any) -> None:
    assert manager(locks, "a").renew_interval == TTL / 3


async def test_a_free_lease_is_taken_with_epoch_1_and_a_document_that_says_whose_it_is(
    locks: Any, clock: Clock
) -> None:
    a = manager(locks, "token-a")
    assert not a.held()
    before = datetime.now(timezone.utc)
    assert await a.try_acquire() == Lease("orders", "orders-1", "token-a", 1)
    after = datetime.now(timezone.utc)
    assert a.lease == Lease("orders", "orders-1", "token-a", 1) and a.held()
    document = await locks.find_one({"_id": "orders"})
    assert (document["owner"], document["ownerToken"], document["epoch"]) == ("orders-1", "token-a", 1)
    slack = timedelta(milliseconds=1)  # BSON keeps milliseconds
    assert before - slack <= document["acquiredAt"] <= after
    assert before + timedelta(seconds=TTL) - slack <= document["expiresAt"] <= after + timedelta(seconds=TTL)


async def test_a_live_lease_of_another_connector_is_not_taken_even_with_the_same_instance_id(
    locks: Any, clock: Clock
) -> None:
    a, b = manager(locks, "token-a"), manager(locks, "token-b")
    await a.try_acquire()
    assert await b.try_acquire() is None
    assert b.lease is None and not b.held()
    assert await b.holder() == Holder("orders-1", "token-a")
    assert (await locks.find_one({"_id": "orders"}))["epoch"] == 1


async def test_the_holder_takes_its_own_lease_again_with_the_next_epoch(locks: Any, clock: Clock) -> None:
    a = manager(locks, "token-a")
    await a.try_acquire()
    lease = await a.try_acquire()
    assert lease is not None and lease.epoch == 2


async def test_an_expired_lease_is_taken_by_another_connector_with_the_next_epoch(
    locks: Any, clock: Clock
) -> None:
    a, b = manager(locks, "token-a"), manager(locks, "token-b", owner="orders-2")
    await a.try_acquire()
    await locks.update_one(
        {"_id": "orders"}, {"$set": {"expiresAt": datetime.now(timezone.utc) - timedelta(seconds=1)}}
    )
    assert await b.try_acquire() == Lease("orders", "orders-2", "token-b", 2)
    assert await a.holder() == Holder("orders-2", "token-b")


async def test_a_released_lease_is_free_at_once(locks: Any, clock: Clock) -> None:
    a, b = manager(locks, "token-a"), manager(locks, "token-b")
    await a.try_acquire()
    await a.release()
    assert a.lease is None and not a.held()
    document = await locks.find_one({"_id": "orders"})
    assert (document["owner"], document["ownerToken"], document["expiresAt"]) == (None, None, EPOCH_START)
    assert await a.holder() == Holder(None, None)
    assert await b.try_acquire() == Lease("orders", "orders-1", "token-b", 2)
    await a.release()  # holds nothing: writes nothing
    assert await b.holder() == Holder("orders-1", "token-b")


async def test_releasing_a_lease_that_was_taken_over_leaves_the_new_holders_document(
    locks: Any, clock: Clock
) -> None:
    a, b = manager(locks, "token-a"), manager(locks, "token-b")
    await a.try_acquire()
    await locks.update_one({"_id": "orders"}, {"$set": {"expiresAt": EPOCH_START}})
    await b.try_acquire()
    await a.release()
    assert await a.holder() == Holder("orders-1", "token-b")


async def test_renewing_extends_the_expiry_and_keeps_the_epoch(locks: Any, clock: Clock) -> None:
    a = manager(locks, "token-a")
    await a.try_acquire()
    first = (await locks.find_one({"_id": "orders"}))["expiresAt"]
    await locks.update_one({"_id": "orders"}, {"$set": {"expiresAt": first - timedelta(seconds=20)}})
    before = datetime.now(timezone.utc)
    assert await a.renew() is True
    document = await locks.find_one({"_id": "orders"})
    assert document["expiresAt"] >= before + timedelta(seconds=TTL) - timedelta(milliseconds=1)
    assert document["epoch"] == 1 and a.lease is not None and a.lease.epoch == 1


async def test_a_renewal_after_a_takeover_fails_and_drops_the_lease(locks: Any, clock: Clock) -> None:
    a, b = manager(locks, "token-a"), manager(locks, "token-b")
    await a.try_acquire()
    await locks.update_one({"_id": "orders"}, {"$set": {"expiresAt": EPOCH_START}})
    await b.try_acquire()
    assert await a.renew() is False
    assert a.lease is None and not a.held()
    assert await a.renew() is False  # nothing held: nothing tried


async def test_a_renewal_with_a_stale_epoch_fails(locks: Any, clock: Clock) -> None:
    a = manager(locks, "token-a")
    await a.try_acquire()
    await locks.update_one({"_id": "orders"}, {"$inc": {"epoch": 1}})
    assert await a.renew() is False


async def test_the_holder_trusts_its_lease_for_the_ttl_after_the_last_renewal_only(
    locks: Any, clock: Clock
) -> None:
    a = manager(locks, "token-a")
    await a.try_acquire()
    clock.now += TTL - 0.001
    assert a.held()
    clock.now += 0.001
    assert not a.held(), "the TTL ran out: a standby may hold it by now"
    assert await a.renew() is True
    assert a.held()
    clock.now += TTL - 0.001
    assert a.held()
    clock.now += 0.001
    assert not a.held()


async def test_no_lease_document_means_no_holder(locks: Any) -> None:
    assert await manager(locks, "token-a").holder() is None


async def test_a_manager_that_never_held_the_lease_renews_and_releases_nothing(locks: Any) -> None:
    a, b = manager(locks, "token-a"), manager(locks, "token-b")
    await b.try_acquire()
    assert await a.renew() is False
    await a.release()
    assert await b.holder() == Holder("orders-1", "token-b")


async def test_lease_times_are_written_in_utc_whatever_the_local_zone(
    locks: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        a = manager(locks, "token-a")
        before = datetime.now(timezone.utc)
        await a.try_acquire()
        acquired = await locks.find_one({"_id": "orders"})
        await a.renew()
        renewed = await locks.find_one({"_id": "orders"})
        after = datetime.now(timezone.utc)
        await a.release()
        released = await locks.find_one({"_id": "orders"})
    finally:
        monkeypatch.undo()
        time.tzset()
    slack = timedelta(milliseconds=1)
    assert before - slack <= acquired["acquiredAt"] <= after
    for document in (acquired, renewed):
        expires = document["expiresAt"] - timedelta(seconds=TTL)
        assert before - slack <= expires <= after
    assert released["expiresAt"] == EPOCH_START


async def test_each_stream_has_a_lease_of_its_own(locks: Any, clock: Clock) -> None:
    payments = LeaseManager(locks, "payments", "payments-1", "token-p", TTL)
    await payments.try_acquire()
    orders = manager(locks, "token-a")
    assert await orders.holder() is None
    assert await orders.try_acquire() == Lease("orders", "orders-1", "token-a", 1)
    assert await payments.holder() == Holder("payments-1", "token-p")
