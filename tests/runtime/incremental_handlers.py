"""Handler classes for ``flowwarden run incremental_handlers:Orders`` (or ``:OrdersBatch``): a
stream of ``orders`` that logs every row it is handed, for a test to rebuild the collection from.

Configured by environment variables (the command line names only the class):

- ``FW_TEST_DB``: the database whose ``orders`` collection is watched;
- ``FW_TEST_LOG``: a file that gets one JSON line per handled row, flushed at once, so it holds
  every handling that finished even when the process is killed: ``[operationType, _id,
  document]`` in canonical Extended JSON (the document is null for a delete, and for an update
  whose document was gone by the time it was looked up);
- ``FW_TEST_SNAPSHOT_SECONDS`` (default 0.002): how long each copied row takes to handle, so
  that the copy lasts long enough for a test to kill the process while it runs;
- ``FW_TEST_CHUNK`` (default 250): ``snapshot_chunk_size``;
- ``FW_TEST_NO_WATERMARK`` = 1: the watermark rule is switched off in this process (a copied
  row whose document changed between the watermarks is handed over anyway), for a test to show
  that it then fails;
- ``FW_TEST_WINDOW_SECONDS`` (default 0): how long each chunk waits between its read and its high
  watermark, so that a writer surely changes some of its documents in between.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from bson import json_util

from flowwarden import ChangeEvent, change_stream, checkpoint, on_batch, on_change

_log = open(os.environ["FW_TEST_LOG"], "a", buffering=1)
_snapshot_seconds = float(os.environ.get("FW_TEST_SNAPSHOT_SECONDS", "0.002"))
_CHUNK = int(os.environ.get("FW_TEST_CHUNK", "250"))
_EJSON = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)

if os.environ.get("FW_TEST_NO_WATERMARK") == "1":
    from flowwarden.runtime.incremental import ChunkWindow

    def _never_drop(self: ChunkWindow, identity: Any) -> None:
        """Without the rule: no change drops a row."""

    ChunkWindow.drop = _never_drop  # type: ignore[method-assign]

_window_seconds = float(os.environ.get("FW_TEST_WINDOW_SECONDS", "0"))
if _window_seconds:
    from flowwarden.runtime.incremental import IncrementalSnapshot

    _write_watermark = IncrementalSnapshot._watermark

    async def _late_watermark(self: IncrementalSnapshot, session: Any, progress: Any) -> Any:
        """The chunk's window held open: the writer's changes land between read and watermark."""
        await asyncio.sleep(_window_seconds)
        return await _write_watermark(self, session, progress)

    IncrementalSnapshot._watermark = _late_watermark  # type: ignore[method-assign]


def _line(event: ChangeEvent) -> str:
    document = None if event.operation_type == "delete" else event.full_document
    return json_util.dumps([event.operation_type, event.document_key["_id"], document], json_options=_EJSON)


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    full_document="updateLookup",
    snapshot_chunk_size=_CHUNK,
    max_await_time_ms=50,
)
@checkpoint(save_every_n=50, save_interval_seconds=0.2)
class Orders:
    @on_change
    def changed(self, event: ChangeEvent) -> None:
        if event.operation_type == "snapshot":
            time.sleep(_snapshot_seconds)
        _log.write(_line(event) + "\n")


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    full_document="updateLookup",
    snapshot_chunk_size=_CHUNK,
    max_await_time_ms=50,
)
@checkpoint(save_every_n=50, save_interval_seconds=0.2)
class OrdersBatch:
    @on_batch(max_events=_CHUNK, max_wait_seconds=0.05)
    def changed(self, events: list[ChangeEvent]) -> None:
        rows = sum(1 for event in events if event.operation_type == "snapshot")
        time.sleep(_snapshot_seconds * rows)
        _log.write("".join(_line(event) + "\n" for event in events))


__all__ = ["Orders", "OrdersBatch"]
