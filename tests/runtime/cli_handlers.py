"""A handler class for ``flowwarden run cli_handlers:Orders`` in the process tests.

Configured by environment variables (the command line names only the class):

- ``FW_TEST_DB``: the database whose ``orders`` collection is watched;
- ``FW_TEST_LOG``: a file that gets one line per handled event, ``<_id>``, flushed at once, so
  it holds every handling that finished even when the process is killed with SIGKILL;
- ``FW_TEST_LOG_EVENTS``: set, each line is ``<_id> <operationType> <resume token _data>``, which
  tells every event apart (the same document's updates included);
- ``FW_TEST_BLOCK_ON``: an ``_id`` whose handler never returns (a hung handler);
- ``FW_TEST_SAVE_EVERY_N`` (default 1000) and ``FW_TEST_SAVE_INTERVAL`` (default 60 seconds);
- ``FW_TEST_CONCURRENCY`` (default 1): above 1, the handler runs in worker threads;
- ``FW_TEST_LOG_SERVER_SELECTION``: set, the driver logs its server selections to stderr (a test
  waits for "Waiting for suitable server" to know the connector is waiting for a server).
"""

from __future__ import annotations

import logging
import os
import threading

from flowwarden import ChangeEvent, change_stream, checkpoint, on_change

_log = open(os.environ["FW_TEST_LOG"], "a", buffering=1)
_block_on = os.environ.get("FW_TEST_BLOCK_ON")
_log_events = bool(os.environ.get("FW_TEST_LOG_EVENTS"))
_never = threading.Event()
if os.environ.get("FW_TEST_LOG_SERVER_SELECTION"):
    logging.getLogger("pymongo.serverSelection").setLevel(logging.DEBUG)


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    max_await_time_ms=50,
    max_concurrency=int(os.environ.get("FW_TEST_CONCURRENCY", "1")),
)
@checkpoint(
    save_every_n=int(os.environ.get("FW_TEST_SAVE_EVERY_N", "1000")),
    save_interval_seconds=float(os.environ.get("FW_TEST_SAVE_INTERVAL", "60")),
)
class Orders:
    @on_change
    def handle(self, event: ChangeEvent) -> None:
        key = event.document_key["_id"]
        if _block_on is not None and str(key) == _block_on:
            _log.write("blocked\n")
            _never.wait()
        if _log_events:
            _log.write(f"{key} {event.operation_type} {event.token['_data']}\n")
        else:
            _log.write(f"{key}\n")
