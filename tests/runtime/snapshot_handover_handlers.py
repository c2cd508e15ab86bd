"""A ``snapshot=INITIAL`` handler class for ``flowwarden run snapshot_handover_handlers:Orders``,
which can SIGKILL its own process at a chosen point of the hand-over from the copy to the changes.

Configured by environment variables (the command line names only the class):

- ``FW_TEST_DB``: the database whose ``orders`` collection is copied, then watched;
- ``FW_TEST_LOG``: a file that gets one JSON line per handled row, flushed at once, so it holds
  every handling that finished even when the process is killed: ``["snapshot", _id]`` for a
  copied document, ``["change", operationType, _id, token _data]`` for a change;
- ``FW_TEST_KILL_AT``: ``done`` kills the process when the stream logs that its copy is done (the
  progress is saved with ``done``, the change stream is not open yet); ``change:N`` kills it as its
  N-th change's handler is entered, before that change is recorded (N-1 changes were handled);
- ``FW_TEST_SNAPSHOT_SECONDS`` (default 0.002): how long each copied document takes to handle,
  so that a test's writer works while the copy runs;
- ``FW_TEST_CHUNK`` (default 100): ``snapshot_chunk_size``.

Saves every event (``save_every_n=1``), so a kill after a few changes finds them saved.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

from flowwarden import ChangeEvent, Snapshot, change_stream, checkpoint, on_change, on_snapshot

_log = open(os.environ["FW_TEST_LOG"], "a", buffering=1)
_kill_at = os.environ.get("FW_TEST_KILL_AT", "")
_snapshot_seconds = float(os.environ.get("FW_TEST_SNAPSHOT_SECONDS", "0.002"))
_changes = 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillWhenCopied(logging.Handler):
    """SIGKILLs the process on the record the stream logs once the copy's end was saved: the
    moment between the copy and the change stream's open."""

    def emit(self, record: logging.LogRecord) -> None:
        if "initial snapshot done" in record.getMessage():
            _die()


if _kill_at == "done":
    logging.getLogger("flowwarden").addHandler(_KillWhenCopied())


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    snapshot=Snapshot.INITIAL,
    snapshot_chunk_size=int(os.environ.get("FW_TEST_CHUNK", "100")),
    max_await_time_ms=50,
)
@checkpoint(save_every_n=1, save_interval_seconds=0.1)
class Orders:
    @on_snapshot
    def copied(self, event: ChangeEvent) -> None:
        time.sleep(_snapshot_seconds)
        _log.write(json.dumps(["snapshot", event.document_key["_id"]]) + "\n")

    @on_change
    def changed(self, event: ChangeEvent) -> None:
        global _changes
        _changes += 1
        if _kill_at == f"change:{_changes}":
            _die()
        key = event.document_key["_id"]
        _log.write(json.dumps(["change", event.operation_type, key, event.token["_data"]]) + "\n")
