"""Every metric of docs/operations.md, read from /metrics over HTTP and compared with what it
measures, read where that lives: the calls the handler methods got, the dead-letter collection,
the checkpoint store, ``local.oplog.rs``, the lease documents, the fail points that fired.

Each comparison is exact where the truth is a count. A gauge that is "now minus X" is compared
with X read directly and the wall-clock times before and after the scrape, give or take one
second (positions have whole-second cluster times, and a live position may be one heartbeat ahead
of the stored one). A metric stuck at 0, counting the wrong thing or labelled with another
stream's name fails here.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pymongo
from bson import Timestamp
from prometheus_client.parser import text_string_to_metric_families
from pymongo.errors import AutoReconnect

from flowwarden import (
    ChangeEvent,
    Connector,
    OnError,
    Snapshot,
    StreamState,
    change_stream,
    checkpoint,
    on_batch,
    on_change,
    on_insert,
    retry_policy,
)
from flowwarden.checkpoints import InMemoryCheckpointStore, MongoCheckpointStore
from flowwarden.checkpoints.model import Checkpoint, SaveResult, SnapshotProgress
from flowwarden.events import ResumeToken
from flowwarden.runtime import observability
from helpers import Samples, checkpoint_doc, get, running, samples, value, wait_until

from .conftest import FailCommand

WINDOW = "flowwarden_oplog_window_hours"
GIVEN_UP = {OnError.DEAD_LETTER: "dead_lettered", OnError.SKIP: "skipped", OnError.STOP: "failed"}
HANDLER_SECONDS = 0.005
"""How long each call of the recording handlers lasts at least: the durations' sum then has a
floor that a wrong unit or a wrong clock would miss."""


def series(found: Samples, name: str, **fixed: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` whose labels include ``fixed``: (all their labels, value)."""
    picked = []
    for (sample, labels), number in found.items():
        labelled = dict(labels)
        if sample == name and fixed.items() <= labelled.items():
            picked.append((labelled, number))
    return picked


def outcomes_shown(found: Samples, stream: str) -> dict[tuple[str, str], float]:
    """flowwarden_events_total of ``stream``: (operation, outcome) -> events, zeros left out."""
    return {
        (labels["operation"], labels["outcome"]): number
        for labels, number in series(found, "flowwarden_events_total", stream=stream)
        if number
    }


@dataclass(frozen=True)
class Histogram:
    buckets: dict[float, float]
    """Upper bound -> observations at or below it (cumulative, as exposed); +Inf is math.inf."""
    count: float
    sum: float


def histogram(found: Samples, name: str, stream: str) -> Histogram:
    buckets = {float(labels["le"]): n for labels, n in series(found, f"{name}_bucket", stream=stream)}
    count, total = value(found, f"{name}_count", stream=stream), value(found, f"{name}_sum", stream=stream)
    assert buckets and count is not None and total is not None, f"no {name} for stream {stream!r}"
    return Histogram(buckets, count, total)


def assert_buckets_hold(shown: Histogram, observed: list[float], *, observed_are_floors: bool) -> None:
    """Each cumulative bucket against the values observed directly: equal counts, or, when each
    directly measured value is only a floor of what the metric observed (a duration measured
    inside the call it encloses), at most as many."""
    assert shown.buckets[math.inf] == shown.count == len(observed)
    for bound, count in shown.buckets.items():
        at_most = sum(1 for v in observed if v <= bound)
        if observed_are_floors:
            assert count <= at_most, f"bucket le={bound}: {count} > {at_most}"
        else:
            assert count == at_most, f"bucket le={bound}: {count} != {at_most}"


def states_shown(found: Samples, stream: str) -> set[str]:
    """The states flowwarden_stream_state shows as 1 for ``stream``, after checking it has one
    sample per state, each 0 or 1."""
    states = series(found, "flowwarden_stream_state", stream=stream)
    shown = {labels["state"]: number for labels, number in states}
    assert set(shown) == {state.value for state in StreamState}
    assert set(shown.values()) <= {0.0, 1.0}
    return {state for state, number in shown.items() if number == 1}


def oplog_edges(client: pymongo.MongoClient[Any]) -> tuple[Timestamp, Timestamp]:
    """The ts of the oldest and of the newest entry of local.oplog.rs, read directly."""
    oplog = client["local"]["oplog.rs"]
    oldest = oplog.find_one({}, projection={"ts": 1}, sort=[("$natural", 1)])
    newest = oplog.find_one({}, projection={"ts": 1}, sort=[("$natural", -1)])
    assert oldest is not None and newest is not None, "the oplog has no entry"
    return oldest["ts"], newest["ts"]


@dataclass(frozen=True)
class Call:
    """One call of a recording handler's method, as the method saw it."""

    stream: str
    operation: str
    key: Any
    ok: bool
    seconds: float


def recording_handler(
    db: str,
    name: str,
    on_exhausted: OnError,
    calls: list[Call],
    *,
    once: frozenset[tuple[str, int]] = frozenset(),
    always: frozenset[tuple[str, int]] = frozenset(),
) -> type:
    """@on_change on collection ``name``, two attempts per event; each call is appended to
    ``calls``. The events named in ``once`` ((operation, _id)) fail on their first call, those
    in ``always`` on every call."""

    @change_stream(name, db, name=name, max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.2)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted=on_exhausted)
    class Recording:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            began = time.perf_counter()
            what = (event.operation_type, event.document_key["_id"])
            tried = any(c.stream == name and (c.operation, c.key) == what for c in calls)
            fails = what in always or (what in once and not tried)
            time.sleep(HANDLER_SECONDS)  # a floor for the durations (see HANDLER_SECONDS)
            calls.append(Call(name, what[0], what[1], not fails, time.perf_counter() - began))
            if fails:
                raise ValueError(f"{name} cannot take {what} yet")

    return Recording


def outcomes_seen(calls: list[Call], stream: str, on_exhausted: OnError) -> Counter[tuple[str, str]]:
    """(operation, outcome) -> events, from the calls ``stream``'s method got: one call that
    worked is ok, several ending with one that worked is retried, none that worked is given up
    on as ``on_exhausted`` says."""
    attempts: dict[tuple[str, Any], list[Call]] = {}
    for call in calls:
        if call.stream == stream:
            attempts.setdefault((call.operation, call.key), []).append(call)
    outcomes: Counter[tuple[str, str]] = Counter()
    for (operation, _), tries in attempts.items():
        if tries[-1].ok:
            outcomes[operation, "ok" if len(tries) == 1 else "retried"] += 1
        else:
            outcomes[operation, GIVEN_UP[on_exhausted]] += 1
    return outcomes


def test_events_and_handler_durations_are_what_the_methods_got_and_the_dlq_holds(
    mongodb_uri, client, db_name
):
    calls: list[Call] = []
    # stream -> (on_exhausted, events failing once, events failing on every call)
    plans: dict[str, tuple[OnError, set[tuple[str, int]], set[tuple[str, int]]]] = {
        "orders": (OnError.DEAD_LETTER, {("insert", 3), ("update", 1)}, {("insert", 4), ("delete", 5)}),
        "payments": (OnError.SKIP, {("insert", 1)}, {("insert", 2), ("update", 3)}),
        "refunds": (OnError.STOP, set(), {("insert", 1)}),
    }
    handlers = [
        recording_handler(db_name, name, policy, calls, once=frozenset(once), always=frozenset(always))
        for name, (policy, once, always) in plans.items()
    ]
    began = time.perf_counter()
    with running(mongodb_uri, handlers, metrics_port=0) as connector:
        db = client[db_name]
        db.orders.insert_many([{"_id": i} for i in range(8)])
        db.orders.update_one({"_id": 0}, {"$set": {"qty": 1}})
        db.orders.update_one({"_id": 1}, {"$set": {"qty": 2}})
        db.orders.delete_one({"_id": 2})
        db.orders.delete_one({"_id": 5})
        db.payments.insert_many([{"_id": i} for i in range(4)])
        db.payments.update_one({"_id": 0}, {"$set": {"paid": True}})
        db.payments.update_one({"_id": 3}, {"$set": {"paid": True}})
        db.refunds.insert_many([{"_id": i} for i in range(3)])
        # events_processed moves once an event was counted, given up on or not.
        wait_until(lambda: connector.status()["orders"].events_processed == 12, what="12 orders events")
        wait_until(lambda: connector.status()["payments"].events_processed == 6, what="6 payments events")
        wait_until(lambda: connector.status()["refunds"].state == StreamState.FAILED, what="refunds FAILED")
        found = samples(connector)
        span = time.perf_counter() - began

    dlq = client[db_name]["_fw_dlq"]
    every_outcome: set[str] = set()
    for stream, (policy, _, _) in plans.items():
        expected = outcomes_seen(calls, stream, policy)
        assert outcomes_shown(found, stream) == expected, stream
        every_outcome |= {outcome for _, outcome in expected}
        # The dead-letter collection holds exactly the events counted as dead-lettered.
        parked = Counter(doc["event"]["operationType"] for doc in dlq.find({"stream": stream}))
        dead_lettered = {op: n for (op, outcome), n in expected.items() if outcome == "dead_lettered"}
        assert parked == Counter(dead_lettered)
        assert value(found, "flowwarden_dead_letters_total", stream=stream) == sum(parked.values())
        # One observation per call, each at least as long as the call measured from inside it;
        # the calls of one stream run one after another, so together they fit in the test's span.
        durations = [c.seconds for c in calls if c.stream == stream]
        shown = histogram(found, "flowwarden_handler_duration_seconds", stream)
        assert_buckets_hold(shown, durations, observed_are_floors=True)
        assert sum(durations) <= shown.sum <= span
        assert histogram(found, "flowwarden_batch_events", stream).count == 0
    assert every_outcome == {"ok", "retried", "skipped", "dead_lettered", "failed"}
    assert sum(1 for doc in dlq.find()) == 2


def test_batch_histograms_count_the_batches_the_method_got(mongodb_uri, client, db_name):
    calls: list[tuple[int, ...]] = []  # the keys of every call; a retried batch comes twice

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.2)
    @retry_policy(max_attempts=3, initial_delay_seconds=0.01)
    class Lines:
        @on_batch(max_events=10, max_wait_seconds=60)  # handed over full: 10 events each
        def handle(self, events: list[ChangeEvent]) -> None:
            keys = tuple(e.document_key["_id"] for e in events)
            calls.append(keys)
            if 12 in keys and calls.count(keys) == 1:
                raise ValueError("the batch with order 12 fails once")

    with running(mongodb_uri, [Lines], metrics_port=0) as connector:
        client[db_name].orders.insert_many([{"_id": i} for i in range(30)])
        wait_until(lambda: connector.status()["orders"].events_processed == 30, what="30 events")
        found = samples(connector)

    batches = list(dict.fromkeys(calls))  # each batch once, in the order handed over
    assert sorted(k for batch in batches for k in batch) == list(range(30))
    sizes = [len(batch) for batch in batches]
    shown = histogram(found, "flowwarden_batch_events", "orders")
    assert_buckets_hold(shown, [float(s) for s in sizes], observed_are_floors=False)
    assert shown.sum == 30
    assert sizes == [10, 10, 10]  # a batch of exactly a bucket's bound counts in that bucket
    assert histogram(found, "flowwarden_handler_duration_seconds", "orders").count == len(calls)
    retried = sum(len(b) for b in batches if calls.count(b) > 1)
    assert retried > 0
    assert outcomes_shown(found, "orders") == {("insert", "ok"): 30 - retried, ("insert", "retried"): retried}


def saving(found: Samples) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The checkpoint-save samples of a scrape."""
    return {key: number for key, number in found.items() if key[0].startswith("flowwarden_checkpoint_save")}


class CountingStore:
    """MongoCheckpointStore, counting the writes it received and how each ended."""

    def __init__(self, inner: MongoCheckpointStore) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.stored: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.seconds = 0.0
        """The time the stored writes took, measured around the inner store's call."""
        self.writing = 0
        """Writes under way."""

    def _write(self, method: str, *args: Any) -> SaveResult:
        with self._lock:
            self.writing += 1
        began = time.perf_counter()
        try:
            result: SaveResult = getattr(self._inner, method)(*args)
        except Exception:
            with self._lock:
                self.failed[method] += 1
                self.writing -= 1
            raise
        with self._lock:
            self.stored[method] += 1
            self.seconds += time.perf_counter() - began
            self.writing -= 1
        return result

    def tally(self) -> tuple[int, Counter[str], int, float]:
        """(writes under way, stored writes by method, failed writes, seconds the stored took)."""
        with self._lock:
            return self.writing, Counter(self.stored), sum(self.failed.values()), self.seconds

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        return self._write("save", checkpoint)

    def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return self._write("save_seen", stream_id, token, epoch)

    def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return self._write("save_batch_end", stream_id, token, epoch)

    def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        return self._write("save_snapshot", stream_id, progress, epoch)

    def load(self, stream_id: str) -> Checkpoint | None:
        return self._inner.load(stream_id)

    def delete(self, stream_id: str) -> bool:
        return self._inner.delete(stream_id)

    def list(self) -> list[Checkpoint]:
        return self._inner.list()

    def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        self._inner.rewind(stream_id, token)


def test_checkpoint_saves_and_failures_are_the_writes_the_store_got(
    mongodb_uri, client, db_name, fail_command: FailCommand
):
    # The store's own client names itself like the connector's, so the fail point reaches it.
    with pymongo.MongoClient(mongodb_uri, appname="flowwarden") as store_client:
        store = CountingStore(MongoCheckpointStore(store_client[db_name]))

        @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
        @checkpoint(save_every_n=1, save_interval_seconds=0)  # no heartbeat: writes follow events
        class Orders:
            @on_change
            def handle(self, event: ChangeEvent) -> None: ...

        orders = client[db_name].orders
        began = time.perf_counter()
        with running(mongodb_uri, [Orders], checkpoint_store=store, metrics_port=0) as connector:
            orders.insert_many([{"_id": i} for i in range(3)])
            wait_until(lambda: (checkpoint_doc(client, db_name, "orders") or {}).get("eventsProcessed") == 3)
            # ExceededTimeLimit without a retryable label: the driver does not retry it, the
            # committer does, at the next event.
            fail_command(["update"], mode={"times": 2}, errorCode=262)
            for key in range(3, 8):
                orders.insert_one({"_id": key})
            wait_until(lambda: sum(store.failed.values()) == 2, what="two failed writes")
            wait_until(lambda: checkpoint_doc(client, db_name, "orders")["eventsProcessed"] == 8)

            def settled() -> tuple[Samples, tuple[int, Counter[str], int, float]] | None:
                """A scrape, with the store's tally, between two moments when no write was under
                way and the tally and the save metrics stood still: a write that ends is counted
                on the event loop's next turn. (Stopping writes once more: the tally is taken here.)"""
                before, first = store.tally(), samples(connector)
                found = samples(connector)
                quiet = before == store.tally() and before[0] == 0
                return (found, before) if quiet and saving(first) == saving(found) else None

            found, (_, stored, failed, seconds) = wait_until(settled, what="the store and metrics at rest")
            span = time.perf_counter() - began
        fired = fail_command.off()

    saves = value(found, "flowwarden_checkpoint_saves_total", stream="orders")
    assert saves == sum(stored.values())
    assert stored["save"] >= 4  # events 0..2, and the last one at least
    assert value(found, "flowwarden_checkpoint_save_failures_total", stream="orders") == failed == fired == 2
    duration = histogram(found, "flowwarden_checkpoint_save_duration_seconds", "orders")
    assert duration.count == saves
    assert seconds <= duration.sum <= span


def test_restarts_are_the_reopens_after_injected_transient_errors(
    mongodb_uri, client, db_name, fail_command: FailCommand
):
    handled: list[int] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        max_await_time_ms=50,
        restart_initial_delay_seconds=0.05,
        restart_max_delay_seconds=0.1,
    )
    class Orders:
        @on_insert
        def created(self, event: ChangeEvent) -> None:
            handled.append(event.document_key["_id"])

    with running(mongodb_uri, [Orders], metrics_port=0) as connector:
        before = samples(connector)
        # ExceededTimeLimit without ResumableChangeStreamError: the driver gives up, the stream
        # re-opens, and its next getMore meets the fail point again, three times.
        fail_command(["getMore"], mode={"times": 3}, errorCode=262)
        wait_until(lambda: connector.status()["orders"].restarts == 3, what="three restarts")
        client[db_name].orders.insert_one({"_id": 1})
        wait_until(lambda: handled == [1], what="the event after the restarts")
        wait_until(lambda: connector.status()["orders"].state == StreamState.RUNNING, what="RUNNING")
        fired = fail_command.off()
        found = samples(connector)
    assert value(before, "flowwarden_restarts_total", stream="orders") == 0
    assert value(found, "flowwarden_restarts_total", stream="orders") == fired == 3
    assert states_shown(found, "orders") == {"RUNNING"}


def test_seconds_behind_are_now_minus_the_stored_positions(mongodb_uri, client, db_name, next_server_second):
    store = InMemoryCheckpointStore()  # its writes add nothing to the oplog the streams follow
    handled: Counter[str] = Counter()
    cluster_times: dict[str, int] = {}  # the newest handled event's cluster time, per stream

    def stream(name: str) -> type:
        @change_stream(name, db_name, name=name, max_await_time_ms=50)
        @checkpoint(save_every_n=1, save_interval_seconds=0.1)
        class Counting:
            @on_change
            def handle(self, event: ChangeEvent) -> None:
                assert event.cluster_time is not None
                cluster_times[name] = event.cluster_time.time
                handled[name] += 1

        return Counting

    def stored(name: str) -> tuple[float, float] | None:
        """The stream's stored lastProcessed and lastSeen, as epoch seconds (None before both are)."""
        record = store.load(name)
        if record is None or record.last_processed_at is None or record.last_seen_at is None:
            return None
        return record.last_processed_at.timestamp(), record.last_seen_at.timestamp()

    def check(connector: Connector, names: tuple[str, ...]) -> dict[str, tuple[float, float]]:
        """Both gauges of each stream against now minus its stored positions, read before and
        after the scrape; returns what each stream showed (processed, seen)."""
        before = {name: stored(name) for name in names}
        t0 = time.time()
        found = samples(connector)
        t1 = time.time()
        shown = {}
        for name in names:
            first, last = before[name], stored(name)
            assert first is not None and last is not None
            pair = []
            for i, metric in enumerate(("flowwarden_seconds_behind", "flowwarden_seen_seconds_behind")):
                number = value(found, metric, stream=name)
                assert number is not None, f"no {metric} for {name}"
                low = t0 - max(first[i], last[i]) - 1.0
                high = t1 - min(first[i], last[i]) + 1.0
                assert low <= number <= high, f"{metric} of {name} = {number}, not in [{low}, {high}]"
                pair.append(number)
            shown[name] = (pair[0], pair[1])
        return shown

    both = ("orders", "payments")
    with running(mongodb_uri, [stream(n) for n in both], checkpoint_store=store, metrics_port=0) as connector:
        db = client[db_name]
        db.orders.insert_one({"_id": 1})
        wait_until(lambda: handled["orders"] == 1 and stored("orders"), what="orders handled and saved")
        check(connector, ("orders",))
        next_server_second()
        next_server_second()
        db.payments.insert_one({"_id": 1})
        wait_until(lambda: handled["payments"] == 1 and stored("payments"), what="payments handled and saved")
        # Writes elsewhere (next_server_second's probes): both streams see them, and handle none.
        next_server_second()
        next_server_second()
        newest = oplog_edges(client)[1].time

        def seen_newest() -> bool:
            return all((positions := stored(n)) is not None and positions[1] >= newest for n in both)

        wait_until(seen_newest, what="lastSeen at the newest write")
        busy = check(connector, both)
        # lastProcessed is the handled event's cluster time, as the method saw it.
        assert {n: positions[0] for n in both if (positions := stored(n))} == cluster_times
        assert busy["orders"][1] < busy["orders"][0] - 2  # seen stays small while processed grows
        # Nothing is written now: time passes, and both gauges grow from where the streams stand.
        wait_until(lambda: time.time() >= newest + 2.5, what="2.5 s after the last write")
        check(connector, both)


def test_the_oplog_window_is_the_span_of_local_oplog_rs(mongodb_uri, client, db_name, next_server_second):
    client[db_name].orders.insert_one({"_id": 1})
    next_server_second()  # the window spans a second at least
    before = oplog_edges(client)

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    class Quiet:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    def with_window(connector: Connector) -> Samples | None:
        found = samples(connector)
        return found if value(found, WINDOW) is not None else None

    with running(mongodb_uri, [Quiet], metrics_port=0) as connector:
        found = wait_until(lambda: with_window(connector), what="the oplog window metric")
        after = oplog_edges(client)
    # The connector read both edges between the two direct reads; nothing left the oplog meanwhile.
    assert before[0] == after[0]
    low = (before[1].time - before[0].time) / 3600
    high = (after[1].time - after[0].time) / 3600
    assert low >= 1 / 3600
    assert low <= value(found, WINDOW) <= high


def test_the_oplog_window_and_the_heartbeat_outlive_an_unreachable_deployment(
    mongodb_uri, client, db_name, monkeypatch
):
    monkeypatch.setattr(observability, "OPLOG_WINDOW_REFRESH_SECONDS", 0.05)
    monkeypatch.setattr(observability, "STALL_SECONDS", 1.0)
    reads: list[float] = []
    read = observability.oplog_window_async

    async def first_read_fails(mongo: Any) -> tuple[Timestamp | None, Timestamp | None]:
        reads.append(time.monotonic())
        if len(reads) == 1:
            raise AutoReconnect("connection closed")  # what PyMongo raises while it cannot reach the server
        return await read(mongo)

    monkeypatch.setattr(observability, "oplog_window_async", first_read_fails)
    client[db_name].orders.insert_one({"_id": 1})

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    class Quiet:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    with running(mongodb_uri, [Quiet], metrics_port=0) as connector:
        wait_until(lambda: value(samples(connector), WINDOW) is not None, what="a read after the failure")
        # Reads go on for longer than /healthz allows the loop to stand still.
        wait_until(lambda: reads[-1] - reads[0] > 1.5, what="reads for 1.5 s after the failure")
        assert get(connector, "/healthz")[0] == 200


def test_snapshot_gauges_follow_the_rows_the_method_finished(mongodb_uri, client, db_name):
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(10)])
    rows: list[tuple[str, int]] = []
    holding, release = threading.Event(), threading.Event()

    @change_stream(
        "orders",
        db_name,
        name="orders",
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=4,
        max_await_time_ms=50,
    )
    class Orders:
        @on_insert
        def created(self, event: ChangeEvent) -> None:
            rows.append((event.operation_type, event.document_key["_id"]))
            if event.document_key["_id"] == 5 and not release.is_set():
                holding.set()
                release.wait(30)  # a sync method holds the event loop: the copy stops mid-chunk

    def stored_progress() -> dict[str, Any]:
        progress: dict[str, Any] = (checkpoint_doc(client, db_name, "orders") or {}).get("snapshot", {})
        return progress

    with running(mongodb_uri, [Orders], metrics_port=0) as connector:
        try:
            assert holding.wait(20), "the copy never reached _id 5"
            middle = samples(connector)
            progress = stored_progress()
            handed = len(rows)
            # Past the copy's bound (the highest _id when it began): they arrive as changes only.
            orders.insert_many([{"_id": 10}, {"_id": 11}])
        finally:
            release.set()
        wait_until(lambda: stored_progress().get("done") is True, what="the snapshot done")
        wait_until(lambda: rows[-2:] == [("insert", 10), ("insert", 11)], what="the changes after it")
        # Counted once handled: events_processed moves with the count (snapshot rows are not events).
        wait_until(lambda: connector.status()["orders"].events_processed == 2, what="both counted")
        end = samples(connector)

    # Midway: the chunk of _id 0..3 finished and was saved; the method holds _id 5 of the next.
    assert handed == 6 and progress["copied"] == 4 and progress["done"] is False
    assert value(middle, "flowwarden_snapshot_documents_copied", stream="orders") == progress["copied"]
    assert value(middle, "flowwarden_snapshot_documents_estimated", stream="orders") == 10
    assert value(middle, "flowwarden_snapshot_done", stream="orders") == 0
    copied = sum(1 for operation, _ in rows if operation == "snapshot")
    assert copied == 10 and orders.count_documents({}) == 12
    assert value(end, "flowwarden_snapshot_documents_copied", stream="orders") == copied
    assert value(end, "flowwarden_snapshot_documents_estimated", stream="orders") == 10  # when it began
    assert value(end, "flowwarden_snapshot_done", stream="orders") == 1
    assert outcomes_shown(end, "orders") == {("snapshot", "ok"): 10, ("insert", "ok"): 2}



def test_snapshot_rows_a_batch_method_finished_count_as_snapshot_events_in_batches(
    mongodb_uri, client, db_name
):
    orders = client[db_name].orders
    orders.insert_many([{"_id": i} for i in range(7)])
    calls: list[list[tuple[str, int]]] = []

    @change_stream(
        "orders",
        db_name,
        name="orders",
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=3,
        max_await_time_ms=50,
    )
    class Orders:
        @on_batch(max_events=3, max_wait_seconds=0.05)
        def handle(self, events: list[ChangeEvent]) -> None:
            calls.append([(event.operation_type, event.document_key["_id"]) for event in events])

    with running(mongodb_uri, [Orders], metrics_port=0) as connector:
        wait_until(lambda: sum(len(rows) for rows in calls) == 7, what="every row")
        orders.insert_one({"_id": 7})
        wait_until(lambda: calls[-1] == [("insert", 7)], what="the change after the copy")
        wait_until(lambda: connector.status()["orders"].events_processed == 1, what="the change counted")
        found = samples(connector)

    # One batch per chunk of three rows, then the change in a batch of its own.
    chunks = [[0, 1, 2], [3, 4, 5], [6]]
    assert calls == [[("snapshot", i) for i in chunk] for chunk in chunks] + [[("insert", 7)]]
    assert outcomes_shown(found, "orders") == {("snapshot", "ok"): 7, ("insert", "ok"): 1}
    shown = histogram(found, "flowwarden_batch_events", "orders")
    assert (shown.count, shown.sum) == (4, 8)

def test_lease_held_and_stream_state_follow_the_lease_document(mongodb_uri, client, db_name):
    locks = client[db_name]["_fw_locks"]
    now = datetime.now(timezone.utc)
    later = now + timedelta(hours=1)
    lease = {
        "_id": "orders",
        "owner": "elsewhere",
        "ownerToken": "elsewhere:1:0",
        "epoch": 1,
        "expiresAt": later,
        "acquiredAt": now,
    }
    locks.insert_one(lease)

    def quiet(name: str, **stream: Any) -> type:
        @change_stream(name, db_name, name=name, max_await_time_ms=50, **stream)
        class Quiet:
            @on_change
            def handle(self, event: ChangeEvent) -> None: ...

        return Quiet

    def owner() -> Any:
        lease = locks.find_one({"_id": "orders"})
        assert lease is not None
        return lease["owner"]

    def check(connector: Connector, *, held: bool, state: str) -> None:
        found = samples(connector)
        assert (owner() == connector.instance_id) is held
        assert value(found, "flowwarden_lease_held", stream="orders") == (1 if held else 0)
        assert states_shown(found, "orders") == {state}
        # The stream beside it takes no lease, and runs throughout.
        assert value(found, "flowwarden_lease_held", stream="payments") == 0
        assert states_shown(found, "payments") == {"RUNNING"}

    leader = quiet("orders", deployment="single_leader", lease_ttl_seconds=3)
    with running(mongodb_uri, [leader, quiet("payments")], metrics_port=0) as connector:

        def status() -> StreamState:
            return connector.status()["orders"].state

        wait_until(lambda: status() == StreamState.STANDBY, what="STANDBY behind another holder")
        check(connector, held=False, state="STANDBY")
        # The other holder lets go, as LeaseManager.release does.
        locks.update_one(
            {"_id": "orders"}, {"$set": {"owner": None, "expiresAt": datetime.fromtimestamp(0, timezone.utc)}}
        )
        wait_until(lambda: owner() == connector.instance_id and status() == StreamState.RUNNING)
        check(connector, held=True, state="RUNNING")
        # Another instance takes the lease over with a newer epoch: this one's renewal finds it gone.
        epoch = locks.find_one({"_id": "orders"})["epoch"]
        locks.update_one(
            {"_id": "orders"},
            {
                "$set": {
                    "owner": "elsewhere",
                    "ownerToken": "elsewhere:1:0",
                    "epoch": epoch + 1,
                    "expiresAt": later,
                }
            },
        )
        wait_until(lambda: status() == StreamState.STANDBY, what="STANDBY after losing the lease")
        check(connector, held=False, state="STANDBY")


def documented_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """The metrics table of docs/operations.md: name -> (type, labels)."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| `(flowwarden_\w+)` \| (\w+) \|([^|]*)\|", text, re.MULTILINE)
    return {name: (kind, frozenset(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def documented_descriptions() -> dict[str, str]:
    """The metrics table of docs/operations.md: name -> what it counts, as a HELP line says it
    (a capital first, no backticks, a period last)."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| `(flowwarden_\w+)` \|[^|]*\|[^|]*\| (.*) \|$", text, re.MULTILINE)
    return {name: (words[0].upper() + words[1:]).replace("`", "") + "." for name, words in rows}


def exposed_metrics(connector: Connector) -> dict[str, tuple[str, frozenset[str]]]:
    """flowwarden's families on /metrics: name as scraped (counters end in _total) -> (type,
    the labels of their samples, a histogram's ``le`` left out)."""
    status, body = get(connector, "/metrics")
    assert status == 200
    exposed = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name.startswith("flowwarden_"):
            labels = frozenset(label for sample in family.samples for label in sample.labels if label != "le")
            name = f"{family.name}_total" if family.type == "counter" else family.name
            exposed[name] = (family.type, labels)
    return exposed


def test_the_operations_table_lists_every_metric_with_its_type_and_labels(mongodb_uri, client, db_name):
    orders = client[db_name].orders
    orders.insert_one({"_id": 0})
    handled: list[str] = []

    @change_stream("orders", db_name, name="orders", snapshot=Snapshot.INITIAL, max_await_time_ms=50)
    class Orders:
        @on_insert
        def created(self, event: ChangeEvent) -> None:
            handled.append(event.operation_type)

    def every_family(connector: Connector) -> dict[str, tuple[str, frozenset[str]]] | None:
        """The families once each has samples (the oplog window's once it was read)."""
        found = exposed_metrics(connector)
        unread = [name for name, (_, labels) in found.items() if not labels and name != WINDOW]
        return found if WINDOW in found and not unread else None

    with running(mongodb_uri, [Orders], metrics_port=0) as connector:
        wait_until(lambda: handled == ["snapshot"], what="the snapshot row")
        orders.insert_one({"_id": 1})
        wait_until(lambda: handled == ["snapshot", "insert"], what="the change after it")
        connector.request_snapshot("orders")  # the incremental snapshot's families get samples
        wait_until(lambda: handled.count("snapshot") == 3, what="the requested snapshot's rows")
        exposed = wait_until(lambda: every_family(connector), what="samples in every family")
        _, body = get(connector, "/metrics")
    assert exposed == documented_metrics()
    # What a scraper shows beside each series says what the table says the metric counts.
    helps = dict(re.findall(r"^# HELP (flowwarden_\w+) (.*)$", body.decode(), re.MULTILINE))
    assert helps == documented_descriptions()
