"""A connector process with ``snapshot=INITIAL`` that logs every row it hands to its methods.

    python tests/runtime/snapshot_worker.py URI DATABASE LOG CHUNK

Each row handled is appended to LOG as one Extended JSON line ``[operationType, documentKey._id,
fullDocument]`` before the method returns, so the log holds at least what the stored progress
says was handled. Snapshot rows are slowed a little (0.3 ms each) so that a test can kill the
process while the copy runs.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from bson import json_util

from flowwarden import ChangeEvent, Connector, Snapshot, change_stream, checkpoint, on_change, on_snapshot


def main() -> int:
    uri, database, log_path, chunk = sys.argv[1:5]
    log: IO[str] = open(log_path, "a", encoding="utf-8")  # open for the whole run

    def record(event: ChangeEvent) -> None:
        key = event.document_key
        row: list[Any] = [event.operation_type, key["_id"] if key else None, event.full_document]
        log.write(json_util.dumps(row) + "\n")
        log.flush()

    @change_stream(
        "orders",
        database,
        name="orders",
        full_document="updateLookup",
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=int(chunk),
        max_await_time_ms=50,
    )
    @checkpoint(save_every_n=20, save_interval_seconds=0.2)
    class Orders:
        @on_snapshot
        def copied(self, event: ChangeEvent) -> None:
            time.sleep(0.0003)
            record(event)

        @on_change
        def changed(self, event: ChangeEvent) -> None:
            record(event)

    print("ready", flush=True)
    Connector(uri, [Orders]).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
