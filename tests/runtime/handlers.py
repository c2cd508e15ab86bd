"""Handler classes built per test (each test has its own database)."""

from __future__ import annotations

from typing import Any

from flowwarden import ChangeEvent, change_stream, checkpoint, on_change


def recording_handler(
    database: str,
    *,
    name: str = "orders",
    collection: str | None = "orders",
    seen: list[Any] | None = None,
    stream: dict[str, Any] | None = None,
    **checkpoint_options: Any,
) -> tuple[type, list[Any]]:
    """A class recording (operationType, documentKey._id) of every event it handles."""
    record: list[Any] = [] if seen is None else seen
    checkpoint_options.setdefault("save_every_n", 1)
    checkpoint_options.setdefault("save_interval_seconds", 0.2)

    @change_stream(collection, database, name=name, max_await_time_ms=50, **(stream or {}))
    @checkpoint(**checkpoint_options)
    class Recorder:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            key = event.document_key
            record.append((event.operation_type, key["_id"] if key else None))

    return Recorder, record
