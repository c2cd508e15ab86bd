"""`flowwarden run` in a process of its own, its settings spread over flags, FLOWWARDEN_* variables
and a TOML file, each seen from outside the process: the instance id in the stored checkpoint, the
database the checkpoint lands in, the port /metrics answers on, the format of every log line, and
the time between progress lines; and the start-up line that states them.

Each case takes every setting from one source, and gives some of them in a second and third source
that must lose (a flag over a variable over the file). A losing metrics port is one held busy, so a
process that took it would stop at once; a losing checkpoint database must stay empty.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pymongo
import pytest

from flowwarden.cli.logs import TEXT_FORMAT
from flowwarden.cli.settings import load
from flowwarden.mongo.redaction import redact_uri

HANDLERS = """\
from flowwarden import change_stream, checkpoint, on_change, pipeline

# A stream over the whole deployment: its checkpoint goes to the checkpoint database.
@change_stream(name={stream!r}, max_await_time_ms=50)
@pipeline([{{"$match": {{"ns.db": {database!r}}}}}])
@checkpoint(save_every_n=1, save_interval_seconds=0.1)
class Watched:
    @on_change
    def handle(self, event):
        pass
"""
INTERVAL = 0.5
"""The progress interval each case sets; the default (30 s) or a losing source's (60 s) would show
no progress line before the test's deadline."""
LOSING_INTERVAL = 60
PROGRESS_LINES = 4
STARTUP = "flowwarden run with "
TEXT_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")
assert TEXT_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s", "TEXT_LINE reads this format"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on while the test runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@dataclass
class Places:
    """What a case's settings name: the database watched, the checkpoint database, the losing
    one, the stream, a free port and a busy one."""

    uri: str
    database: str
    checkpoints: str
    wrong_checkpoints: str
    stream: str
    port: int
    busy_port: int
    config: Path


@dataclass
class Case:
    """The flags, variables and TOML keys of one run, and what must come of them."""

    flags: list[str]
    env: dict[str, str]
    toml: dict[str, Any]
    instance_id: str
    log_format: str
    config_by_flag: bool = True


def flags_win(p: Places) -> Case:
    """Flags: instance id and progress interval; variables: checkpoint database and metrics port,
    and the URI; the file: log format, and an instance id, interval and port that lose."""
    return Case(
        flags=["--instance-id", "from-flag", "--progress-interval", str(INTERVAL)],
        env={
            "FLOWWARDEN_URI": p.uri,
            "FLOWWARDEN_INSTANCE_ID": "from-env",
            "FLOWWARDEN_CHECKPOINT_DATABASE": p.checkpoints,
            "FLOWWARDEN_METRICS_PORT": str(p.port),
        },
        toml={
            "instance_id": "from-file",
            "progress_interval": LOSING_INTERVAL,
            "metrics_port": p.busy_port,
            "checkpoint_database": p.wrong_checkpoints,
            "log_format": "json",
        },
        instance_id="from-flag",
        log_format="json",
    )


def environment_wins(p: Places) -> Case:
    """Flags: URI, metrics port, checkpoint database; variables (FLOWWARDEN_CONFIG names the
    file): instance id, progress interval, log format; the file: each of those, losing."""
    return Case(
        flags=["--uri", p.uri, "--metrics-port", str(p.port), "--checkpoint-database", p.checkpoints],
        env={
            "FLOWWARDEN_CONFIG": str(p.config),
            "FLOWWARDEN_INSTANCE_ID": "from-env",
            "FLOWWARDEN_PROGRESS_INTERVAL": str(INTERVAL),
            "FLOWWARDEN_LOG_FORMAT": "text",
        },
        toml={
            "instance_id": "from-file",
            "progress_interval": LOSING_INTERVAL,
            "log_format": "json",
            "metrics_port": p.busy_port,
            "checkpoint_database": p.wrong_checkpoints,
        },
        instance_id="from-env",
        log_format="text",
        config_by_flag=False,
    )


def file_alone(p: Places) -> Case:
    """Every setting from the file, the URI too."""
    return Case(
        flags=[],
        env={},
        toml={
            "uri": p.uri,
            "instance_id": "from-file",
            "progress_interval": INTERVAL,
            "metrics_port": p.port,
            "checkpoint_database": p.checkpoints,
            "log_format": "json",
        },
        instance_id="from-file",
        log_format="json",
    )


def toml(values: dict[str, Any]) -> str:
    return "".join(f"{name} = {json.dumps(value)}\n" for name, value in values.items())


def timestamp(line: str, log_format: str) -> float:
    if log_format == "json":
        return datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
    found = TEXT_LINE.match(line)
    assert found is not None, line
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def is_progress(line: str, stream: str) -> bool:
    """A progress line of ``stream`` (observability's "stream S: RUNNING, N events/s, ...")."""
    return f"stream {stream}: RUNNING, " in line and " events/s, " in line


def in_format(line: str, log_format: str) -> bool:
    if log_format == "text":
        return TEXT_LINE.match(line) is not None
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def message(line: str, log_format: str) -> str:
    return str(json.loads(line)["message"]) if log_format == "json" else line


def metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


@pytest.fixture
def places(
    mongodb_uri: str, client: pymongo.MongoClient[Any], db_name: str, busy_port: int, tmp_path: Path
) -> Iterator[Places]:
    found = Places(
        uri=mongodb_uri,
        database=db_name,
        checkpoints=f"{db_name}_ck",
        wrong_checkpoints=f"{db_name}_wrong",
        stream=f"chain_{db_name}",
        port=free_port(),
        busy_port=busy_port,
        config=tmp_path / "flowwarden.toml",
    )
    yield found
    client.drop_database(found.checkpoints)
    client.drop_database(found.wrong_checkpoints)
    client["flowwarden"]["_fw_checkpoints"].delete_one({"_id": found.stream})


@pytest.mark.parametrize("case", [flags_win, environment_wins, file_alone])
def test_run_takes_each_setting_from_its_source_and_shows_it_outside(
    tmp_path: Path, client: pymongo.MongoClient[Any], places: Places, case: Callable[[Places], Case]
) -> None:
    chain = case(places)
    (tmp_path / "handlers.py").write_text(HANDLERS.format(stream=places.stream, database=places.database))
    places.config.write_text(toml(chain.toml))
    config = ["--config", str(places.config)] if chain.config_by_flag else []
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLOWWARDEN_")}
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "flowwarden.cli", "run", "handlers:Watched", *config, *chain.flags],
            cwd=tmp_path,
            env={**environment, **chain.env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )

    def lines() -> list[str]:
        return [line for line in log.read_text().splitlines() if line.strip()]

    def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            assert child.poll() is None, f"flowwarden run exited {child.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}:\n{lines()}"
            time.sleep(0.05)
        return value

    checkpoints = client[places.checkpoints]["_fw_checkpoints"]
    try:
        wait_for(lambda: any(STARTUP in line for line in lines()), "the start-up line")
        wait_for(lambda: checkpoints.find_one({"_id": places.stream}), "the opening position")
        client[places.database]["orders"].insert_one({"_id": 1})
        saved = wait_for(
            lambda: checkpoints.find_one({"_id": places.stream, "eventsProcessed": 1}),
            "the checkpoint after the event",
        )
        # This process's metrics, on the port the settings name: the event counted for the stream.
        counted = re.compile(rf'^flowwarden_events_total\{{.*stream="{places.stream}".*\}} 1\.0$', re.M)
        wait_for(lambda: counted.search(metrics(places.port)), f"the event on /metrics at port {places.port}")
        wait_for(
            lambda: len([line for line in lines() if is_progress(line, places.stream)]) >= PROGRESS_LINES,
            f"{PROGRESS_LINES} progress lines",
        )
    finally:
        child.send_signal(signal.SIGTERM)
        code = child.wait(30)
    written = lines()
    assert code == 0, log.read_text()

    assert saved["instanceId"] == chain.instance_id, written
    # Only in the checkpoint database the settings name: not the default one, not the losing one.
    assert client["flowwarden"]["_fw_checkpoints"].find_one({"_id": places.stream}) is None
    assert places.wrong_checkpoints not in client.list_database_names()
    assert any(f"served on http://127.0.0.1:{places.port}" in line for line in written)

    assert [line for line in written if not in_format(line, chain.log_format)] == []
    progress = [
        timestamp(line, chain.log_format)
        for line in written
        if is_progress(message(line, chain.log_format), places.stream)
    ]
    # asyncio.sleep never wakes early: lines come at least INTERVAL apart (ms timestamps), and as
    # many as waited for came within the deadline, far under the 30 s default or the losing 60 s.
    gaps = [later - earlier for earlier, later in pairwise(progress)]
    assert len(gaps) >= PROGRESS_LINES - 1 and min(gaps) >= INTERVAL - 0.01, gaps

    # The start-up line states what was seen above, once.
    (startup,) = [message(line, chain.log_format) for line in written if STARTUP in line]
    stated = startup.split(STARTUP, 1)[1]
    assert stated == (
        f"instance_id={chain.instance_id}, checkpoint_database={places.checkpoints}, "
        f"metrics_port={places.port}, metrics_host=127.0.0.1, progress_interval={INTERVAL:g}, "
        f"server_selection_timeout=10, log_level=INFO, log_format={chain.log_format}, "
        "spark_master=local[*], spark_conf={}, spark_log=log, "
        f"uri={redact_uri(places.uri)}, "
        f"config={places.config}"
    )


def test_the_startup_line_hides_the_password_and_marks_a_generated_instance_id(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWWARDEN_URI", "mongodb://app:s3cret-pw@db1,db2/?replicaSet=rs0")
    stated = load({}).in_effect("fw-0123456789ab")
    assert "s3cret-pw" not in stated
    assert "uri=mongodb://app:***@db1,db2/?replicaSet=rs0" in stated
    assert stated.startswith("instance_id=fw-0123456789ab (generated), ")
    assert "metrics_port=off" in stated and "progress_interval=30," in stated
    assert stated.endswith("config=none")


def test_docs_cli_shows_the_startup_line_with_the_settings_it_states():
    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    (shown,) = [line for line in page.splitlines() if line.startswith(STARTUP)]
    stated = load({"uri": "mongodb://db1/"}).in_effect("orders-1")

    def names(line: str) -> list[str]:
        return [part.split("=", 1)[0] for part in line.removeprefix(STARTUP).split(", ")]

    assert names(shown) == names(stated)
