"""A connector process with an @on_dataframe method that dies right after writing one batch.

    python tests/spark/dataframe_worker.py URI DATABASE OUTPUT CRASH_MARKER START_SECONDS

Reads from the cluster time START_SECONDS and writes each batch to OUTPUT/batch=<ctx.batch_id>
with mode "overwrite". On its second batch, if CRASH_MARKER does not exist yet, it creates it and
SIGKILLs itself after the write and before the checkpoint save: the at-least-once window, on
purpose.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from bson import Timestamp

from flowwarden import Connector, StartPosition, StreamContext, change_stream, checkpoint, on_dataframe
from flowwarden.spark import get_or_create_session


def main() -> int:
    uri, database, output, marker, start = sys.argv[1:6]
    written = []

    @change_stream("orders", database, name="orders", max_await_time_ms=100)
    @checkpoint(
        save_every_n=1,
        save_interval_seconds=0.5,
        start_position=StartPosition.AT_TIME,
        start_at=Timestamp(int(start), 0),
    )
    class Writer:
        @on_dataframe(max_events=100, max_wait_seconds=1)
        def write(self, df: Any, ctx: StreamContext) -> None:
            df.write.mode("overwrite").parquet(f"{output}/batch={ctx.batch_id}")
            written.append(ctx.batch_id)
            if len(written) == 2 and not os.path.exists(marker):
                Path(marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)

    spark = get_or_create_session("local[1]", app_name="fw-crash", conf={"spark.ui.enabled": "false"})
    Connector(uri, [Writer], spark=spark).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
