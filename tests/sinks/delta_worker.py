"""A connector process writing its batches into a Delta table with DeltaSink, which can die
right after a write, before the checkpoint moves past the batch.

    python tests/sinks/delta_worker.py URI DATABASE TABLE KIND KILL_AT

KIND is ``batch`` (``@on_batch``, events to Arrow with an inferred schema, no Spark) or
``dataframe`` (``@on_dataframe(schema="infer")``). With KILL_AT > 0 the process SIGKILLs itself
right after its KILL_AT-th committed write. It prints "ready" when its connector is about to
start, then one line per write: the batch id and whether a commit was made.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from flowwarden import Connector, StreamContext, change_stream, checkpoint, on_batch, on_dataframe
from flowwarden.sinks import DeltaSink

# The schema is inferred again at each start; a table keeps its column types, so the one field
# whose sampled type changes between runs (qty meets a string) is pinned.
HINTS = "qty BIGINT"


def main() -> int:
    uri, database, table, kind, kill_at = sys.argv[1:6]
    sink = DeltaSink(table)
    commits = 0

    def write(batch: Any, ctx: StreamContext) -> None:
        nonlocal commits
        committed = sink.write(batch, ctx)
        print(f"{ctx.batch_id} {committed}", flush=True)
        commits += committed
        if committed and commits == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    spark = None
    if kind == "batch":
        from flowwarden.spark import events_to_arrow
        from flowwarden.spark.infer import infer_document_spec

        schema = infer_document_spec(uri, database, "orders", hints=HINTS)

        class Method:
            @on_batch(max_events=4, max_wait_seconds=0.3)
            def handle(self, events: list[Any], ctx: StreamContext) -> None:
                write(events_to_arrow(events, schema=schema, rescued_data=True).table, ctx)

    else:
        from flowwarden.spark import get_or_create_session

        spark = get_or_create_session("local[1]", app_name="fw-delta", conf={"spark.ui.enabled": "false"})

        class Method:  # type: ignore[no-redef]
            @on_dataframe(max_events=4, max_wait_seconds=0.3, schema="infer", schema_hints=HINTS)
            def handle(self, df: Any, ctx: StreamContext) -> None:
                write(df, ctx)

    Orders = change_stream(
        "orders", database, name="orders", full_document="updateLookup", max_await_time_ms=50
    )(checkpoint(save_every_n=0, save_interval_seconds=3600)(Method))
    print("ready", flush=True)
    Connector(uri, [Orders], spark=spark).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
