"""What an operator meets in the first week: each mistake ends as one line on stderr with the exit
code the README promises, never a traceback, a hang or a silent default."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flowwarden.checkpoints import Checkpoint, MongoCheckpointStore
from flowwarden.checkpoints.contract import sample_token
from flowwarden.cli import ExitCode, main
from helpers import flowwarden_command as flowwarden
from helpers import one_error_line, running, wait_until

PAST = sample_token(1_700_000_000, 3)


def plain_handler(database: str) -> str:
    """The source of a module with one handler class, ``Orders``."""
    return f"""
        from flowwarden import change_stream, on_change

        @change_stream("orders", {database!r})
        class Orders:
            @on_change
            def handle(self, event):
                pass
        """


def write(folder: Path, name: str, source: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return name


# -- run: a deployment that does not answer -----------------------------------------------------------


def test_run_on_a_uri_nothing_answers_exits_3_within_the_server_selection_timeout(tmp_path, closed_port):
    module = write(tmp_path, "orders_handlers", plain_handler("shop"))
    started = time.monotonic()
    done = flowwarden(
        "run",
        f"{module}:Orders",
        "--uri",
        f"mongodb://app:hunter2@127.0.0.1:{closed_port}/",
        "--server-selection-timeout",
        "0.5",
        cwd=tmp_path,
        timeout=60,
    )
    waited = time.monotonic() - started
    assert done.returncode == ExitCode.MONGODB_UNAVAILABLE, done.stderr
    line = one_error_line(done.stderr)
    assert line.startswith(f"flowwarden: cannot reach MongoDB at mongodb://app:***@127.0.0.1:{closed_port}/")
    assert f"127.0.0.1:{closed_port}: [Errno 111] Connection refused" in line
    assert "hunter2" not in done.stderr and "Topology Description" not in line
    # Not the driver's 30 s: the setting bounds the wait (with the interpreter's start-up on top).
    assert waited < 30, f"run waited {waited:.0f}s for a deployment that does not answer"


def test_a_uri_with_another_scheme_is_named_without_a_word_about_passwords(tmp_path, capsys):
    assert main(["status", "--uri", "mongo://localhost/", "--database", "shop"]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        "flowwarden: the MongoDB URI must begin with mongodb:// or mongodb+srv://; it begins with "
        "'mongo://'. Fix the URI"
    )
    assert main(["status", "--uri", "mongo://app:hunter2@localhost/", "--database", "shop"]) == ExitCode.USAGE
    assert "hunter2" not in capsys.readouterr().err


# -- settings ---------------------------------------------------------------------------------------


def test_a_misspelt_setting_variable_is_warned_about_with_the_one_meant(capsys, monkeypatch, mongodb_uri):
    monkeypatch.setenv("FLOWWARDEN_INSTANCEID", "orders-1")
    assert main(["checkpoints", "list", "--uri", mongodb_uri, "--database", "admin"]) == ExitCode.CLEAN_STOP
    err = capsys.readouterr().err
    assert "FLOWWARDEN_INSTANCEID is no setting and is ignored; did you mean FLOWWARDEN_INSTANCE_ID?" in err


@pytest.mark.parametrize("level", ["info", "Debug", " warning "])
def test_the_log_level_is_taken_in_any_case(monkeypatch, capsys, mongodb_uri, level):
    monkeypatch.setenv("FLOWWARDEN_LOG_LEVEL", level)
    assert main(["checkpoints", "list", "--uri", mongodb_uri, "--database", "admin"]) == ExitCode.CLEAN_STOP
    assert (
        main(
            ["checkpoints", "list", "--uri", mongodb_uri, "--database", "admin", "--log-level", level.strip()]
        )
        == 0
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "metrics_port = true\n",
            "setting metrics_port True is refused: Value error, it must be a port number",
        ),
        ('instance_id = ""\n', "setting instance_id '' is refused: Value error, it must be non-empty"),
        ('instance_id = "a\\u001b[31mb"\n', "it must be non-empty and printable"),
        ('checkpoint_database = "flow.warden"\n', "a MongoDB database name is 1 to 63 bytes"),
        ("server_selection_timeout = 0\n", "setting server_selection_timeout 0 is refused"),
    ],
)
def test_a_setting_that_cannot_work_is_refused(tmp_path, capsys, source, expected):
    config = tmp_path / "flowwarden.toml"
    config.write_text(source)
    args = [
        "checkpoints",
        "list",
        "--uri",
        "mongodb://127.0.0.1:1/",
        "--database",
        "x",
        "--config",
        str(config),
    ]
    assert main(args) == ExitCode.USAGE
    assert expected in one_error_line(capsys.readouterr().err)


def test_a_config_file_that_is_not_utf8_is_refused_in_one_line(tmp_path, capsys):
    config = tmp_path / "flowwarden.toml"
    config.write_bytes('instance_id = "caf\u00e9"\n'.encode("latin-1"))
    args = [
        "checkpoints",
        "list",
        "--uri",
        "mongodb://127.0.0.1:1/",
        "--database",
        "x",
        "--config",
        str(config),
    ]
    assert main(args) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        f"flowwarden: the config file {config} (--config) is not UTF-8 text; TOML files are UTF-8"
    )


def test_a_fifo_or_a_device_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "settings.fifo"
    os.mkfifo(fifo)
    # A blocking read would hang the command until the test's timeout.
    done = flowwarden("checkpoints", "list", "--database", "x", "--config", str(fifo), timeout=30)
    assert done.returncode == ExitCode.USAGE
    assert one_error_line(done.stderr).endswith("(--config): it is not a regular file")
    done = flowwarden(
        "checkpoints", "list", "--database", "x", env={"FLOWWARDEN_URI_FILE": "/dev/zero"}, timeout=30
    )
    assert done.returncode == ExitCode.USAGE
    assert one_error_line(done.stderr).endswith(": it is not a regular file")


def test_a_uri_file_is_read_only_up_to_its_bound(tmp_path):
    big = tmp_path / "uri"
    big.write_text("mongodb://127.0.0.1:1/?" + "a" * 70_000)
    done = flowwarden(
        "checkpoints", "list", "--database", "x", env={"FLOWWARDEN_URI_FILE": str(big)}, timeout=30
    )
    assert done.returncode == ExitCode.USAGE
    assert one_error_line(done.stderr).endswith("it is larger than 65,536 bytes")


# -- handler classes ---------------------------------------------------------------------------------


def test_a_handler_class_whose_init_wants_arguments_is_a_configuration_error(tmp_path, mongodb_uri):
    module = write(
        tmp_path,
        "needs_args",
        """
        from flowwarden import change_stream, on_change

        @change_stream("orders", "shop")
        class Orders:
            def __init__(self, sink, retries=3):
                self.sink = sink

            @on_change
            def handle(self, event):
                pass
        """,
    )
    done = flowwarden("run", f"{module}:Orders", "--uri", mongodb_uri, cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    line = one_error_line(done.stderr)
    assert "Orders() needs arguments (sink), but flowwarden creates one instance per stream" in line


def test_a_dataframe_class_without_the_spark_extra_is_refused_at_start_naming_it(tmp_path, mongodb_uri):
    module = write(
        tmp_path,
        "frames",
        """
        import sys

        class _WithoutPySpark:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "pyspark":
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, _WithoutPySpark())

        from flowwarden import change_stream, on_dataframe

        @change_stream("orders", "shop")
        class Orders:
            @on_dataframe(max_events=10)
            def write(self, df):
                pass
        """,
    )
    done = flowwarden("run", f"{module}:Orders", "--uri", mongodb_uri, cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert one_error_line(done.stderr) == (
        "flowwarden: @on_dataframe of Orders needs pyspark, which is not installed. "
        'Install it with: pip install "flowwarden[spark]"'
    )


def test_without_java_a_dataframe_class_and_the_demo_say_so_in_one_line(tmp_path, mongodb_uri):
    no_java = {"JAVA_HOME": str(tmp_path / "no-java")}
    module = write(
        tmp_path,
        "frames",
        """
        from flowwarden import change_stream, on_dataframe

        @change_stream("orders", "shop")
        class Orders:
            @on_dataframe(max_events=10)
            def write(self, df):
                pass
        """,
    )
    done = flowwarden("run", f"{module}:Orders", "--uri", mongodb_uri, cwd=tmp_path, env=no_java)
    assert done.returncode == ExitCode.USAGE, done.stderr
    line = one_error_line(done.stderr)
    assert line.startswith("flowwarden: @on_dataframe of Orders needs Spark, which needs Java 17: JAVA_HOME=")
    assert "apt-get install openjdk-17-jre-headless" in line
    done = flowwarden("demo", "--output", str(tmp_path / "demo"), cwd=tmp_path, env=no_java)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert one_error_line(done.stderr).endswith("or run the demo without Spark: flowwarden demo --no-spark")


# -- status and dlq on a database that is not there ---------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["dlq", "list"], ["checkpoints", "list"]])
def test_a_database_that_does_not_exist_is_named_not_shown_as_empty(
    capsys, mongodb_uri, client, db_name, command
):
    client[db_name]["_fw_checkpoints"].insert_one({"_id": "orders"})
    missing = f"{db_name}_typo"
    assert main([*command, "--uri", mongodb_uri, "--database", missing]) == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"flowwarden: the deployment has no database {missing!r}; it has: ")
    assert db_name in line


# -- output into a closed pipe ------------------------------------------------------------------------


def test_output_into_a_pipe_closed_early_ends_quietly(mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    for n in range(3000):
        store.save(Checkpoint(stream_id=f"s{n:04d}", last_processed_token=PAST))
    command = (
        f"{sys.executable} -m flowwarden.cli checkpoints list --uri '{mongodb_uri}' --database {db_name} "
        '| head -1; echo "exit ${PIPESTATUS[0]}" >&2'
    )
    done = subprocess.run(
        command, shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120
    )
    assert done.stdout.count("\n") == 1 and '"stream": "s0000"' in done.stdout
    assert done.stderr.strip() == "exit 0", done.stderr


# -- rewinds that stick -----------------------------------------------------------------------------


def rewind(uri: str, db: str, *extra: str) -> int:
    return main(["checkpoints", "rewind", "orders", "--uri", uri, "--database", db, *extra])


def test_a_rewind_or_delete_of_a_running_stream_is_refused_unless_forced(
    capsys, mongodb_uri, client, db_name
):
    handler, _ = plain_handler_class(db_name)
    with running(mongodb_uri, [handler]):
        wait_until(
            lambda: client[db_name]["_fw_checkpoints"].find_one({"_id": "orders"}), what="its checkpoint"
        )
        wait_until(lambda: client[db_name]["_fw_locks"].find_one({"stream": "orders"}), what="its presence")
        before = client[db_name]["_fw_checkpoints"].find_one({"_id": "orders"})
        assert rewind(mongodb_uri, db_name, "--to-token", f'{{"_data": "{PAST["_data"]}"}}') == ExitCode.USAGE
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("flowwarden: stream 'orders' is running: instance ") and "--force" in line
        common = ["--uri", mongodb_uri, "--database", db_name]
        assert main(["checkpoints", "delete", "orders", *common, "--yes"]) == ExitCode.USAGE
        assert "is running" in one_error_line(capsys.readouterr().err)
        assert client[db_name]["_fw_checkpoints"].find_one({"_id": "orders"}) == before
    # Stopped gracefully: it let go at once.
    assert client[db_name]["_fw_locks"].find_one({"stream": "orders"}) is None
    assert (
        rewind(mongodb_uri, db_name, "--to-token", f'{{"_data": "{PAST["_data"]}"}}') == ExitCode.CLEAN_STOP
    )
    assert MongoCheckpointStore(client[db_name]).load("orders").resume_token == PAST


def test_a_killed_connectors_presence_holds_until_it_expires_and_force_overrides_it(
    capsys, mongodb_uri, client, db_name
):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=sample_token(1_700_000_500, 1)))
    locks = client[db_name]["_fw_locks"]
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    presence = {
        "stream": "orders",
        "kind": "presence",
        "owner": "orders-1",
        "ownerToken": "h:1:a",
        "expiresAt": soon,
    }
    locks.insert_one({"_id": "orders#h:1:a", **presence})
    assert rewind(mongodb_uri, db_name, "--to-start") == ExitCode.USAGE
    assert "instance 'orders-1' (h:1:a) runs it" in one_error_line(capsys.readouterr().err)
    locks.update_one(
        {"_id": "orders#h:1:a"}, {"$set": {"expiresAt": datetime(2000, 1, 1, tzinfo=timezone.utc)}}
    )
    assert rewind(mongodb_uri, db_name, "--to-start") == ExitCode.CLEAN_STOP  # expired: a killed one
    locks.update_one({"_id": "orders#h:1:a"}, {"$set": {"expiresAt": soon}})
    assert rewind(mongodb_uri, db_name, "--to-token", f'{{"_data": "{PAST["_data"]}"}}', "--force") == 0
    assert store.load("orders").resume_token == PAST


def test_a_held_lease_refuses_a_rewind(capsys, mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=sample_token(1_700_000_500, 1)))
    lease = {
        "owner": "leader",
        "ownerToken": "h:2:b",
        "epoch": 3,
        "expiresAt": datetime.now(timezone.utc) + timedelta(hours=1),
    }
    client[db_name]["_fw_locks"].insert_one({"_id": "orders", **lease})
    assert rewind(mongodb_uri, db_name, "--to-start") == ExitCode.USAGE
    assert "instance 'leader' (h:2:b) runs it" in one_error_line(capsys.readouterr().err)
    client[db_name]["_fw_locks"].update_one({"_id": "orders"}, {"$set": {"owner": None, "ownerToken": None}})
    assert rewind(mongodb_uri, db_name, "--to-start") == ExitCode.CLEAN_STOP  # released


def test_delete_asks_for_yes(capsys, mongodb_uri, client, db_name):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=PAST))
    common = ["--uri", mongodb_uri, "--database", db_name]
    assert main(["checkpoints", "delete", "orders", *common]) == ExitCode.USAGE
    assert "run it again with --yes" in one_error_line(capsys.readouterr().err)
    assert store.load("orders") is not None
    assert main(["checkpoints", "delete", "orders", *common, "--yes"]) == ExitCode.CLEAN_STOP
    assert store.load("orders") is None


def test_a_time_before_the_oplog_or_outside_what_mongodb_can_name_is_refused(
    capsys, mongodb_uri, client, db_name
):
    store = MongoCheckpointStore(client[db_name])
    store.save(Checkpoint(stream_id="orders", last_processed_token=PAST))
    before = store.load("orders")
    assert rewind(mongodb_uri, db_name, "--to-time", "2001-01-01T00:00:00Z") == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    assert "is before the oldest entry of the oplog" in line and "the history before it is gone" in line
    for moment in ("9999-01-01T00:00:00Z", "1960-01-01T00:00:00Z"):
        assert rewind(mongodb_uri, db_name, "--to-time", moment) == ExitCode.USAGE
        assert "outside the times MongoDB can name" in one_error_line(capsys.readouterr().err)
    assert store.load("orders") == before


def test_a_token_error_names_the_command_that_prints_tokens(capsys, mongodb_uri, client, db_name):
    MongoCheckpointStore(client[db_name]).save(Checkpoint(stream_id="orders", last_processed_token=PAST))
    assert rewind(mongodb_uri, db_name, "--to-token", '{"_data": "82zz"}') == ExitCode.USAGE
    assert "`flowwarden checkpoints show STREAM` prints" in one_error_line(capsys.readouterr().err)


def plain_handler_class(database: str) -> tuple[type, list[object]]:
    from flowwarden import change_stream, checkpoint, on_change

    seen: list[object] = []

    @change_stream("orders", database, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1, save_interval_seconds=0.1)
    class Orders:
        @on_change
        def handle(self, event: object) -> None:
            seen.append(event)

    return Orders, seen
