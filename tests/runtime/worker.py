"""A connector process for the crash and signal tests.

    python tests/runtime/worker.py URI DATABASE LOG_FILE SAVE_EVERY_N
        [--single-leader INSTANCE] [--instance-id ID] [--handle-seconds SECONDS] [--states STATE_FILE]
        [--keep-even FILTER_LOG]

Appends one line per handled event ("<instance> <_id>") to LOG_FILE, flushed at once, so the file
holds every handling that finished even when the process is killed with SIGKILL.

``--single-leader``: run the stream with a lease, as instance INSTANCE (default: every instance
runs it, as "w"). ``--instance-id``: configure the connector with ID instead (the log lines still
name INSTANCE), so that two processes can share one id. ``--handle-seconds``: each event takes
that long to handle, so that a test can kill the process while it is in the middle of what was
written. ``--states``: append the stream's
state to STATE_FILE each time it changes (RUNNING, STANDBY, ...), so a test can wait for it.
``--keep-even``: an ``@event_filter`` keeps the events of even ``_id`` only, and appends a line
"<_id> <token _data>" to FILTER_LOG for each event it is asked about.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import TextIO

from flowwarden import ChangeEvent, Connector, change_stream, checkpoint, event_filter, on_change


def report_states(connector: Connector, out: TextIO) -> None:
    """Write the stream's state to ``out`` whenever it changes (a daemon thread)."""
    last = None
    while True:
        state = connector.status()["orders"].state.value
        if state != last:
            out.write(f"{state}\n")
            last = state
        time.sleep(0.01)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("database")
    parser.add_argument("log")
    parser.add_argument("save_every_n", type=int)
    parser.add_argument("--single-leader", metavar="INSTANCE")
    parser.add_argument("--instance-id")
    parser.add_argument("--handle-seconds", type=float, default=0.0)
    parser.add_argument("--states")
    parser.add_argument("--keep-even", metavar="FILTER_LOG")
    args = parser.parse_args()
    instance = args.single_leader or "w"
    handle_seconds = args.handle_seconds
    log = open(args.log, "a", buffering=1)  # line-buffered: each write reaches the OS at once
    asked = open(args.keep_even, "a", buffering=1) if args.keep_even else None

    @change_stream(
        "orders",
        args.database,
        name="orders",
        max_await_time_ms=50,
        deployment="single_leader" if args.single_leader else "all_instances",
        lease_ttl_seconds=2,
    )
    @checkpoint(save_every_n=args.save_every_n, save_interval_seconds=0.5)
    class Worker:
        if asked is not None:

            @event_filter
            def keep(self, event: ChangeEvent) -> bool:
                key = event.document_key["_id"]
                asked.write(f"{key} {event.token['_data']}\n")
                return key % 2 == 0

        @on_change
        def handle(self, event: ChangeEvent) -> None:
            if handle_seconds:
                time.sleep(handle_seconds)
            log.write(f"{instance} {event.document_key['_id']}\n")

    connector = Connector(args.uri, [Worker], instance_id=args.instance_id or instance)
    if args.states:
        states = open(args.states, "a", buffering=1)
        threading.Thread(target=report_states, args=(connector, states), daemon=True).start()
    print("ready", flush=True)
    connector.run()
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
