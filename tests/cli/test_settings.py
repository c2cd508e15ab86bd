"""Settings from flags, FLOWWARDEN_* variables, a TOML file and a URI file: precedence, and one
clear line for what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flowwarden.cli import ExitCode, main
from flowwarden.cli.common import CommandError
from flowwarden.cli.settings import Settings, described, load
from helpers import flowwarden_command as flowwarden
from helpers import one_error_line


def unreachable(port: int, password: str = "s3cret-pw") -> str:
    return f"mongodb://app:{password}@127.0.0.1:{port}/?serverSelectionTimeoutMS=200"


def test_flags_win_over_the_environment_which_wins_over_the_file(tmp_path, monkeypatch):
    config = tmp_path / "flowwarden.toml"
    config.write_text(
        'instance_id = "from-file"\nmetrics_port = 9000\nprogress_interval = 5\nlog_level = "DEBUG"\n'
    )
    monkeypatch.setenv("FLOWWARDEN_METRICS_PORT", "9100")
    monkeypatch.setenv("FLOWWARDEN_INSTANCE_ID", "from-env")
    settings = load({"instance_id": "from-flag", "log_level": None}, str(config))
    assert settings.instance_id == "from-flag"  # flag over environment over file
    assert settings.metrics_port == 9100  # environment over file
    assert settings.progress_interval == 5.0 and settings.log_level == "DEBUG"  # file over defaults
    assert settings.metrics_host == "127.0.0.1" and settings.log_format == "text"  # defaults
    monkeypatch.setenv("FLOWWARDEN_CONFIG", str(config))
    assert load({}).instance_id == "from-env"  # FLOWWARDEN_CONFIG names the file when --config is not given


def test_the_uri_comes_from_a_file_with_its_newline_stripped(tmp_path, monkeypatch):
    secret = tmp_path / "uri"
    secret.write_text("mongodb://app:pw@db1/?replicaSet=rs0\n")
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", str(secret))
    assert load({}).mongodb_uri() == "mongodb://app:pw@db1/?replicaSet=rs0"
    assert load({"uri": "mongodb://flag/"}).mongodb_uri() == "mongodb://flag/"
    config = tmp_path / "c.toml"
    config.write_text(f'uri_file = "{secret}"\n')
    monkeypatch.delenv("FLOWWARDEN_URI_FILE")
    assert load({}, str(config)).mongodb_uri() == "mongodb://app:pw@db1/?replicaSet=rs0"


@pytest.mark.parametrize(
    ("environment", "config", "expected"),
    [
        ({}, "colour = 'blue'\n", ["unknown key 'colour'", "uri_file", "metrics_port"]),
        ({}, "metrics_port = 'nine'\n", ["metrics_port 'nine'", "--metrics-port", "FLOWWARDEN_METRICS_PORT"]),
        ({"FLOWWARDEN_LOG_FORMAT": "xml"}, "", ["log_format 'xml'", "'text' or 'json'"]),
        (
            {"FLOWWARDEN_PROGRESS_INTERVAL": "-1"},
            "",
            ["progress_interval '-1'", "greater than or equal to 0"],
        ),
        (
            {"FLOWWARDEN_URI": "mongodb://a/", "FLOWWARDEN_URI_FILE": "/x"},
            "",
            ["both the URI and a URI file"],
        ),
        ({"FLOWWARDEN_URI_FILE": "/nonexistent/uri"}, "", ["cannot read the URI file /nonexistent/uri"]),
        ({}, "uri = \n", ["is not valid TOML"]),
        ({"FLOWWARDEN_SPARK_CONF": "[1, 2]"}, "", ["spark_conf", "FLOWWARDEN_SPARK_CONF", "a JSON object"]),
        ({}, "spark_conf = 'spark.ui.enabled'\n", ["spark_conf 'spark.ui.enabled'", "config file: a table"]),
    ],
    ids=[
        "unknown key",
        "bad port",
        "bad format",
        "negative interval",
        "uri twice",
        "missing uri file",
        "bad toml",
        "spark_conf not an object",
        "spark_conf not a table",
    ],
)
def test_a_bad_setting_is_one_line_naming_it(tmp_path, monkeypatch, capsys, environment, config, expected):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "flowwarden.toml"
    path.write_text(config)
    code = main(["status", "--database", "shop", "--config", str(path), "--uri", "mongodb://127.0.0.1:1/"])
    assert code == ExitCode.USAGE
    line = one_error_line(capsys.readouterr().err)
    for part in expected:
        assert part in line, line


def test_spark_settings_come_from_every_source_and_spark_conf_merges_key_by_key(tmp_path, monkeypatch):
    config = tmp_path / "flowwarden.toml"
    config.write_text(
        'spark_master = "local[2]"\nspark_log = "logs/spark.log"\n'
        '[spark_conf]\n"spark.sql.shuffle.partitions" = 4\n"spark.ui.enabled" = false\n'
    )
    monkeypatch.setenv("FLOWWARDEN_SPARK_CONF", '{"spark.ui.enabled": true, "spark.executor.memory": "2g"}')
    flags = ["spark.executor.memory=4g", "spark.hadoop.fs.s3a.secret.key=abc=="]
    settings = load({"spark_conf": flags}, str(config))
    assert settings.spark_conf == {
        "spark.sql.shuffle.partitions": "4",  # the file's; numbers and booleans become Spark's text
        "spark.ui.enabled": "true",  # the environment's over the file's
        "spark.executor.memory": "4g",  # the flag's over the environment's
        "spark.hadoop.fs.s3a.secret.key": "abc==",
    }
    assert settings.spark_master == "local[2]" and str(settings.spark_log) == "logs/spark.log"
    line = settings.in_effect("orders-1")
    assert "spark_master=local[2], spark_conf={spark.executor.memory=4g," in line
    assert "spark.hadoop.fs.s3a.secret.key=***,spark.sql.shuffle" in line
    assert "spark_log=logs/spark.log" in line and "abc==" not in line
    assert load({}).in_effect("x").count("spark_log=log,") == 1  # unset: Spark's lines go to the log


def test_a_spark_conf_flag_that_is_not_key_value_is_refused(capsys):
    assert main(["run", "m:C", "--uri", "mongodb://127.0.0.1:1/", "--spark-conf", "spark.ui.enabled"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "'spark.ui.enabled' is not KEY=VALUE" in line and "--spark-conf" in line, line


def test_a_missing_config_file_is_refused_not_skipped(tmp_path, capsys):
    assert main(["status", "--database", "shop", "--config", str(tmp_path / "none.toml")]) == ExitCode.USAGE
    assert "cannot read the config file" in one_error_line(capsys.readouterr().err)


def test_a_uri_from_the_environment_reaches_mongodb_and_its_password_no_output(
    closed_port, capsys, monkeypatch
):
    monkeypatch.setenv("FLOWWARDEN_URI", unreachable(closed_port))
    assert main(["status", "--database", "shop"]) == ExitCode.MONGODB_UNAVAILABLE
    out, err = capsys.readouterr()
    line = one_error_line(err)
    assert f"127.0.0.1:{closed_port}" in line and "app:***@" in line
    assert "s3cret-pw" not in out + err


def test_a_uri_pymongo_refuses_keeps_its_password_whatever_source_it_came_from(tmp_path, capsys, monkeypatch):
    secret = tmp_path / "uri"
    secret.write_text("mongodb://app:pa:ss@db1/")  # an unescaped ':' in the password
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", str(secret))
    assert main(["checkpoints", "list", "--database", "shop"]) == ExitCode.USAGE
    out, err = capsys.readouterr()
    assert "pa:ss" not in out + err and "ss@" not in err
    assert "PyMongo refused the URI" in one_error_line(err)


def test_every_setting_is_described_with_its_flag_and_variable():
    rows = {name: (flag, variable, text) for name, flag, variable, text in described()}
    assert set(rows) == set(Settings.model_fields)
    for name, (_flag, variable, text) in rows.items():
        assert variable == f"FLOWWARDEN_{name.upper()}" and text, name
    assert rows["metrics_port"][0] == "--metrics-port"


def test_load_refuses_an_empty_uri_file(tmp_path, monkeypatch):
    empty = tmp_path / "uri"
    empty.write_text("\n")
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", str(empty))
    with pytest.raises(CommandError, match="is empty"):
        load({})


# -- in processes of their own ---------------------------------------------------------------------


def test_run_with_the_uri_in_a_file_and_json_logs(tmp_path, mongodb_uri, client, db_name):
    """`flowwarden run` finds the URI in FLOWWARDEN_URI_FILE alone, and logs JSON lines."""
    (tmp_path / "handlers.py").write_text(
        "from flowwarden import change_stream, checkpoint, on_change\n"
        f"@change_stream('orders', {db_name!r}, name='orders', max_await_time_ms=50)\n"
        "@checkpoint(save_every_n=1)\n"
        "class Orders:\n"
        "    @on_change\n"
        "    def handle(self, event):\n"
        "        pass\n"
    )
    secret = tmp_path / "uri"
    secret.write_text(mongodb_uri + "\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLOWWARDEN_")}
    child = subprocess.Popen(
        [sys.executable, "-m", "flowwarden.cli", "run", "handlers:Orders", "--log-format", "json"],
        cwd=tmp_path,
        env={**environment, "FLOWWARDEN_URI_FILE": str(secret)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stderr is not None
        opened = None
        for line in child.stderr:
            record = json.loads(line)
            if record.get("stream") == "orders" and "opened" in record["message"]:
                opened = record
                break
        assert opened is not None
        assert opened["level"] == "INFO" and opened["logger"] == "flowwarden.runtime.opening"
        assert opened["timestamp"].endswith("+00:00")
    finally:
        child.terminate()
        assert child.wait(30) == 0


def test_help_of_every_command_is_plain_text():
    for command in ("run", "status", "checkpoints", "dlq", "embedded-mongo", "demo"):
        done = flowwarden(command, "--help")
        assert done.returncode == 0, done.stderr
        assert "``" not in done.stdout and ":class:" not in done.stdout and ":func:" not in done.stdout
        assert "exit codes:" in done.stdout


def test_docs_cli_lists_every_setting_with_its_flag_and_variable():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    for name, flag, variable, _ in described():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/cli.md has no row for {name}"
        assert f"`{variable}`" in row and (not flag or f"`{flag}`" in row), row


def test_every_command_and_option_has_help_text():
    import argparse

    from flowwarden.cli import build_parser

    def undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += undocumented(sub, f"{path} {name}")
                    if not sub.description:
                        found.append(f"{path} {name} (no description)")
            elif not action.help:
                found.append(f"{path} {action.dest}")
        return found

    assert undocumented(build_parser(), "flowwarden") == []
