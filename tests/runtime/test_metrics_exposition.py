"""flowwarden.runtime.metrics on its own: histogram buckets, each family's samples for a stream's
counters and status, and the three HTTP endpoints, without a connector."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pytest
from prometheus_client.core import Metric

from flowwarden.checkpoints import SnapshotProgress
from flowwarden.checkpoints.contract import sample_token
from flowwarden.checkpoints.model import IncrementalProgress, IncrementalState
from flowwarden.runtime.metrics import Buckets, FlowwardenCollector, MetricsServer, StreamMetrics
from flowwarden.runtime.status import StreamState, StreamStatus

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Runner:
    """What the collector reads of a running stream."""

    name: str
    metrics: StreamMetrics | None
    holds_lease: bool = False
    state: StreamState = StreamState.RUNNING
    extra: dict[str, Any] = field(default_factory=dict)

    def status(self) -> StreamStatus:
        values: dict[str, Any] = {
            "name": self.name,
            "state": self.state,
            "last_processed_time": None,
            "last_seen_time": None,
            "lag_seconds": None,
            "events_processed": 0,
            "events_failed": 0,
            "restarts": 0,
            "last_error": None,
            "reason": None,
            **self.extra,
        }
        return StreamStatus(**values)


@dataclass(eq=False)
class FakeConnector:
    streams: list[Runner]
    oplog_window_hours: float | None = None

    def runners(self) -> list[Runner]:
        return self.streams


def collect(*connectors: FakeConnector) -> Iterator[Metric]:
    collector = FlowwardenCollector()
    for connector in connectors:
        collector.add(connector)
    return collector.collect()


def samples(*connectors: FakeConnector) -> Samples:
    found: Samples = {}
    for family in collect(*connectors):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def stream(name: str = "orders") -> tuple[tuple[str, str], ...]:
    return (("stream", name),)


# -- histograms ------------------------------------------------------------------------------------


def test_a_value_on_a_bound_counts_in_that_bounds_bucket_and_above_the_last_in_inf() -> None:
    buckets = Buckets((1.0, 10.0))
    for value in (0.5, 1.0, 10.0, 10.5):
        buckets.observe(value)
    assert buckets.cumulative() == [("1.0", 2.0), ("10.0", 3.0), ("+Inf", 4.0)]
    assert (buckets.count, buckets.total) == (4, 22.0)


def test_stream_metrics_count_each_outcome_and_each_save() -> None:
    metrics = StreamMetrics()
    metrics.handled("insert", "ok")
    metrics.handled("insert", "ok", 3)
    metrics.handled("insert", "retried", 2)
    metrics.handled("update", "dead_lettered")
    assert metrics.outcomes() == {
        ("insert", "ok"): 4,
        ("insert", "retried"): 2,
        ("update", "dead_lettered"): 1,
    }
    metrics.saved(0.002)
    metrics.saved(0.002)
    metrics.save_failed()
    assert (metrics.saves, metrics.save_failures, metrics.save_seconds.count) == (2, 1, 2)
    assert metrics.save_seconds.total == pytest.approx(0.004)


# -- the families ----------------------------------------------------------------------------------


def test_every_counter_and_histogram_of_a_stream_is_exposed_under_its_name() -> None:
    metrics = StreamMetrics()
    metrics.handled("insert", "ok", 5)
    metrics.handled("insert", "failed")
    metrics.handler_seconds.observe(0.002)
    metrics.batch_events.observe(50)
    metrics.saved(0.02)
    metrics.save_failed()
    metrics.dead_letters = 2
    found = samples(FakeConnector([Runner("orders", metrics, extra={"restarts": 3})]))
    orders = stream()
    assert found[("flowwarden_events_total", (("operation", "insert"), ("outcome", "ok"), *orders))] == 5
    assert found[("flowwarden_events_total", (("operation", "insert"), ("outcome", "failed"), *orders))] == 1
    assert found[("flowwarden_handler_duration_seconds_bucket", (("le", "0.001"), *orders))] == 0
    assert found[("flowwarden_handler_duration_seconds_bucket", (("le", "0.005"), *orders))] == 1
    assert found[("flowwarden_handler_duration_seconds_sum", orders)] == 0.002
    assert found[("flowwarden_handler_duration_seconds_count", orders)] == 1
    assert found[("flowwarden_batch_events_bucket", (("le", "10"), *orders))] == 0
    assert found[("flowwarden_batch_events_bucket", (("le", "100"), *orders))] == 1
    assert found[("flowwarden_batch_events_sum", orders)] == 50
    assert found[("flowwarden_checkpoint_saves_total", orders)] == 1
    assert found[("flowwarden_checkpoint_save_failures_total", orders)] == 1
    assert found[("flowwarden_checkpoint_save_duration_seconds_bucket", (("le", "0.01"), *orders))] == 0
    assert found[("flowwarden_checkpoint_save_duration_seconds_bucket", (("le", "0.05"), *orders))] == 1
    assert found[("flowwarden_checkpoint_save_duration_seconds_sum", orders)] == 0.02
    assert found[("flowwarden_dead_letters_total", orders)] == 2
    assert found[("flowwarden_restarts_total", orders)] == 3


def test_the_state_gauge_is_1_for_the_current_state_only_and_the_lease_follows_the_runner() -> None:
    found = samples(
        FakeConnector(
            [
                Runner("a", StreamMetrics(), holds_lease=True, state=StreamState.STANDBY),
                Runner("b", StreamMetrics()),
            ]
        )
    )
    states = {labels: value for (name, labels), value in found.items() if name == "flowwarden_stream_state"}
    assert states[(("state", "STANDBY"), *stream("a"))] == 1.0
    assert sum(value for labels, value in states.items() if ("stream", "a") in labels) == 1.0
    assert len([labels for labels in states if ("stream", "a") in labels]) == len(StreamState)
    assert states[(("state", "RUNNING"), *stream("b"))] == 1.0
    assert found[("flowwarden_lease_held", stream("a"))] == 1.0
    assert found[("flowwarden_lease_held", stream("b"))] == 0.0


def test_a_stream_without_metrics_is_left_out() -> None:
    found = samples(FakeConnector([Runner("quiet", None), Runner("orders", StreamMetrics())]))
    assert ("flowwarden_checkpoint_saves_total", stream("orders")) in found
    assert not [key for key in found if ("stream", "quiet") in key[1]]


def test_saves_failing_for_a_while_and_the_failures_in_a_row_are_gauges_of_the_status() -> None:
    since = datetime.fromtimestamp(time.time() - 100, timezone.utc)
    failing = Runner(
        "failing", StreamMetrics(), extra={"save_failures_in_row": 4, "cannot_save_since": since}
    )
    saving = Runner("saving", StreamMetrics())
    now = datetime.fromtimestamp(time.time(), timezone.utc)
    just_now = Runner("just_now", StreamMetrics(), extra={"cannot_save_since": now})
    before = time.time()
    found = samples(FakeConnector([failing, saving, just_now]))
    elapsed = time.time() - before
    assert found[("flowwarden_checkpoint_save_failures_in_row", stream("failing"))] == 4
    failing_for = found[("flowwarden_checkpoint_save_failing_seconds", stream("failing"))]
    assert 100 <= failing_for <= 100 + elapsed + 1
    assert found[("flowwarden_checkpoint_save_failing_seconds", stream("saving"))] == 0.0
    assert found[("flowwarden_checkpoint_save_failures_in_row", stream("saving"))] == 0
    assert 0.0 <= found[("flowwarden_checkpoint_save_failing_seconds", stream("just_now"))] < 1.0


def test_seconds_behind_are_now_minus_the_positions_times_and_never_negative() -> None:
    past = datetime.fromtimestamp(time.time() - 50, timezone.utc)
    future = datetime.fromtimestamp(time.time() + 50, timezone.utc)
    behind = Runner("behind", StreamMetrics(), extra={"last_processed_time": past, "last_seen_time": past})
    ahead = Runner("ahead", StreamMetrics(), extra={"last_processed_time": future, "last_seen_time": future})
    unknown = Runner("unknown", StreamMetrics())
    before = time.time()
    found = samples(FakeConnector([behind, ahead, unknown]))
    elapsed = time.time() - before
    for name in ("flowwarden_seconds_behind", "flowwarden_seen_seconds_behind"):
        assert 50 <= found[(name, stream("behind"))] <= 50 + elapsed + 1
        assert found[(name, stream("ahead"))] == 0.0
        assert (name, stream("unknown")) not in found


def test_snapshot_gauges_appear_once_a_snapshot_began_and_the_estimate_when_known() -> None:
    def progress(**fields: Any) -> SnapshotProgress:
        return SnapshotProgress(
            token=sample_token(1), namespaces=("shop.orders",), namespace="shop.orders", **fields
        )

    copying = Runner("copying", StreamMetrics(), extra={"snapshot": progress(copied=40, total=100)})
    done = Runner("done", StreamMetrics(), extra={"snapshot": progress(copied=7, done=True)})
    none = Runner("none", StreamMetrics())
    found = samples(FakeConnector([copying, done, none]))
    assert found[("flowwarden_snapshot_documents_copied", stream("copying"))] == 40
    assert found[("flowwarden_snapshot_documents_estimated", stream("copying"))] == 100
    assert found[("flowwarden_snapshot_done", stream("copying"))] == 0.0
    assert found[("flowwarden_snapshot_documents_copied", stream("done"))] == 7
    assert ("flowwarden_snapshot_documents_estimated", stream("done")) not in found
    assert found[("flowwarden_snapshot_done", stream("done"))] == 1.0
    assert not [k for k in found if k[0].startswith("flowwarden_snapshot") and ("stream", "none") in k[1]]


def test_the_requested_snapshot_gauges_follow_the_newest_copy_and_running_while_it_copies() -> None:
    def progress(**fields: Any) -> IncrementalProgress:
        return IncrementalProgress(
            request="r1", namespaces=("shop.orders",), namespace="shop.orders", **fields
        )

    copying = Runner(
        "copying", StreamMetrics(), extra={"incremental_snapshot": progress(copied=40, dropped=2, total=90)}
    )
    done = Runner(
        "done",
        StreamMetrics(),
        extra={"incremental_snapshot": progress(copied=7, state=IncrementalState.DONE)},
    )
    found = samples(FakeConnector([copying, done, Runner("none", StreamMetrics())]))
    copying_labels = (("request", "r1"), ("stream", "copying"))
    assert found[("flowwarden_snapshot_requested_documents_copied", copying_labels)] == 40
    assert found[("flowwarden_snapshot_requested_documents_dropped", copying_labels)] == 2
    assert found[("flowwarden_snapshot_requested_documents_estimated", copying_labels)] == 90
    assert found[("flowwarden_snapshot_requested_running", copying_labels)] == 1.0
    done_labels = (("request", "r1"), ("stream", "done"))
    assert found[("flowwarden_snapshot_requested_running", done_labels)] == 0.0
    assert ("flowwarden_snapshot_requested_documents_estimated", done_labels) not in found
    assert not [k for k in found if k[0].startswith("flowwarden_snapshot") and ("stream", "none") in k[1]]


def test_the_oplog_window_is_the_deployments_once_a_connector_read_it() -> None:
    found = samples(FakeConnector([], None), FakeConnector([], 30.0))
    assert found[("flowwarden_oplog_window_hours", ())] == 30.0
    assert ("flowwarden_oplog_window_hours", ()) not in samples(FakeConnector([], None))


def test_the_collector_describes_nothing_at_registration() -> None:
    assert list(FlowwardenCollector().describe()) == []


def test_a_discarded_connector_is_no_longer_collected() -> None:
    collector = FlowwardenCollector()
    connector = FakeConnector([Runner("orders", StreamMetrics())])
    collector.add(connector)
    collector.discard(connector)
    assert all(not family.samples for family in collector.collect())


# -- the endpoints ---------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, dict[str, Any]]]:
    answers: dict[str, Any] = {"alive": True, "not_ready": {}}
    served = MetricsServer(
        "127.0.0.1", 0, alive=lambda: answers["alive"], not_ready=lambda: answers["not_ready"]
    )
    try:
        yield served, answers
    finally:
        served.close()


def fetch(server: MetricsServer, path: str) -> tuple[int, str, str, bytes]:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        body = reply.read()
        assert reply.getheader("Content-Length") == str(len(body))
        return reply.status, reply.getheader("Content-Type") or "", body.decode(), body
    finally:
        connection.close()


def test_healthz_answers_whether_the_loop_turns(server: tuple[MetricsServer, dict[str, Any]]) -> None:
    served, answers = server
    assert fetch(served, "/healthz")[:3] == (200, "text/plain; charset=utf-8", "ok\n")
    answers["alive"] = False
    assert fetch(served, "/healthz?verbose=1")[:3] == (
        503,
        "text/plain; charset=utf-8",
        "the event loop is not turning\n",
    )


def test_readyz_names_the_streams_that_are_not_ready(server: tuple[MetricsServer, dict[str, Any]]) -> None:
    served, answers = server
    status, kind, _, body = fetch(served, "/readyz")
    assert (status, kind, json.loads(body)) == (200, "application/json", {"ready": True, "not_ready": {}})
    answers["not_ready"] = {"orders": "RESTARTING"}
    status, kind, _, body = fetch(served, "/readyz")
    assert (status, kind) == (503, "application/json")
    assert json.loads(body) == {"ready": False, "not_ready": {"orders": "RESTARTING"}}
    assert body.endswith(b"\n")


def test_metrics_serves_the_registry_and_anything_else_is_not_found(
    server: tuple[MetricsServer, dict[str, Any]],
) -> None:
    served, _ = server
    status, kind, text, _ = fetch(served, "/metrics")
    assert status == 200 and kind.startswith("text/plain; version=")
    assert "python_info" in text or "process_" in text or "# HELP" in text
    assert fetch(served, "/status")[:3] == (
        404,
        "text/plain; charset=utf-8",
        "not found: /metrics, /healthz and /readyz are served here\n",
    )


def test_the_server_listens_where_it_was_told_and_stops_on_close() -> None:
    served = MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=dict)
    port = served.port
    assert served.host == "127.0.0.1" and port > 0
    assert fetch(served, "/healthz")[0] == 200
    served.close()
    with pytest.raises(OSError):
        fetch(served, "/healthz")
