"""What Spark's other processes import to run the streaming source.

Spark unpickles the data source in its planner process (which calls ``streamReader`` and plans
micro-batches) and the reader in each executor's Python worker (which reads and converts).
Neither checks option strings, so neither needs pydantic or the decorators' option models:
importing them costs each process of a query about a tenth of a second before its first
micro-batch.
"""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys
import textwrap

from flowwarden.spark.schema import change_event_struct_type
from flowwarden.spark.source.offsets import TokenOffset
from flowwarden.spark.source.reader import FlowWardenDataSource, TokenRange

OPTIONS = {
    "uri": "mongodb://127.0.0.1:1/?replicaSet=rs0",
    "database": "shop",
    "collection": "orders",
    "exclude_fields": "secret",
    "hash_fields": "email",
    "hash_salt_env": "FW_TEST_SALT",
    "max_events_per_trigger": "500",
}


def test_the_planner_and_the_executors_unpickle_the_source_without_pydantic(monkeypatch) -> None:
    monkeypatch.setenv("FW_TEST_SALT", "pepper")
    source = FlowWardenDataSource(OPTIONS)
    reader = source.streamReader(change_event_struct_type())
    partition = TokenRange(TokenOffset("8200000001"), TokenOffset("8200000002"), b"")
    carried = base64.b64encode(pickle.dumps((source, reader, partition))).decode()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import base64, pickle, sys
                source, reader, partition = pickle.loads(base64.b64decode({carried!r}))
                planner = source.streamReader(reader.schema)  # what the planner process runs
                planner.getDefaultReadLimit()
                import flowwarden.spark.convert.arrow  # what read() converts with
                print(sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "pydantic_core")))
                print(sorted(m for m in sys.modules if m.startswith(("flowwarden.config.base",
                      "flowwarden.spark.source.parsing"))))
                print(planner.options.hasher is not None, reader.options.exclude_fields)
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]", "True ('secret',)"]
