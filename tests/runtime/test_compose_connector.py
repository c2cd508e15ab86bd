"""docker-compose.yml's ``connector`` service, run as a process here: its command and environment
(the URI in FLOWWARDEN_URI only), its healthcheck on /readyz, and /metrics scraped and checked
against the changes written. Docker is not needed: the command runs as the image would run it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from helpers import wait_until

from .conftest import ChildLog

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PORT = "9464"


def _service() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service: dict[str, Any] = compose["services"]["connector"]
    return service


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_compose_file_publishes_on_the_hosts_loopback_only() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


@pytest.fixture
def connector_service(mongodb_uri: str, db_name: str):
    """The service's command with its port swapped for a free one, in the image's working folder
    (the examples), with the service's environment and this run's MongoDB in FLOWWARDEN_URI."""
    service = _service()
    port = _free_port()
    command = [port if arg == COMPOSE_PORT else arg for arg in service["command"]]
    assert "--uri" not in command, "the compose service passes the URI in the environment"
    environment = {**service["environment"], "FLOWWARDEN_URI": mongodb_uri, "ORDERS_DATABASE": db_name}
    child = subprocess.Popen(
        [sys.executable, "-m", "flowwarden.cli", *command],
        cwd=ROOT / "examples",
        env={**_inherited(), **environment},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = ChildLog(child.stderr)
    healthcheck = [arg.replace(COMPOSE_PORT, port) for arg in service["healthcheck"]["test"][1:]]
    healthcheck[0] = sys.executable if healthcheck[0] == "python" else healthcheck[0]
    try:
        yield child, log, port, healthcheck
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def _inherited() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("FLOWWARDEN_")}


def test_the_connector_service_runs_with_the_uri_in_the_environment_and_reports_what_it_did(
    connector_service, client, db_name
) -> None:
    child, log, port, healthcheck = connector_service
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert child.poll() is None, log.text()
        return subprocess.run(healthcheck, capture_output=True, timeout=10).returncode == 0

    wait_until(healthy, timeout=60, what="the service's healthcheck to pass")
    status, body = _get(f"{base}/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True, "not_ready": {}})
    assert _get(f"{base}/healthz")[0] == 200

    orders, view = client[db_name].orders, client[db_name].orders_view
    orders.insert_many([{"_id": i, "status": "new", "amount": i} for i in range(30)])
    for i in range(10):
        orders.update_one({"_id": i}, {"$set": {"status": "paid"}})
    orders.delete_many({"_id": {"$gte": 25}})
    wait_until(lambda: view.count_documents({"deleted": True}) == 5, what="the view to catch up")
    assert view.count_documents({"status": "paid"}) == 10 and view.count_documents({}) == 30

    def stream(**labels: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"stream": "OrdersView", **labels}.items()))

    def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text = _get(f"{base}/metrics")
        assert status == 200
        return _samples(text.decode())

    deletes = ("flowwarden_events_total", stream(operation="delete", outcome="ok"))
    samples = wait_until(lambda: (now := scraped()).get(deletes) == 5 and now, what="the deletes counted")
    assert samples[("flowwarden_events_total", stream(operation="insert", outcome="ok"))] == 30
    assert samples[("flowwarden_events_total", stream(operation="update", outcome="ok"))] == 10
    assert samples[("flowwarden_handler_duration_seconds_count", stream())] == 45
    assert samples[("flowwarden_stream_state", stream(state="RUNNING"))] == 1
    assert samples[("flowwarden_stream_state", stream(state="FAILED"))] == 0
    assert samples[("flowwarden_restarts_total", stream())] == 0
    assert 0 <= samples[("flowwarden_seconds_behind", stream())] < 60
    saves = wait_until(
        lambda: scraped().get(("flowwarden_checkpoint_saves_total", stream())), what="a checkpoint save"
    )
    assert saves >= 1

    child.send_signal(signal.SIGTERM)  # what `docker compose stop` sends
    assert child.wait(timeout=30) == 0
    lines = [json.loads(line) for line in log.finish().splitlines() if line.strip()]
    opened = [line for line in lines if line.get("stream") == "OrdersView" and "opened" in line["message"]]
    assert opened, lines
    checkpoint = client[db_name]["_fw_checkpoints"].find_one({"_id": "OrdersView"})
    assert checkpoint["eventsProcessed"] == 45
