"""/metrics, /healthz and /readyz of a running connector, scraped over HTTP and checked against
what was written."""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest
from prometheus_client import Counter

from flowwarden import (
    ChangeEvent,
    ConfigurationError,
    Connector,
    OnError,
    StreamState,
    change_stream,
    checkpoint,
    dead_letter_queue,
    on_change,
    on_insert,
    retry_policy,
)
from flowwarden.runtime import observability
from helpers import get, samples, value, wait_until

shipped = Counter("shop_orders_shipped", "Orders the handler shipped (a handler's own metric).")


def orders_handler(db: str, attempts: dict[int, int]) -> type:
    """Inserts are handled at once, except _id 3 (fails once, then works) and _id 4 (always fails,
    dead-lettered); an update goes to @on_change."""

    @change_stream("orders", db, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.2)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted=OnError.DEAD_LETTER)
    @dead_letter_queue(retention_days=1)
    class Orders:
        @on_insert
        def created(self, event: ChangeEvent) -> None:
            key = event.document_key["_id"]
            attempts[key] = attempts.get(key, 0) + 1
            if key == 4 or (key == 3 and attempts[key] == 1):
                raise ValueError(f"order {key} cannot be shipped yet")
            shipped.inc()

        @on_change
        def other(self, event: ChangeEvent) -> None: ...

    return Orders


def test_metrics_count_what_was_written(mongodb_uri, client, db_name):
    attempts: dict[int, int] = {}
    connector = Connector(mongodb_uri, [orders_handler(db_name, attempts)], metrics_port=0)
    connector.start()
    try:
        orders = client[db_name].orders
        orders.insert_many([{"_id": i} for i in range(6)])
        orders.update_one({"_id": 0}, {"$set": {"qty": 2}})
        wait_until(lambda: connector.status()["orders"].events_processed == 7, what="7 events")
        found = samples(connector)
        events = "flowwarden_events_total"
        assert value(found, events, stream="orders", operation="insert", outcome="ok") == 4
        assert value(found, events, stream="orders", operation="insert", outcome="retried") == 1
        assert value(found, events, stream="orders", operation="insert", outcome="dead_lettered") == 1
        assert value(found, events, stream="orders", operation="update", outcome="ok") == 1
        assert value(found, "flowwarden_dead_letters_total", stream="orders") == 1
        calls = value(found, "flowwarden_handler_duration_seconds_count", stream="orders")
        assert calls == 1 + 1 + 1 + 1 + 2 + 2 + 1  # _id 3 and 4 were called twice
        assert value(found, "flowwarden_checkpoint_saves_total", stream="orders") >= 7
        assert value(found, "flowwarden_checkpoint_save_failures_total", stream="orders") == 0
        assert value(found, "flowwarden_stream_state", stream="orders", state="RUNNING") == 1
        assert value(found, "flowwarden_stream_state", stream="orders", state="FAILED") == 0
        assert 0 <= value(found, "flowwarden_seconds_behind", stream="orders") < 60
        assert value(found, "flowwarden_restarts_total", stream="orders") == 0
        assert value(found, "flowwarden_lease_held", stream="orders") == 0
        assert value(found, "shop_orders_shipped_total") >= 5  # the handler's own metric, same endpoint
        status, body = get(connector, "/readyz")
        assert status == 200 and json.loads(body) == {"ready": True, "not_ready": {}}
        assert get(connector, "/healthz")[0] == 200
    finally:
        connector.stop()


def test_readyz_names_a_stream_that_is_not_running(mongodb_uri, client, db_name):
    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @retry_policy(max_attempts=1)
    class Failing:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            raise RuntimeError("broken")

    @change_stream("payments", db_name, name="payments", max_await_time_ms=50)
    class Fine:  # keeps the connector running after the other stream failed
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    connector = Connector(mongodb_uri, [Failing, Fine], metrics_port=0)
    connector.start()
    try:
        client[db_name].orders.insert_one({"_id": 1})
        wait_until(lambda: connector.status()["orders"].state == StreamState.FAILED, what="FAILED")
        status, body = get(connector, "/readyz")
        assert status == 503
        assert json.loads(body) == {"ready": False, "not_ready": {"orders": "FAILED"}}
        found = samples(connector)
        assert (
            value(found, "flowwarden_events_total", stream="orders", operation="insert", outcome="failed")
            == 1
        )
        assert value(found, "flowwarden_stream_state", stream="orders", state="FAILED") == 1
    finally:
        connector.stop()


def test_healthz_fails_while_a_handler_holds_the_event_loop(mongodb_uri, client, db_name, monkeypatch):
    monkeypatch.setattr(observability, "STALL_SECONDS", 1.0)
    release = threading.Event()
    entered = threading.Event()

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    class Hogging:
        @on_change
        def handle(self, event: ChangeEvent) -> None:
            entered.set()
            release.wait(30)  # a sync handler on the event loop: nothing else runs meanwhile

    connector = Connector(mongodb_uri, [Hogging], metrics_port=0)
    connector.start()
    try:
        assert get(connector, "/healthz")[0] == 200
        client[db_name].orders.insert_one({"_id": 1})
        assert entered.wait(10)
        wait_until(lambda: get(connector, "/healthz")[0] == 503, what="/healthz to fail")
        release.set()
        wait_until(lambda: get(connector, "/healthz")[0] == 200, what="/healthz to recover")
    finally:
        release.set()
        connector.stop()


def test_a_metrics_port_in_use_is_refused_at_start(mongodb_uri, db_name):
    @change_stream("orders", db_name, name="orders")
    class Quiet:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        connector = Connector(mongodb_uri, [Quiet], metrics_port=port)
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            connector.start()


def test_no_metrics_port_serves_nothing(mongodb_uri, db_name):
    @change_stream("orders", db_name, name="orders")
    class Quiet:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    connector = Connector(mongodb_uri, [Quiet])
    connector.start()
    try:
        assert connector.metrics_address is None
    finally:
        connector.stop()


def test_the_log_says_where_each_stream_opens_and_how_it_progresses(mongodb_uri, client, db_name, caplog):
    caplog.set_level(logging.INFO, logger="flowwarden")

    @change_stream("orders", db_name, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.2)
    class Orders:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    connector = Connector(mongodb_uri, [Orders], progress_interval=0.2)
    connector.start()
    client[db_name].orders.insert_many([{"_id": i} for i in range(3)])
    wait_until(lambda: connector.status()["orders"].events_processed == 3)
    wait_until(
        lambda: any("3 handled in all" in r.getMessage() for r in caplog.records), what="a progress line"
    )
    connector.stop()
    connector = Connector(mongodb_uri, [Orders], progress_interval=0)
    connector.start()
    connector.stop()
    opening = [
        r
        for r in caplog.records
        if "opening after" in r.getMessage() or "no stored position" in r.getMessage()
    ]
    assert "no stored position" in opening[0].getMessage()
    reopened = opening[1].getMessage()  # after the idle stream's newer lastSeen, or lastProcessed
    assert "opening after last" in reopened and "lastProcessed 2" in reopened
    assert all(getattr(r, "stream", None) == "orders" for r in opening)
    assert {r.name for r in opening} == {"flowwarden.runtime.opening"}


def test_outcomes_add_up_per_operation_whichever_way_they_were_counted() -> None:
    from flowwarden.runtime.metrics import StreamMetrics

    metrics = StreamMetrics()
    metrics.ok["insert"] = 2  # the dispatcher's hot path counts a plain success itself
    metrics.handled("insert", "ok")  # a batch's or a retried event's success
    metrics.handled("insert", "retried")
    metrics.handled("insert", "retried", 3)
    metrics.handled("delete", "failed")
    assert metrics.outcomes() == {("insert", "ok"): 3, ("insert", "retried"): 4, ("delete", "failed"): 1}


def test_a_histograms_buckets_are_cumulative_and_end_at_plus_inf_with_the_count() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import HistogramMetricFamily
    from prometheus_client.parser import text_string_to_metric_families

    from flowwarden.runtime.metrics import Buckets

    buckets = Buckets((0.1, 1.0))
    for seconds in (0.05, 0.5, 0.7, 5.0):
        buckets.observe(seconds)
    assert buckets.cumulative() == [("0.1", 1.0), ("1.0", 3.0), ("+Inf", 4.0)]

    class One:
        def collect(self):
            family = HistogramMetricFamily("h", "h", labels=[])
            family.add_metric([], buckets.cumulative(), buckets.total)
            yield family

    registry = CollectorRegistry()
    registry.register(One())
    (family,) = text_string_to_metric_families(generate_latest(registry).decode())
    counts = {s.labels["le"]: s.value for s in family.samples if s.name == "h_bucket"}
    (count,) = [s.value for s in family.samples if s.name == "h_count"]
    assert counts["+Inf"] == count == 4.0  # Prometheus reads the +Inf bucket as the count
