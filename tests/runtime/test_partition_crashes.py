"""Partitioned streams (``@change_stream(partitions=N)``) under what goes wrong: a process killed
with SIGKILL while a writer writes, a bucket whose handler gives up, the watched collection
dropped, dead letters replayed through the class, and the layout changed by the documented
procedure.

The ground truth of every event and its order is a plain change stream the test opens before it
writes anything; a bucket's share of it is the documents whose ``_id`` hashes there (the
server's ``$toHashedIndexKey``, modulo the number of buckets).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import json_util

from flowwarden import (
    ChangeEvent,
    Connector,
    OnError,
    OnInvalidate,
    StreamContext,
    StreamState,
    change_stream,
    checkpoint,
    on_change,
    retry_policy,
)
from flowwarden.checkpoints import Checkpoint
from flowwarden.errors import HandlerError, StreamInvalidatedError
from flowwarden.events import compare_tokens
from flowwarden.mongo.buckets import partition_name
from helpers import wait_until

from .conftest import ChildLog

HERE = Path(__file__).parent
DOCUMENTS = 30


# -- helpers ---------------------------------------------------------------------------------------


def child_env(db: str, log: Path, **env: str) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        FW_TEST_DB=db,
        FW_TEST_LOG=str(log),
        **env,
    )


class Child:
    """``flowwarden run partition_handlers:<handler>`` in a process of its own (see
    partition_handlers.py); its stderr is read as it is written."""

    def __init__(self, uri: str, db: str, log: Path, handler: str, **env: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flowwarden.cli", "run", f"partition_handlers:{handler}", "--uri", uri],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(db, log, **env),
        )
        self.log = ChildLog(self.process.stderr)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM, then the exit code (a graceful stop saves every handled event)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            wrote = self.log.finish()
            raise AssertionError(f"the child did not stop on SIGTERM; it wrote:\n{wrote}") from None


def cli(uri: str, *args: str, db: str = "", log: Path | None = None, **env: str) -> str:
    """``python -m flowwarden.cli <args> --uri <uri>``; its stdout, once it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", "flowwarden.cli", *args, "--uri", uri],
        capture_output=True,
        text=True,
        env=child_env(db, log or Path(os.devnull), **env),
        timeout=120,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def log_lines(log: Path) -> list[list[str]]:
    """The log's lines, split into their fields (every line a child finished writing)."""
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line]


class Writer:
    """Inserts, updates and deletes documents 0..DOCUMENTS-1 until stopped; every write is one
    change event (an update always changes ``n``)."""

    def __init__(self, collection: Any, pause: float = 0.002) -> None:
        self.collection = collection
        self.writes = 0
        self._pause = pause
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        present: set[int] = set()
        step = 0
        while not self._stop.is_set():
            key = (step * 7) % DOCUMENTS
            if key not in present:
                self.collection.insert_one({"_id": key, "n": step})
                present.add(key)
            elif step % 5 == 0:
                self.collection.delete_one({"_id": key})
                present.discard(key)
            else:
                self.collection.update_one({"_id": key}, {"$set": {"n": step}})
            self.writes += 1
            step += 1
            time.sleep(self._pause)  # pacing, not synchronisation: the children keep up

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the writer did not stop"


def read_events(stream: Any, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The next ``count`` events of an open change stream."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(events) < count:
        event = stream.try_next()
        if event is not None:
            events.append(event)
        elif time.monotonic() > deadline:
            raise AssertionError(f"the ground-truth stream gave {len(events)} of {count} events in time")
    return events


def bucket_names(count: int) -> list[str]:
    return [partition_name("orders", index, count) for index in range(count)]


def buckets_of(client: pymongo.MongoClient[Any], db: str, count: int) -> dict[int, str]:
    """Each document's bucket stream, from the server's own hash of its ``_id``."""
    scratch = client[db]["hashes"]
    scratch.insert_many([{"_id": key} for key in range(DOCUMENTS)])
    rows = scratch.aggregate([{"$project": {"h": {"$toHashedIndexKey": "$_id"}}}])
    return {row["_id"]: partition_name("orders", ((row["h"] % count) + count) % count, count) for row in rows}


def resume_position(client: pymongo.MongoClient[Any], db: str, stream: str) -> dict[str, Any] | None:
    """Where ``stream`` resumes: the newer of its stored lastProcessed and lastSeen tokens."""
    document = client[db]["_fw_checkpoints"].find_one({"_id": stream})
    assert document is not None, f"no checkpoint for {stream}"
    return Checkpoint.from_document(document).resume_token


def count_through(tokens: list[str], position: dict[str, Any] | None) -> int:
    """How many of ``tokens`` (one bucket's, in stream order) are at or before ``position``."""
    if position is None:
        return 0
    return sum(compare_tokens({"_data": token}, position) <= 0 for token in tokens)


class Truth:
    """The ground truth: every event of ``orders`` after it opened, in stream order, split into
    buckets by document."""

    def __init__(self, events: list[dict[str, Any]], bucket_of: dict[int, str]) -> None:
        self.events = events
        self.tokens = [event["_id"]["_data"] for event in events]
        self.index = {token: position for position, token in enumerate(self.tokens)}
        self.key = {event["_id"]["_data"]: event["documentKey"]["_id"] for event in events}
        self.buckets: dict[str, list[str]] = defaultdict(list)
        for token in self.tokens:
            self.buckets[bucket_of[self.key[token]]].append(token)
        self.bucket_index = {
            token: position for tokens in self.buckets.values() for position, token in enumerate(tokens)
        }


# -- 1. SIGKILL --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_of_a_partitioned_run_loses_nothing_and_repeats_only_each_buckets_unsaved_window(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    tmp_path: Path,
    needs_hashed_index_key: None,
) -> None:
    """`flowwarden run` of a class with partitions=3 is SIGKILLed four times while a writer
    inserts, updates and deletes, and started again each time. Every bucket's checkpoint, read
    after each kill, is never past an event its run did not handle (nothing lost), and at most
    save_every_n events before the last one it handled (the unsaved window); the next run of the
    bucket starts exactly there. So every event is delivered, those of the unsaved windows twice
    and no other, and each bucket's events (each document's, then) in stream order."""
    save_every_n = 10
    kills_wanted = 4
    names = bucket_names(3)
    log = tmp_path / "handled.log"
    orders = client[db_name]["orders"]
    rng = random.Random(20261124)
    env = {"FW_TEST_SAVE_EVERY_N": str(save_every_n), "FW_TEST_SAVE_INTERVAL": "0.3"}
    bucket_of = buckets_of(client, db_name, 3)

    child = Child(mongodb_uri, db_name, log, "Orders", **env)
    kills: list[int] = []  # the log's length when each killed run was gone
    stored: list[dict[str, Any]] = []  # each bucket's resume position after each kill
    try:
        checkpoints = client[db_name]["_fw_checkpoints"]
        # Every bucket stores its opening position before it handles anything: what is written
        # from now on is owed.
        wait_until(
            lambda: checkpoints.count_documents({"_id": {"$in": names}}) == 3,
            timeout=30,
            what="each bucket's opening position",
        )
        with orders.watch(max_await_time_ms=50) as truth_stream:
            with Writer(orders) as writer:
                for _ in range(kills_wanted):
                    since = len(log_lines(log))
                    # Soon after a start: the run is still catching up with what was written
                    # while no process ran, so the kill lands in the middle of its work.
                    handled_before_kill = rng.randrange(20, 120)
                    wait_until(
                        lambda since=since, n=handled_before_kill: len(log_lines(log)) - since >= n,
                        timeout=60,
                        what=f"the run to handle {handled_before_kill} events",
                    )
                    child.kill()
                    kills.append(len(log_lines(log)))
                    stored.append({name: resume_position(client, db_name, name) for name in names})
                    child = Child(mongodb_uri, db_name, log, "Orders", **env)
                since = len(log_lines(log))
                wait_until(lambda: len(log_lines(log)) - since >= 60, timeout=60, what="the last run")
            truth = Truth(read_events(truth_stream, writer.writes), bucket_of)
        # Each bucket handles its events in order: once the last run reached the last event of
        # every bucket, it is done (what it skipped, if anything, the checks below name).
        last = {tokens[-1] for tokens in truth.buckets.values()}
        wait_until(
            lambda: last <= {token for _, token in log_lines(log)[kills[-1] :]},
            timeout=60,
            what="the last run to reach every bucket's last event",
        )
    finally:
        code = child.stop()
    assert code == 0, child.log.finish()

    lines = [(stream, token) for stream, token in log_lines(log)]
    assert {token for _, token in lines} <= set(truth.tokens), "an event was handled that was never written"
    for stream, token in lines:
        key = truth.key[token]
        assert stream == bucket_of[key], f"an event of document {key} went to {stream}, not {bucket_of[key]}"
    runs = [lines[a:b] for a, b in zip([0, *kills], [*kills, len(lines)], strict=True)]

    duplicates = 0
    for name in names:
        tokens = truth.buckets[name]
        start = 0  # the first run started at the bucket's opening position, before every event
        for number, run in enumerate(runs):
            handled = [truth.bucket_index[token] for stream, token in run if stream == name]
            assert handled == list(range(start, start + len(handled))), (
                f"{name} in run {number} did not go on from its checkpoint in stream order: "
                f"expected from #{start}, got {handled[:12]}..."
            )
            end = start + len(handled)
            if number == len(runs) - 1:
                assert end == len(tokens), f"{name} ended at #{end} of {len(tokens)}"
                break
            at = count_through(tokens, stored[number][name])
            assert at <= end, (
                f"{name}'s checkpoint after kill {number} is past #{at}, but the killed run handled only "
                f"up to #{end}: a restart would lose {at - end} event(s)"
            )
            assert end - at <= save_every_n, (
                f"{name} repeats {end - at} events after kill {number}, more than save_every_n={save_every_n}"
            )
            duplicates += end - at
            start = at
        # After the graceful stop, the bucket's position covers every one of its events.
        assert count_through(tokens, resume_position(client, db_name, name)) == len(tokens)

    counts = Counter(token for _, token in lines)
    assert sum(count - 1 for count in counts.values()) == duplicates, "a duplicate outside an unsaved window"
    assert duplicates > 0, "no kill left a bucket with unsaved events: the unsaved window went untested"
    # Each document's events in stream order, in every run.
    for run in runs:
        per_document: dict[Any, list[int]] = defaultdict(list)
        for _, token in run:
            per_document[truth.key[token]].append(truth.index[token])
        for key, positions in per_document.items():
            assert positions == sorted(positions), f"document {key}'s events came out of order"


# -- 2. a bucket that fails --------------------------------------------------------------------------


def test_a_bucket_whose_handler_gives_up_stops_alone_before_its_event_and_a_fixed_restart_delivers_it(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, needs_hashed_index_key: None
) -> None:
    """retry policy STOP: the bucket of the failing document goes FAILED with a HandlerError in
    its own status entry, its checkpoint stays at its last event before the failed one; the other
    buckets go on handling and saving. Stopped, fixed and started again, the failed bucket goes
    on at the failed event and every event is delivered, each once."""
    poison = 17
    broken = threading.Event()
    broken.set()
    handled: list[tuple[str, str]] = []
    lock = threading.Lock()
    orders = client[db_name]["orders"]
    bucket_of = buckets_of(client, db_name, 3)
    failing = bucket_of[poison]
    others = [name for name in bucket_names(3) if name != failing]

    @change_stream("orders", db_name, name="orders", partitions=3, max_await_time_ms=50)
    @checkpoint(save_every_n=1)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted=OnError.STOP)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            assert event.document_key is not None
            if broken.is_set() and event.document_key["_id"] == poison:
                raise ValueError(f"cannot handle document {poison}")
            with lock:
                handled.append((ctx.stream, event.token["_data"]))

    def handled_tokens(stream: str | None = None) -> list[str]:
        with lock:
            return [token for s, token in handled if stream is None or s == stream]

    def write(step: int) -> int:
        """Insert every document (step 0) or update every one; how many events that makes."""
        if step == 0:
            for key in range(DOCUMENTS):
                orders.insert_one({"_id": key})
        else:
            for key in range(DOCUMENTS):
                orders.update_one({"_id": key}, {"$set": {"step": step}})
        return DOCUMENTS

    connector = Connector(mongodb_uri, [Orders])
    connector.start()
    try:
        with orders.watch(max_await_time_ms=50) as truth_stream:
            first = read_events(truth_stream, write(0) + write(1))
            wait_until(
                lambda: connector.status()[failing].state is StreamState.FAILED, what=f"{failing} to fail"
            )
            truth = Truth(first, bucket_of)
            poison_token = next(t for t in truth.buckets[failing] if truth.key[t] == poison)
            before = truth.buckets[failing][: truth.bucket_index[poison_token]]
            assert before, f"document {poison} is the first of {failing}: pick a later one"

            status = connector.status()
            assert status[failing].last_error is not None
            assert status[failing].last_error.startswith("HandlerError"), status[failing].last_error
            assert f"cannot handle document {poison}" in status[failing].last_error
            assert set(connector.stream_errors()) == {failing}
            assert isinstance(connector.stream_errors()[failing], HandlerError)
            for name in others:
                assert status[name].state is StreamState.RUNNING, f"{name} is {status[name].state.name}"
                assert status[name].last_error is None, status[name].last_error
            # The failed bucket handled exactly its events before the failed one, and stored the last.
            assert handled_tokens(failing) == before
            assert resume_position(client, db_name, failing) == {"_data": before[-1]}, (
                f"{failing}'s checkpoint is not at its last event before the failed one"
            )

            for name in others:
                wait_until(
                    lambda name=name: handled_tokens(name) == truth.buckets[name], what=f"{name} to go on"
                )
                last = {"_data": truth.buckets[name][-1]}
                wait_until(
                    lambda name=name, last=last: resume_position(client, db_name, name) == last,
                    what=f"{name}'s checkpoint to reach its last event",
                )
            # More writes: the other buckets keep handling and saving; the failed one stays put.
            second = Truth(first + read_events(truth_stream, write(2)), bucket_of)
            for name in others:
                wait_until(
                    lambda name=name: handled_tokens(name) == second.buckets[name], what=f"{name} to go on"
                )
                assert len(second.buckets[name]) > len(truth.buckets[name])
                wait_until(
                    lambda name=name: resume_position(client, db_name, name)
                    == {"_data": second.buckets[name][-1]},
                    what=f"{name}'s checkpoint to advance",
                )
            assert connector.status()[failing].state is StreamState.FAILED
            assert handled_tokens(failing) == before
            assert resume_position(client, db_name, failing) == {"_data": before[-1]}
    finally:
        connector.stop()

    first_run = len(handled_tokens())
    broken.clear()  # the fix
    connector = Connector(mongodb_uri, [Orders])
    connector.start()
    try:
        # The failed bucket handles in order: once it reached its last event, it is done.
        wait_until(
            lambda: second.buckets[failing][-1] in handled_tokens(failing), what=f"{failing} after the fix"
        )
        assert connector.stream_errors() == {}
        assert {s.state for s in connector.status().values()} == {StreamState.RUNNING}
    finally:
        connector.stop()
    # The failed bucket went on at the failed event; the others had nothing left to handle.
    with lock:
        again = handled[first_run:]
    assert [token for _, token in again] == second.buckets[failing][len(before) :]
    assert {stream for stream, _ in again} == {failing}
    assert Counter(handled_tokens()) == Counter(second.tokens), "an event was delivered twice or never"


# -- 3. the watched collection dropped ---------------------------------------------------------------


@pytest.mark.parametrize("on_invalidate", [OnInvalidate.STOP, OnInvalidate.RESTART])
def test_a_dropped_collection_invalidates_every_bucket(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    needs_hashed_index_key: None,
    on_invalidate: OnInvalidate,
) -> None:
    """The drop event has no document key and reaches one bucket; the invalidate that follows
    reaches every bucket, as its end: under STOP each bucket stops with a StreamInvalidatedError
    and its checkpoint at the invalidate; under RESTART each starts again after it and the
    documents written into the new collection are delivered by their buckets."""
    seen: list[tuple[str, str, Any, str]] = []  # (bucket, operation, document key, token)
    lock = threading.Lock()
    orders = client[db_name]["orders"]
    names = bucket_names(3)
    bucket_of = buckets_of(client, db_name, 3)

    @change_stream(
        "orders", db_name, name="orders", partitions=3, max_await_time_ms=50, on_invalidate=on_invalidate
    )
    @checkpoint(save_every_n=1)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent, ctx: StreamContext) -> None:
            key = event.document_key["_id"] if event.document_key else None
            with lock:
                seen.append((ctx.stream, event.operation_type, key, event.token["_data"]))

    def of(operation: str) -> list[tuple[str, Any, str]]:
        with lock:
            return [(stream, key, token) for stream, op, key, token in seen if op == operation]

    connector = Connector(mongodb_uri, [Orders])
    connector.start()
    try:
        with orders.watch(max_await_time_ms=50) as truth_stream:
            orders.insert_many([{"_id": key} for key in range(DOCUMENTS)])
            orders.drop()
            events = read_events(truth_stream, DOCUMENTS + 2)
        assert [e["operationType"] for e in events[-2:]] == ["drop", "invalidate"]
        invalidate = events[-1]["_id"]

        def settled() -> bool:
            status, invalidated = connector.status(), {stream for stream, _, _ in of("invalidate")}
            return all(name in invalidated or status[name].state is StreamState.STOPPED for name in names)

        wait_until(settled, what="every bucket to handle the invalidate or to end")
        ended = {name: (s.state.name, s.reason) for name, s in connector.status().items()}
        assert sorted(stream for stream, _, _ in of("invalidate")) == names, f"buckets ended so: {ended}"
        if on_invalidate is OnInvalidate.STOP:
            wait_until(
                lambda: all(s.state is StreamState.STOPPED for s in connector.status().values()),
                what="every bucket to stop",
            )
            errors = connector.stream_errors()
            assert sorted(errors) == names, f"buckets ended without the invalidation: {errors}"
            for error in errors.values():
                assert isinstance(error, StreamInvalidatedError)
            for name in names:
                assert resume_position(client, db_name, name) == invalidate
        else:
            orders.insert_many([{"_id": key, "again": True} for key in range(DOCUMENTS)])
            wait_until(lambda: len(of("insert")) == 2 * DOCUMENTS, what="the new collection's documents")
            assert connector.stream_errors() == {}
            assert {s.state for s in connector.status().values()} == {StreamState.RUNNING}
    finally:
        connector.stop()

    # Every bucket got its own invalidate, once; the drop went to one bucket; every insert
    # before the drop (and after it, under RESTART) to the document's bucket, once.
    assert sorted(stream for stream, _, _ in of("invalidate")) == names
    assert {token for _, _, token in of("invalidate")} == {invalidate["_data"]}
    assert len(of("drop")) == 1
    inserts = of("insert")
    rounds = 1 if on_invalidate is OnInvalidate.STOP else 2
    assert sorted(key for _, key, _ in inserts) == sorted(list(range(DOCUMENTS)) * rounds)
    assert len({token for _, _, token in inserts}) == len(inserts)
    for stream, key, _ in inserts:
        assert stream == bucket_of[key]
    with lock:
        for name in names:
            mine = [op for stream, op, _, _ in seen if stream == name]
            assert mine.count("invalidate") == 1
            if on_invalidate is OnInvalidate.STOP:
                assert mine[-1] == "invalidate", f"{name} handled {mine[-3:]} last"


# -- 4. dlq replay through a partitioned class -------------------------------------------------------


def test_dlq_replay_through_a_partitioned_class_replays_every_buckets_entries_through_their_methods(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    tmp_path: Path,
    needs_hashed_index_key: None,
) -> None:
    """Buckets dead-letter under their own stream names. `flowwarden dlq replay --handler
    partition_handlers:OrdersDlq` takes them: with `--stream` one bucket's entries, without it
    those of every bucket; each through the method for its operation, with ctx.stream naming the
    bucket that dead-lettered it, and each marked replayed."""
    fail_keys = [1, 4, 8, 13, 20, 26]
    log = tmp_path / "handled.log"
    replayed = tmp_path / "replayed.log"
    orders = client[db_name]["orders"]
    dlq = client[db_name]["_fw_dlq"]
    names = bucket_names(3)
    bucket_of = buckets_of(client, db_name, 3)
    assert len({bucket_of[key] for key in fail_keys}) >= 2, "the failing documents fall in one bucket"

    child = Child(mongodb_uri, db_name, log, "OrdersDlq", FW_TEST_FAIL_KEYS=",".join(map(str, fail_keys)))
    try:
        checkpoints = client[db_name]["_fw_checkpoints"]
        wait_until(
            lambda: checkpoints.count_documents({"_id": {"$in": names}}) == 3,
            timeout=30,
            what="each bucket's opening position",
        )
        orders.insert_many([{"_id": key} for key in range(DOCUMENTS)])
        orders.update_many({}, {"$set": {"paid": True}})
        orders.delete_many({"_id": {"$in": [*fail_keys, 2, 3]}})
        owed = 2 * DOCUMENTS + len(fail_keys) + 2
        dead = 3 * len(fail_keys)
        wait_until(
            lambda: dlq.count_documents({}) == dead and len(log_lines(log)) == owed - dead,
            timeout=30,
            what="every event handled or dead-lettered",
        )
    finally:
        code = child.stop()
    assert code == 0, child.log.finish()

    method = {"insert": "inserted", "update": "updated", "delete": "deleted"}
    entries = {entry["event"]["_id"]["_data"]: entry for entry in dlq.find()}
    for entry in entries.values():
        assert entry["stream"] == bucket_of[entry["event"]["documentKey"]["_id"]], entry["stream"]
    streams = sorted({entry["stream"] for entry in entries.values()})
    assert len(streams) >= 2

    def replay(*options: str) -> None:
        cli(
            mongodb_uri,
            "dlq",
            "replay",
            "--database",
            db_name,
            "--handler",
            "partition_handlers:OrdersDlq",
            *options,
            db=db_name,
            log=replayed,
        )

    def replayed_lines() -> set[tuple[str, str, str]]:
        return {(m, token, stream) for m, token, stream in log_lines(replayed)}

    def expected(stream: str | None = None) -> set[tuple[str, str, str]]:
        return {
            (method[entry["event"]["operationType"]], token, entry["stream"])
            for token, entry in entries.items()
            if stream is None or entry["stream"] == stream
        }

    # One bucket, named as its stream: only its entries.
    replay("--stream", streams[0])
    assert replayed_lines() == expected(streams[0])
    # The class: every bucket's entries not replayed yet, each once.
    replay("--not-replayed")
    assert replayed_lines() == expected()
    assert len(log_lines(replayed)) == len(entries)
    for entry in dlq.find():
        assert entry["replayCount"] == 1 and entry.get("replayedAt") is not None, entry["stream"]


# -- 5. changing the layout ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_documented_layout_change_from_two_buckets_to_three_misses_nothing(
    mongodb_uri: str,
    client: pymongo.MongoClient[Any],
    db_name: str,
    tmp_path: Path,
    needs_hashed_index_key: None,
) -> None:
    """docs/runtime.md's procedure, run as written while a writer keeps writing: stop the
    partitions=2 connector; find the oldest position its buckets stored (`checkpoints show`);
    create each of the three new buckets' checkpoints there (`checkpoints rewind --to-token
    --create`); delete the old ones (`checkpoints delete`); start with partitions=3. Every event
    after that position is delivered by the new buckets, each bucket from its first one on, in
    stream order; the events handled twice are only those the old layout handled after it."""
    log = tmp_path / "handled.log"
    orders = client[db_name]["orders"]
    old, new = bucket_names(2), bucket_names(3)
    checkpoints = client[db_name]["_fw_checkpoints"]
    env = {"FW_TEST_SAVE_EVERY_N": "10", "FW_TEST_SAVE_INTERVAL": "0.3"}
    new_bucket_of = buckets_of(client, db_name, 3)

    # The old layout's first bucket lags: at the stop the buckets stored different positions.
    child = Child(mongodb_uri, db_name, log, "LaggingOrders", FW_TEST_PARTITIONS="2", **env)
    try:
        wait_until(
            lambda: checkpoints.count_documents({"_id": {"$in": old}}) == 2,
            timeout=30,
            what="each old bucket's opening position",
        )
        with orders.watch(max_await_time_ms=50) as truth_stream:
            with Writer(orders) as writer:
                wait_until(lambda: len(log_lines(log)) >= 100, timeout=60, what="the old layout's events")
                code = child.stop()
                assert code == 0, child.log.finish()
                before_migration = len(log_lines(log))

                # The procedure, step by step, as docs/runtime.md words it.
                positions = []
                for name in old:
                    shown = json.loads(cli(mongodb_uri, "checkpoints", "show", name, "--database", db_name))
                    tokens = [shown[f] for f in ("lastProcessedToken", "lastSeenToken") if shown.get(f)]
                    positions.append(max(tokens, key=lambda t: t["_data"]))  # the later: where it resumes
                point = {"_data": min(positions, key=lambda t: t["_data"])["_data"]}  # the oldest
                for name in new:
                    cli(
                        mongodb_uri,
                        "checkpoints",
                        "rewind",
                        name,
                        "--database",
                        db_name,
                        "--to-token",
                        json_util.dumps(point),
                        "--create",
                    )
                for name in old:
                    cli(mongodb_uri, "checkpoints", "delete", name, "--database", db_name, "--yes")
                listed = cli(mongodb_uri, "checkpoints", "list", "--database", db_name)
                assert sorted(json.loads(line)["stream"] for line in listed.splitlines()) == new

                child = Child(mongodb_uri, db_name, log, "Orders", FW_TEST_PARTITIONS="3", **env)
                wait_until(
                    lambda: len(log_lines(log)) - before_migration >= 100,
                    timeout=60,
                    what="the new layout to handle events",
                )
            truth = Truth(read_events(truth_stream, writer.writes), new_bucket_of)
        after = {token for token in truth.tokens if compare_tokens({"_data": token}, point) > 0}
        assert after, "the migration point is after every event: nothing was tested"
        # Each new bucket handles its events in order: once it reached its last one, it is done.
        last = {tokens[-1] for tokens in truth.buckets.values()}
        wait_until(
            lambda: last <= {token for _, token in log_lines(log)[before_migration:]},
            timeout=60,
            what="the new layout to reach every bucket's last event",
        )
    finally:
        code = child.stop()
    assert code == 0, child.log.finish()

    lines = [(stream, token) for stream, token in log_lines(log)]
    old_run, new_run = lines[:before_migration], lines[before_migration:]
    assert {stream for stream, _ in old_run} == set(old) and {stream for stream, _ in new_run} == set(new)
    old_handled = {token for _, token in old_run}
    # Nothing lost: every event was handled by the old layout or by the new one.
    missed = [truth.index[token] for token in truth.tokens if token not in {t for _, t in lines}]
    assert not missed, f"{len(missed)} event(s) never handled, the first #{missed[0]} of {len(truth.tokens)}"
    # The old layout had handled every event up to the point (it was stopped gracefully), but
    # not every event up to the newest position it stored: the oldest one is the point to take.
    assert old_handled >= set(truth.tokens) - after
    newest = max(positions, key=lambda t: t["_data"])
    assert any(compare_tokens({"_data": t}, newest) <= 0 for t in after - old_handled), (
        "the old buckets were stopped at one position: the test does not tell the oldest from another"
    )
    # Each new bucket starts at its first event after the point and goes on in stream order.
    for name in new:
        mine = [token for token in truth.buckets[name] if token in after]
        handled = [token for stream, token in new_run if stream == name]
        assert handled == mine, f"{name} handled {len(handled)} events, not its {len(mine)} after the point"
    # Handled twice: only events after the point that the old layout had handled.
    counts = Counter(token for _, token in lines)
    assert all(count <= 2 for count in counts.values())
    assert {token for token, count in counts.items() if count > 1} == old_handled & after


# -- the invalidate's way through the bucket stage, in a copy ----------------------------------------


def test_a_partitioned_streams_initial_snapshot_copies_only_its_bucket() -> None:
    """The bucket stage lets the invalidate through; a copied document is never one, so the copy
    filter keeps only the bucket's hash condition (else every bucket would copy everything)."""
    from flowwarden.mongo.buckets import bucket_stage
    from flowwarden.mongo.initial_copy import copy_filter

    hashed = {"$mod": [{"$add": [{"$mod": [{"$toHashedIndexKey": "$_id"}, 4]}, 4]}, 4]}
    assert copy_filter([bucket_stage(1, 4)]) == {"$or": [{"$expr": {"$eq": [hashed, 1]}}]}
