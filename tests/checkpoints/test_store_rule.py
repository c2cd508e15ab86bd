"""One rule for the methods a checkpoint store needs, asked wherever a store comes in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flowwarden import Connector, change_stream, checkpoint, on_change
from flowwarden.checkpoints import CheckpointCommitter, InMemoryCheckpointStore
from flowwarden.checkpoints.store import STORE_METHODS, store_problem
from flowwarden.errors import ConfigurationError

URI = "mongodb://127.0.0.1:1/?replicaSet=rs0"


class NoBatchEndNoRewind:
    """A store written before ``save_batch_end`` existed, and without ``rewind``."""

    def load(self, stream_id: str) -> None: ...
    def save(self, checkpoint: Any) -> None: ...
    def save_seen(self, stream_id: str, token: Any, epoch: int) -> None: ...
    def delete(self, stream_id: str) -> bool: ...
    def list(self) -> list[Any]: ...


def handlers() -> type:
    @change_stream("orders", "shop", name="orders")
    class Orders:
        @on_change
        def handle(self, event: Any) -> None: ...

    return Orders


def decorated(store: Any) -> None:
    checkpoint(store=store)(handlers())


def connector(store: Any) -> None:
    Connector(URI, [handlers()], checkpoint_store=store)


async def committer(store: Any) -> None:
    made = CheckpointCommitter(store, "orders", save_every_n=1, save_interval_seconds=0)
    assert await made.close() is True


# Each entry: how a store comes in, the option it comes in by, and whose option that is.
ENTRY_POINTS: dict[str, tuple[Callable[[Any], Any], str, str]] = {
    "@checkpoint(store=...)": (decorated, "store", "handlers.<locals>.Orders"),
    "Connector(checkpoint_store=...)": (connector, "checkpoint_store", "Connector"),
    "CheckpointCommitter(store)": (committer, "store", "CheckpointCommitter('orders')"),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
async def test_a_store_lacking_methods_is_refused_where_it_comes_in_naming_them(entry: str) -> None:
    apply, option, owner = ENTRY_POINTS[entry]
    with pytest.raises(ConfigurationError) as refused:
        result = apply(NoBatchEndNoRewind())
        if result is not None:
            await result
    message = str(refused.value)
    assert (refused.value.owner, refused.value.option) == (owner, option)
    assert message.startswith(f"{owner}, option {option!r}: ")
    assert "NoBatchEndNoRewind is not a checkpoint store: it lacks save_batch_end, rewind" in message
    assert message.count("lacks") == 1


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
async def test_a_store_class_instead_of_an_instance_is_refused(entry: str) -> None:
    apply, _, _ = ENTRY_POINTS[entry]
    with pytest.raises(ConfigurationError, match=r"pass an instance, e.g. InMemoryCheckpointStore\(\.\.\.\)"):
        result = apply(InMemoryCheckpointStore)
        if result is not None:
            await result


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
async def test_a_whole_store_is_taken_at_every_entry(entry: str) -> None:
    apply, _, _ = ENTRY_POINTS[entry]
    result = apply(InMemoryCheckpointStore())
    if result is not None:
        await result


def test_the_rule_is_the_spi() -> None:
    assert STORE_METHODS == ("load", "save", "save_seen", "save_batch_end", "delete", "list", "rewind")
    assert store_problem(InMemoryCheckpointStore()) is None
    assert store_problem(object()) == (
        "object is not a checkpoint store: it lacks load, save, save_seen, save_batch_end, delete, list, "
        "rewind; a store has load, save, save_seen, save_batch_end, delete, list, rewind "
        "(flowwarden.checkpoints.CheckpointStore, or AsyncCheckpointStore with the same methods as "
        "coroutines)"
    )
