"""Type stub of the compiled converter (src/flowwarden/spark/convert/_native.c)."""

from typing import Any

def convert(
    events: list[Any],
    relaxed: bool,
    raw_type: type,
    raw_slot: object,
    plan: tuple[Any, ...] | None,
    threads: int,
    closed: bool = False,
    /,
) -> list[tuple[int, tuple[Any, ...], tuple[tuple[int, str], ...]]] | str | None:
    """The Arrow buffers of the change-event columns, one (rows, columns, left) per slice with
    the (index, reason) of each event left to Python; why, when every event is; or None when
    not every event is a raw_type instance. ``closed``: an event whose typed document has a key
    the plan does not name is left to Python."""

def pool() -> tuple[int, int]:
    """How many output blocks the pool keeps for reuse, and their size in bytes."""

def release_memory() -> int:
    """Frees every block the pool keeps; returns how many bytes."""
