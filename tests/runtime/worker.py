"""A connector process for the crash and signal tests.

    python tests/runtime/worker.py URI DATABASE LOG_FILE SAVE_EVERY_N [single_leader INSTANCE]

Appends one line per handled event ("<instance> <_id>") to LOG_FILE, flushed at once, so the file
holds every handling that finished even when the process is killed with SIGKILL.
"""

from __future__ import annotations

import sys

from flowwarden import ChangeEvent, Connector, change_stream, checkpoint, on_change


def main() -> int:
    uri, database, log_path, save_every_n = sys.argv[1:5]
    deployment = sys.argv[5] if len(sys.argv) > 5 else "all_instances"
    instance = sys.argv[6] if len(sys.argv) > 6 else "w"
    log = open(log_path, "a", buffering=1)  # line-buffered: each write reaches the OS at once

    @change_stream(
        "orders", database, name="orders", max_await_time_ms=50, deployment=deployment, lease_ttl_seconds=2
    )
    @checkpoint(save_every_n=int(save_every_n), save_interval_seconds=0.5)
    class Worker:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            log.write(f"{instance} {event.document_key['_id']}\n")

    print("ready", flush=True)
    Connector(uri, [Worker], instance_id=instance).run()
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
