"""Connectors sharing a partitioned ``single_leader`` stream's buckets (a fleet): the assignment
every member computes alike, a handover that finishes and saves before it releases the lease, and
what status, ``/readyz`` and the metrics say about who runs which bucket.

The processes version (joins, a SIGKILL, every event checked) is test_fleet_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from flowwarden import (
    ChangeEvent,
    Connector,
    StreamContext,
    StreamState,
    change_stream,
    checkpoint,
    on_change,
)
from flowwarden.runtime.fleet import assign
from helpers import get, wait_until

from .test_partition_crashes import (
    bucket_names,
    buckets_of,
    read_events,
)

# -- the assignment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 6, 7, 16])
@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 9])
def test_every_member_gets_the_floor_or_the_ceiling_of_its_share(count: int, members: int) -> None:
    buckets = bucket_names(count)
    tokens = [f"host:{pid}:{random.Random(pid).getrandbits(32):08x}" for pid in range(members)]
    assignment = assign("orders", buckets, tokens)
    assert sorted(assignment) == sorted(buckets), "a bucket went to nobody"
    assert set(assignment.values()) <= set(tokens)
    held = Counter(assignment.values())
    floor, ceiling = divmod(count, members)
    expected = sorted([floor + 1] * ceiling + [floor] * (members - ceiling))
    assert sorted(held.get(token, 0) for token in tokens) == expected


def test_every_member_computes_the_same_assignment_from_the_same_members() -> None:
    buckets = bucket_names(16)
    tokens = [f"host:{pid}:abcd" for pid in range(5)]
    first = assign("orders", buckets, tokens)
    for seed in range(5):
        shuffled = tokens[:]
        random.Random(seed).shuffle(shuffled)
        assert assign("orders", buckets, shuffled) == first
    # Another stream spreads its buckets another way.
    assert assign("payments", buckets, tokens) != first


def test_a_member_that_joins_takes_its_share_and_few_others_move() -> None:
    buckets = bucket_names(64)
    tokens = [f"host:{pid}:abcd" for pid in range(4)]
    before = assign("orders", buckets, tokens)
    after = assign("orders", buckets, [*tokens, "host:99:abcd"])
    moved = [bucket for bucket in buckets if before[bucket] != after[bucket]]
    taken = [bucket for bucket in moved if after[bucket] == "host:99:abcd"]
    assert len(taken) in (12, 13)
    # Rendezvous hashing: most of what moves goes to the member that joined.
    assert len(moved) - len(taken) <= len(taken)


# -- connectors in this process -------------------------------------------------------------------


Handled = list[tuple[str, str, Any, str]]
"""What a test's classes handled: (tag, bucket, document key, token) per event."""


def fleet_class(db: str, tag: str, handled: Handled, hold: Hold | None = None) -> type:
    """A class running ``orders`` in 2 buckets under a 10-second lease, recording each event it
    handled in ``handled`` under ``tag``; the events of ``hold``'s keys wait in its handler until
    ``hold`` lets go."""

    @change_stream(
        "orders",
        db,
        name="orders",
        partitions=2,
        deployment="single_leader",
        lease_ttl_seconds=10,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1)
    class Orders:
        @on_change
        async def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            assert event.document_key is not None
            key = event.document_key["_id"]
            if hold is not None and key in hold.keys and not hold.released.is_set():
                hold.entered.append(ctx.stream)
                await asyncio.to_thread(hold.released.wait, 30)
            handled.append((tag, ctx.stream, key, event.token["_data"]))

    return Orders


class Hold:
    """Events of ``keys`` wait in their handler until :attr:`released` is set."""

    def __init__(self, keys: set[int]) -> None:
        self.keys = keys
        self.entered: list[str] = []
        self.released = threading.Event()


@pytest.fixture
def connectors() -> Iterator[list[Connector]]:
    """Connectors a test starts, stopped however it ended."""
    started: list[Connector] = []
    try:
        yield started
    finally:
        for connector in started:
            connector.stop(timeout=30)


def start(connectors: list[Connector], uri: str, cls: type, name: str) -> Connector:
    connector = Connector(uri, [cls], instance_id=name, metrics_port=0)
    connector.start()
    connectors.append(connector)
    return connector


def running(connector: Connector) -> list[str]:
    return sorted(name for name, status in connector.status().items() if status.state is StreamState.RUNNING)


@pytest.mark.usefixtures("needs_hashed_index_key")
def test_a_bucket_handed_over_finishes_its_handler_and_saves_before_its_lease_is_released(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, connectors: list[Connector]
) -> None:
    """The first connector runs both buckets and holds one event of each in its handler; a second
    one joins. The bucket the fleet gives to the second stays with the first (its lease, its
    status RUNNING with a reason saying so) until that handler finished and the position after it
    was saved; then the second takes it and goes on right after. Meanwhile both are ready."""
    orders = client[db_name]["orders"]
    bucket_of = buckets_of(client, db_name, 2)
    hold = Hold({min(k for k, b in bucket_of.items() if b == name) for name in bucket_names(2)})
    handled: Handled = []
    first = start(connectors, mongodb_uri, fleet_class(db_name, "a", handled, hold), "a")
    # Alone, it took every bucket before start() returned: what is written from now on is read.
    assert running(first) == bucket_names(2)
    with orders.watch(max_await_time_ms=50) as truth:
        orders.insert_many([{"_id": key} for key in range(10)])
        wait_until(lambda: len(hold.entered) == 2, what="both buckets holding an event in their handler")
        second = start(connectors, mongodb_uri, fleet_class(db_name, "b", handled), "b")
        given = wait_until(
            lambda: next(
                (
                    name
                    for name, status in first.status().items()
                    if status.reason and status.reason.startswith("handing over to instance 'b'")
                ),
                None,
            ),
            what="the first connector handing a bucket over",
        )
        # The handler still holds its event: the lease stays the first connector's.
        lease = client[db_name]["_fw_locks"].find_one({"_id": given})
        assert lease is not None and lease["ownerToken"] == first.instance_token, lease
        assert first.status()[given].state is StreamState.RUNNING
        waiting = wait_until(
            lambda: (s := second.status()[given]).lease_holder_token == first.instance_token and s,
            what="the second connector to see who holds the bucket",
        )
        assert waiting.state is StreamState.STANDBY
        assert waiting.runs_elsewhere
        assert waiting.lease_holder == "a"
        assert waiting.reason is not None and "gives this bucket to this instance" in waiting.reason
        for connector in (first, second):
            code, body = get(connector, "/readyz")
            assert code == 200, body

        hold.released.set()
        wait_until(lambda: running(second) == [given], what="the second connector to take the bucket")
        assert running(first) == [name for name in bucket_names(2) if name != given]
        orders.update_many({}, {"$set": {"again": True}})
        events = read_events(truth, 20)
    tokens = [event["_id"]["_data"] for event in events]
    wait_until(lambda: {h[3] for h in handled} >= set(tokens), what="every event to be handled")

    assert Counter(h[3] for h in handled) == Counter(tokens), "an event was handled twice or never"
    held_key = next(key for key in hold.keys if bucket_of[key] == given)
    given_handled = [(tag, key) for tag, stream, key, _ in handled if stream == given]
    # The held event was finished by the first connector, and everything after it in the bucket
    # (the updates) by the second.
    position = given_handled.index(("a", held_key))
    assert {tag for tag, _ in given_handled[position + 1 :]} == {"b"}, given_handled
    assert {tag for tag, _ in given_handled[: position + 1]} == {"a"}, given_handled


@pytest.mark.usefixtures("needs_hashed_index_key")
def test_three_connectors_hold_two_buckets_each_and_say_so_and_a_stopped_ones_are_taken(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, connectors: list[Connector]
) -> None:
    """partitions=6 over three connectors: each runs 2 buckets and is ready; every connector's
    status names the holder of every bucket, and each bucket's lease is held once. One stops
    gracefully: the other two run 3 each, and every event is handled once."""
    handled: Handled = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        partitions=6,
        deployment="single_leader",
        lease_ttl_seconds=10,
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=1)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            assert event.document_key is not None
            handled.append(("", ctx.stream, event.document_key["_id"], event.token["_data"]))

    names = bucket_names(6)
    three = [start(connectors, mongodb_uri, Orders, name) for name in ("a", "b", "c")]
    wait_until(
        lambda: [len(running(c)) for c in three] == [2, 2, 2], what="each connector running 2 buckets"
    )
    runs = {name: c for c in three for name in running(c)}
    assert sorted(runs) == names

    def agree() -> bool:
        return all(
            c.status()[name].lease_holder_token == runs[name].instance_token for c in three for name in names
        )

    wait_until(agree, what="every connector's status to name the holder of every bucket")
    for c in three:
        assert {s.lease_holder for s in c.status().values()} == {"a", "b", "c"}
        standing_by = [s for s in c.status().values() if s.state is StreamState.STANDBY]
        assert len(standing_by) == 4 and all(s.runs_elsewhere for s in standing_by)
        code, body = get(c, "/readyz")
        assert code == 200, body
    # What flowwarden_lease_held exports (the metrics of one process: see test_fleet_processes.py).
    assert sorted(r.name for c in three for r in c.runners() if r.holds_lease) == names

    orders = client[db_name]["orders"]
    with orders.watch(max_await_time_ms=50) as truth:
        orders.insert_many([{"_id": key} for key in range(30)])
        three[0].stop(timeout=30)
        orders.update_many({}, {"$set": {"again": True}})
        wait_until(lambda: [len(running(c)) for c in three[1:]] == [3, 3], what="the others running 3 each")
        orders.delete_many({})
        tokens = [event["_id"]["_data"] for event in read_events(truth, 90)]
    wait_until(lambda: {h[3] for h in handled} >= set(tokens), what="every event to be handled")
    assert Counter(h[3] for h in handled) == Counter(tokens), "an event was handled twice or never"
    # The stopped connector left the fleet at once: its member record is gone.
    members = client[db_name]["_fw_locks"].find({"kind": "member", "stream": "orders"})
    assert sorted(json.dumps(m["owner"]) for m in members) == ['"b"', '"c"']


@pytest.mark.usefixtures("needs_hashed_index_key")
def test_a_bucket_handed_over_during_its_initial_snapshot_is_copied_on_by_the_member_taking_it(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, connectors: list[Connector]
) -> None:
    """snapshot=INITIAL in chunks of 2: the first connector copies both buckets and holds the 5th
    document of each in its handler when a second one joins. The bucket handed over finishes that
    document (and its chunk, unless halted before its end), then the second connector copies on
    from the last finished chunk: every document is copied, and only the handed-over bucket's
    unfinished chunk twice."""
    from flowwarden import Snapshot

    orders = client[db_name]["orders"]
    bucket_of = buckets_of(client, db_name, 2)
    orders.insert_many([{"_id": key} for key in sorted(bucket_of)])
    order = {name: sorted(k for k, b in bucket_of.items() if b == name) for name in bucket_names(2)}
    hold = Hold({keys[4] for keys in order.values()})
    copied: list[tuple[str, str, Any]] = []

    def copier(tag: str, held: Hold | None) -> type:
        @change_stream(
            "orders",
            db_name,
            name="orders",
            partitions=2,
            deployment="single_leader",
            lease_ttl_seconds=10,
            snapshot=Snapshot.INITIAL,
            snapshot_chunk_size=2,
            max_await_time_ms=50,
        )
        class Orders:
            @on_change
            async def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
                assert event.document_key is not None
                key = event.document_key["_id"]
                if held is not None and key in held.keys and not held.released.is_set():
                    held.entered.append(ctx.stream)
                    await asyncio.to_thread(held.released.wait, 30)
                copied.append((tag, ctx.stream, key))

        return Orders

    first = start(connectors, mongodb_uri, copier("a", hold), "a")
    wait_until(lambda: len(hold.entered) == 2, what="both buckets holding a document in their handler")
    second = start(connectors, mongodb_uri, copier("b", None), "b")
    given = wait_until(
        lambda: next(
            (n for n, s in first.status().items() if s.reason and s.reason.startswith("handing over")), None
        ),
        what="the first connector handing a bucket over",
    )
    hold.released.set()
    wait_until(lambda: {c[2] for c in copied} == set(bucket_of), what="every document copied")
    wait_until(lambda: running(second) == [given], what="the second connector to run the bucket")
    # The giver stands by for the bucket (it would take it again were the second to leave).
    giver = wait_until(lambda: (s := first.status()[given]).lease_holder == "b" and s, what="it to see b")
    assert giver.state is StreamState.STANDBY and giver.runs_elsewhere

    given_copies = [(tag, key) for tag, stream, key in copied if stream == given]
    by_first = [key for tag, key in given_copies if tag == "a"]
    by_second = [key for tag, key in given_copies if tag == "b"]
    # The first copied the bucket up to some document past the held one, in _id order; the second
    # from the start of the chunk that was not finished then, at most one chunk (2) back.
    assert by_first == order[given][: len(by_first)] and len(by_first) >= 5, by_first
    went_on = len(order[given]) - len(by_second)
    assert by_second == order[given][went_on:], by_second
    assert 0 <= len(by_first) - went_on <= 2, (by_first, by_second)
    counts = Counter(key for _, _, key in copied)
    twice = sorted(key for key, count in counts.items() if count > 1)
    assert twice == sorted(order[given][went_on : len(by_first)]), "copied twice outside the unfinished chunk"
    assert max(counts.values()) <= 2
