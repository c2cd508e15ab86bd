"""A connector process whose batch method writes each batch under ``ctx.batch_id`` and can die
right after a write, before the checkpoint moves past the batch.

    python tests/runtime/batch_worker.py URI DATABASE OUTPUT KIND MAX_EVENTS MAX_WAIT KILL_AT SAVE_EVERY_N

KIND is ``batch`` (``@on_batch``) or ``dataframe`` (``@on_dataframe``). Each batch's document ids
go to OUTPUT/<batch_id>.json, replacing what an earlier run wrote under the same id (the
idempotent write the README recommends). With KILL_AT > 0 the process SIGKILLs itself right
after writing its KILL_AT-th batch. It prints "ready" when its connector is about to start, then
one line per batch written: its document ids as a JSON list. No heartbeat saves: the stored
position moves only as batches and the SAVE_EVERY_N count (0: none) move it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from bson import json_util

from flowwarden import Connector, StreamContext, change_stream, checkpoint, on_batch, on_dataframe


def main() -> int:
    uri, database, output, kind, max_events, max_wait, kill_at, save_every_n = sys.argv[1:9]
    out = Path(output)
    written: list[str] = []

    def write(batch_id: str, ids: list[Any]) -> None:
        part = out / f".{batch_id}.tmp"
        part.write_text(json.dumps(ids))
        os.replace(part, out / f"{batch_id}.json")
        print(json.dumps(ids), flush=True)
        written.append(batch_id)
        if len(written) == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    options: dict[str, Any] = {"max_events": int(max_events), "max_wait_seconds": float(max_wait)}
    spark = None
    if kind == "batch":

        class Method:
            @on_batch(**options)
            def handle(self, events: list[Any], ctx: StreamContext) -> None:
                assert ctx.batch_id is not None
                write(ctx.batch_id, [event.document_key["_id"] for event in events])

    else:
        from flowwarden.spark import get_or_create_session

        spark = get_or_create_session("local[1]", app_name="fw-batches", conf={"spark.ui.enabled": "false"})

        class Method:  # type: ignore[no-redef]
            @on_dataframe(**options)
            def handle(self, df: Any, ctx: StreamContext) -> None:
                assert ctx.batch_id is not None
                keys = [
                    json_util.loads(row.document_key)["_id"] for row in df.select("document_key").collect()
                ]
                write(ctx.batch_id, keys)

    Batches = change_stream("orders", database, name="orders", max_await_time_ms=50)(
        checkpoint(save_every_n=int(save_every_n), save_interval_seconds=3600)(Method)
    )
    print("ready", flush=True)
    Connector(uri, [Batches], spark=spark).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
