"""Property test of the committer: random completion orders, store failures and crash points.

Whatever happens, the stored checkpoint never passes a sequence whose handling had not finished,
never moves backwards, and after a clean close equals the contiguous frontier. After a crash, a
restart from the stored checkpoint redoes only events after it, and ends at the last event.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowwarden.checkpoints import Checkpoint, CheckpointCommitter, InMemoryCheckpointStore, SaveResult
from flowwarden.checkpoints.contract import sample_token
from flowwarden.errors import CheckpointError
from flowwarden.events import ResumeToken

STREAM = "orders"


def tok(event: int) -> dict[str, str]:
    return sample_token(1_600_000_000 + event, 1)


def event_of(token: ResumeToken | None) -> int:
    return 0 if token is None else int(token["_data"][2:10], 16) - 1_600_000_000


class CheckedStore(InMemoryCheckpointStore):
    """Fails the calls the scenario says, and checks every stored position as it is written."""

    def __init__(self, failing_calls: set[int], completed: set[int]) -> None:
        super().__init__()
        self.failing_calls = failing_calls
        self.completed = completed
        self.calls = 0
        # Kept apart from the exception: the committer counts a raising save as a failed save,
        # so a violation seen in the background must still fail the test at the end.
        self.violations: list[str] = []
        self.stored: list[int] = []

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        self.calls += 1
        if self.calls in self.failing_calls:
            raise CheckpointError(f"injected failure of call {self.calls}")
        event = event_of(checkpoint.last_processed_token)
        unfinished = [e for e in range(1, event + 1) if e not in self.completed]
        if unfinished:
            self.violations.append(f"saved event {event} while {unfinished} had not finished")
        result = super().save(checkpoint)
        if result is SaveResult.STORED:
            if self.stored and event <= self.stored[-1]:
                self.violations.append(f"the checkpoint moved back from {self.stored[-1]} to {event}")
            self.stored.append(event)
        assert not self.violations, self.violations
        return result

    def position(self) -> int:
        loaded = self.load(STREAM)
        return 0 if loaded is None else event_of(loaded.last_processed_token)


@dataclass
class Scenario:
    events: int
    order: list[int]  # the order handlers finish, as event numbers
    finished: int  # how many of them finish before the run ends
    duplicates: list[bool]  # re-commit an earlier completion after this one
    yields: list[bool]  # let the save task run after this completion
    failing_calls: set[int]
    save_every_n: int
    crash: bool
    restart_order_seed: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    events = draw(st.integers(1, 30))
    order = draw(st.permutations(range(1, events + 1)))
    return Scenario(
        events=events,
        order=list(order),
        finished=draw(st.integers(0, events)),
        duplicates=draw(st.lists(st.booleans(), min_size=events, max_size=events)),
        yields=draw(st.lists(st.booleans(), min_size=events, max_size=events)),
        failing_calls=draw(st.sets(st.integers(1, 40), max_size=15)),
        save_every_n=draw(st.sampled_from([0, 1, 2, 3, 7])),
        crash=draw(st.booleans()),
        restart_order_seed=draw(st.integers(0, 2**16)),
    )


def contiguous(completed: set[int]) -> int:
    frontier = 0
    while frontier + 1 in completed:
        frontier += 1
    return frontier


async def first_run(s: Scenario, store: CheckedStore, completed: set[int]) -> None:
    committer = CheckpointCommitter(
        store, STREAM, save_every_n=s.save_every_n, save_interval_seconds=0, max_consecutive_failures=1000
    )
    # The first run numbers events 1..n itself: sequence == event number.
    for index, event in enumerate(s.order[: s.finished]):
        completed.add(event)
        await committer.commit(event, tok(event))
        if s.duplicates[index]:
            await committer.commit(s.order[0], tok(s.order[0]))
        if s.yields[index]:
            for _ in range(5):
                await asyncio.sleep(0)
        assert committer.frontier_sequence == contiguous(completed)
        assert committer.pending == len(completed) - contiguous(completed)
    if not s.crash:
        store.failing_calls = set()
        assert await committer.close() is True
        assert store.position() == contiguous(completed)
    # A crash: return without close. asyncio.run then cancels the save task and closes the
    # loop, so nothing of this committer reaches the store any more, as when a process dies.


async def restart(s: Scenario, store: CheckedStore, completed: set[int]) -> None:
    """Resume from the stored checkpoint: every later event is delivered again, numbered from 1."""
    initial = store.load(STREAM)
    position = store.position()
    redo = list(range(position + 1, s.events + 1))
    shuffled = sorted(redo, key=lambda e: (e * 7919 + s.restart_order_seed) % 10007)
    completed.clear()
    completed.update(range(1, position + 1))
    committer = CheckpointCommitter(
        store, STREAM, save_every_n=s.save_every_n, save_interval_seconds=0, initial=initial
    )
    for event in shuffled:
        completed.add(event)
        await committer.commit(event - position, tok(event))
    assert await committer.close() is True
    final = store.load(STREAM)
    assert final is not None
    assert event_of(final.last_processed_token) == s.events
    assert final.events_processed == s.events


def run_scenario(s: Scenario) -> None:
    completed: set[int] = set()
    store = CheckedStore(s.failing_calls, completed)
    asyncio.run(first_run(s, store, completed))
    if s.crash:
        assert store.position() <= contiguous(completed)
        store.failing_calls = set()
        asyncio.run(restart(s, store, completed))
    assert not store.violations, store.violations


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_stored_checkpoint_is_always_safe(scenario: Scenario) -> None:
    run_scenario(scenario)
