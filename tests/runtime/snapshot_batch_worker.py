"""A connector process with ``snapshot=INITIAL`` and one batch method that records every batch.

    python tests/runtime/snapshot_batch_worker.py URI DATABASE LOG KIND CHUNK MAX_EVENTS KILL_AT DELAY

KIND is ``batch`` (``@on_batch``) or ``dataframe`` (``@on_dataframe``). Each batch the method is
handed is appended to LOG as one Extended JSON line ``[batch_id, [[operationType, _id], ...]]``
before the method returns. With KILL_AT > 0 the process SIGKILLs itself right after recording
its KILL_AT-th snapshot batch: the method returned, the copy's progress past it was not saved.
Each snapshot batch takes DELAY seconds more, so a test's writer works while the copy runs.
Prints "ready" when its connector is about to start.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import IO, Any

from bson import json_util

from flowwarden import Connector, Snapshot, StreamContext, change_stream, checkpoint, on_batch, on_dataframe


def main() -> int:
    uri, database, log_path, kind, chunk, max_events, kill_at, delay = sys.argv[1:9]
    log: IO[str] = open(log_path, "a", encoding="utf-8")  # open for the whole run
    snapshot_batches = 0

    def record(batch_id: str | None, rows: list[list[Any]]) -> None:
        nonlocal snapshot_batches
        log.write(json_util.dumps([batch_id, rows]) + "\n")
        log.flush()
        if rows and rows[0][0] == "snapshot":
            time.sleep(float(delay))
            snapshot_batches += 1
            if snapshot_batches == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)

    options: dict[str, Any] = {"max_events": int(max_events), "max_wait_seconds": 0.05}
    spark = None
    if kind == "batch":

        class Method:
            @on_batch(**options)
            def handle(self, events: list[Any], ctx: StreamContext) -> None:
                record(ctx.batch_id, [[e.operation_type, e.document_key["_id"]] for e in events])

    else:
        from flowwarden.spark import get_or_create_session

        spark = get_or_create_session("local[1]", app_name="fw-snapshot", conf={"spark.ui.enabled": "false"})

        class Method:  # type: ignore[no-redef]
            @on_dataframe(**options)
            def handle(self, df: Any, ctx: StreamContext) -> None:
                rows = df.select("operation_type", "document_key").collect()
                record(
                    ctx.batch_id,
                    [[row.operation_type, json_util.loads(row.document_key)["_id"]] for row in rows],
                )

    Batches = change_stream(
        "orders",
        database,
        name="orders",
        snapshot=Snapshot.INITIAL,
        snapshot_chunk_size=int(chunk),
        max_await_time_ms=50,
    )(checkpoint(save_every_n=1, save_interval_seconds=0.2)(Method))
    print("ready", flush=True)
    Connector(uri, [Batches], spark=spark).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
