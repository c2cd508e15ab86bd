"""The flowwarden command: checkpoints list/rewind/delete, the demo's Spark-less path, and how every
failure ends: one ``flowwarden:`` line on stderr, no traceback, the documented exit code."""

from __future__ import annotations

import importlib
import json
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import bson
import pymongo
import pytest
from bson.codec_options import DatetimeConversion
from pymongo.errors import OperationFailure

from flowwarden import cli
from flowwarden.checkpoints import Checkpoint, MongoCheckpointStore
from flowwarden.checkpoints.contract import sample_token
from flowwarden.cli import ExitCode, local, main
from flowwarden.cli.common import mongo_client
from flowwarden.cli.demo import run_demo
from flowwarden.errors import CheckpointError
from helpers import flowwarden_command as flowwarden
from helpers import one_error_line

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# -- checkpoints ----------------------------------------------------------------------------------


def test_checkpoints_list_rewind_delete(capsys, mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=sample_token(1_800_000_000, 5)))
    common = ["--uri", mongodb_uri, "--database", db_name]

    assert main(["checkpoints", "list", *common]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    listed = json.loads(line)
    assert listed["stream"] == "orders" and listed["lastProcessedTimestamp"].startswith("2027-01-15")

    earlier = sample_token(1_700_000_000, 1)
    assert main(["checkpoints", "rewind", "orders", *common, "--to-token", json.dumps(earlier)]) == 0
    assert store.load("orders").last_processed_token == earlier

    assert main(["checkpoints", "delete", "orders", *common, "--yes"]) == 0
    assert store.load("orders") is None


def test_rewind_refuses_a_value_that_is_not_a_token(capsys, mongodb_uri, db_name):
    args = ["checkpoints", "rewind", "orders", "--uri", mongodb_uri, "--database", db_name]
    assert main([*args, "--to-token", '{"ts": 1}']) == ExitCode.USAGE
    assert "resume token" in one_error_line(capsys.readouterr().err)


def test_rewind_with_invalid_json_says_so(capsys, mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=sample_token(1_800_000_000, 5)))
    args = ["checkpoints", "rewind", "orders", "--uri", mongodb_uri, "--database", db_name]

    assert main([*args, "--to-token", "{bad"]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("flowwarden: --to-token is not valid JSON") and '{"_data"' in line
    assert store.load("orders").last_processed_token == sample_token(1_800_000_000, 5)


def test_list_shows_every_readable_checkpoint_and_marks_the_unreadable(capsys, mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    for name in ("a-orders", "z-orders"):
        store.save(Checkpoint(stream_id=name, last_processed_token=sample_token(1_800_000_000, 5)))
    store.collection.insert_one({"_id": "m-wrong-type", "epoch": "seven"})
    # A date no Python datetime can hold: the driver cannot decode the document at all.
    odd_dates = pymongo.MongoClient(mongodb_uri, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
    with odd_dates:
        odd_dates[db_name]["_fw_checkpoints"].insert_one(
            {"_id": "n-undecodable", "updatedAt": bson.DatetimeMS(2**62)}
        )

    code = main(["checkpoints", "list", "--uri", mongodb_uri, "--database", db_name])

    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["stream"] for line in lines] == ["a-orders", "m-wrong-type", "n-undecodable", "z-orders"]
    assert "unreadable" not in lines[0] and lines[0]["eventsProcessed"] == 0
    assert "epoch must be an integer" in lines[1]["unreadable"]
    assert "cannot be decoded" in lines[2]["unreadable"]
    assert "unreadable" not in lines[3]
    assert code == ExitCode.FAILED
    assert "2 checkpoint document(s)" in one_error_line(err)


@pytest.mark.parametrize("action", [["list"], ["rewind", "orders", "--to-start"], ["delete", "orders"]])
def test_an_unreachable_deployment_exits_3_without_the_password(capsys, closed_port, action):
    uri = f"mongodb://app:hunter2@127.0.0.1:{closed_port}/?serverSelectionTimeoutMS=200"

    assert main(["checkpoints", *action, "--uri", uri, "--database", "shop"]) == ExitCode.MONGODB_UNAVAILABLE

    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("flowwarden: cannot reach MongoDB at mongodb://app:***@127.0.0.1")
    assert "hunter2" not in line and "Topology Description" not in line


def test_refused_credentials_exit_3(capsys, monkeypatch, mongodb_uri, client, db_name):
    def refuse(self, stream_id):
        denied = OperationFailure("Authentication failed.", code=18)
        raise CheckpointError("checkpoint delete failed", stream=stream_id) from denied

    client[db_name]["_fw_checkpoints"].insert_one({"_id": "orders"})
    monkeypatch.setattr(MongoCheckpointStore, "delete", refuse)
    args = ["checkpoints", "delete", "orders", "--uri", mongodb_uri, "--database", db_name, "--yes"]

    assert main(args) == ExitCode.MONGODB_UNAVAILABLE
    assert "refused the credentials" in one_error_line(capsys.readouterr().err)


def test_one_shot_commands_wait_10_seconds_for_mongodb_unless_the_uri_says(closed_port):
    plain = mongo_client(f"mongodb://127.0.0.1:{closed_port}/", connect=False)
    own = mongo_client(f"mongodb://127.0.0.1:{closed_port}/?serverSelectionTimeoutMS=200", connect=False)
    with plain, own:
        assert plain.options.server_selection_timeout == 10
        assert own.options.server_selection_timeout == 0.2


@pytest.mark.parametrize("command", ["run", "checkpoints"])
def test_a_uri_pymongo_refuses_is_a_usage_error_that_keeps_the_password(capsys, command):
    # PyMongo reads "app:123" as a host and port and quotes "hunter2@db1" as a database name.
    uri = "mongodb://app:123/hunter2@db1/"
    args = ["run", "nowhere:Handler"] if command == "run" else ["checkpoints", "list", "--database", "x"]

    assert main([*args, "--uri", uri]) == ExitCode.USAGE

    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("flowwarden: PyMongo refused the URI mongodb://app:***@db1/")
    assert "hunter2" not in line and "123" not in line


# -- run: handlers that cannot be imported, streams that fail --------------------------------------


HANDLER = """
from flowwarden import ChangeEvent, change_stream, on_change


@change_stream("orders", {database!r}, name="orders")
class Orders:
    @on_change
    def handle(self, event: ChangeEvent) -> None:
        pass
"""

BROKEN_MODULES = {
    "syntax": ("def handle(:\n", ["SyntaxError in ", ".py, line 1"]),
    "raises": ("raise RuntimeError('ORDERS_TOPIC is not set')\n", ["RuntimeError: ORDERS_TOPIC is not set"]),
    "dependency": (
        "import flowwarden_no_such_dependency\n",
        ["ModuleNotFoundError", "flowwarden_no_such_dependency"],
    ),
}


@pytest.fixture
def handler_dir(tmp_path, monkeypatch) -> Path:
    """A folder for handler modules, importable in this process."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write_module(folder: Path, source: str) -> str:
    name = f"fw_handlers_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(source)
    importlib.invalidate_caches()  # the folder's listing may be cached from an earlier module
    return name


@pytest.mark.parametrize("kind", sorted(BROKEN_MODULES))
def test_a_handler_module_that_cannot_be_imported_is_a_usage_error(capsys, handler_dir, kind):
    source, expected = BROKEN_MODULES[kind]
    module = write_module(handler_dir, source)

    assert main(["run", f"{module}:Orders", "--uri", "mongodb://127.0.0.1:1/"]) == ExitCode.USAGE

    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"flowwarden: cannot import handler module {module!r}")
    for text in expected:
        assert text in line
    if kind == "syntax":
        assert str(handler_dir / f"{module}.py") in line


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        ("fw_no_such_module:Orders", "No module named 'fw_no_such_module'"),
        ("json:Orders", "module 'json' has no attribute 'Orders'"),
        ("json", "must look like 'package.module:ClassName'"),
    ],
)
def test_a_handler_that_is_not_there_is_a_usage_error(capsys, handler, expected):
    assert main(["run", handler, "--uri", "mongodb://127.0.0.1:1/"]) == ExitCode.USAGE
    assert expected in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("kind", ["syntax", "raises"])
def test_a_broken_handler_module_prints_no_traceback_in_a_real_process(tmp_path, kind):
    source, expected = BROKEN_MODULES[kind]
    module = write_module(tmp_path, source)

    done = flowwarden("run", f"{module}:Orders", "--uri", "mongodb://127.0.0.1:1/", cwd=tmp_path)

    assert done.returncode == ExitCode.USAGE
    line = one_error_line(done.stderr)
    assert all(text in line for text in expected)


def test_a_failed_stream_exits_1_with_its_error(capsys, handler_dir, mongodb_uri, client, db_name):
    module = write_module(handler_dir, HANDLER.format(database=db_name))
    client[db_name]["_fw_checkpoints"].insert_one({"_id": "orders", "epoch": "seven"})

    assert main(["run", f"{module}:Orders", "--uri", mongodb_uri]) == ExitCode.FAILED

    line = one_error_line(capsys.readouterr().err, logged=True)
    assert line.startswith("flowwarden: stream 'orders' failed: UnreadableCheckpointError:")


# -- embedded-mongo, usage --------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(capsys, port):
    assert main(["embedded-mongo", "--port", port]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("flowwarden: argument --port:") and "1 to 65535, or 0 for a free one" in line


def test_embedded_mongo_on_port_0_serves_on_a_free_port_and_prints_its_uri(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-m", "flowwarden.cli", "embedded-mongo", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert child.stdout is not None
        uri = child.stdout.readline().strip()
        port = int(re.fullmatch(r"mongodb://127\.0\.0\.1:(\d+)/\?replicaSet=rs0", uri).group(1))
        assert port != 0
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
            assert client.admin.command("ping")["ok"] == 1
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()


def test_a_port_in_use_is_a_usage_error(capsys, busy_port):
    assert main(["embedded-mongo", "--port", str(busy_port)]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert f"port {busy_port} on 127.0.0.1 is already in use" in line and "--port" in line


def test_a_port_in_use_prints_no_traceback_in_a_real_process(tmp_path, busy_port):
    done = flowwarden("embedded-mongo", "--port", str(busy_port), cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE
    assert "already in use" in one_error_line(done.stderr)


def test_bad_usage_is_one_line_and_exit_2(capsys, monkeypatch):
    assert main(["checkpoints", "list"]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert "--database" in line and "flowwarden checkpoints --help" in line
    monkeypatch.delenv("FLOWWARDEN_URI", raising=False)
    monkeypatch.delenv("FLOWWARDEN_URI_FILE", raising=False)
    monkeypatch.delenv("FLOWWARDEN_CONFIG", raising=False)
    assert main(["checkpoints", "list", "--database", "shop"]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert "no MongoDB URI" in line and "FLOWWARDEN_URI" in line


def test_an_interrupt_exits_130(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "demo", interrupted)
    assert main(["demo", "--no-spark"]) == ExitCode.INTERRUPTED
    assert one_error_line(capsys.readouterr().err) == "flowwarden: interrupted"


# -- the exit codes are documented where a user looks --------------------------------------------


def command_line_section() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Command line\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert match, "README.md lost its 'Command line' section"
    return match.group(1)


@pytest.mark.parametrize("code", list(ExitCode), ids=lambda c: c.name)
def test_each_exit_code_is_documented_in_the_help_the_module_and_the_readme(capsys, code):
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert re.search(rf"^\s+{int(code)}\s+{re.escape(cli.EXIT_CODE_MEANINGS[code])}", help_text, flags=re.M)
    assert re.search(rf"^- {int(code)}: ", cli.__doc__ or "", flags=re.M)
    assert re.search(rf"^\|? ?`?{int(code)}`? ", command_line_section(), flags=re.M)


def test_demo_without_spark_delivers_every_change_once(tmp_path, capsys):
    assert run_demo(events=300, output=str(tmp_path / "demo"), use_spark=False) == 0
    # two runs of 300 inserts, 100 updates and 30 deletes, each change found by its id
    assert "ok: every one of 860 changes delivered exactly once" in capsys.readouterr().out


def test_the_demo_checks_changes_by_id_so_a_lost_one_is_not_hidden_by_a_repeated_one(
    tmp_path, capsys, monkeypatch
):
    from flowwarden import ChangeEvent, change_stream, on_change
    from flowwarden.cli import demo

    def losing_one_and_repeating_another(delivered: list) -> type:
        @change_stream(demo.COLLECTION, demo.DATABASE, name="orders-counter")
        class LosesTheSecondRepeatsTheFirst:
            @on_change
            def record(self, event: ChangeEvent) -> None:
                change = (event.operation_type, event.document_key["_id"])
                delivered.append(delivered[0] if len(delivered) == 1 else change)

        return LosesTheSecondRepeatsTheFirst

    monkeypatch.setattr(demo, "_plain_handler", losing_one_and_repeating_another)
    assert run_demo(events=30, output=str(tmp_path / "demo"), use_spark=False) == 1
    mismatch = capsys.readouterr().err
    assert "86 changes written, 86 delivered: 1 never delivered" in mismatch
    assert "1 delivered more than once or never written" in mismatch
