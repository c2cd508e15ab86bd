"""flowwarden.cli.settings: the one line each refused setting gives, word for word, and the
start-up line of the settings in effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowwarden.cli import ExitCode
from flowwarden.cli.common import CommandError
from flowwarden.cli.settings import Settings, described, load

ENVIRONMENT = "the environment (FLOWWARDEN_URI and FLOWWARDEN_URI_FILE)"


def refused(call: object) -> str:
    with pytest.raises(CommandError) as raised:
        call()  # type: ignore[operator]
    assert raised.value.code is ExitCode.USAGE
    return raised.value.message


def test_an_unknown_key_in_the_config_file_lists_the_keys_it_may_set(tmp_path: Path) -> None:
    config = tmp_path / "flowwarden.toml"
    config.write_text("nosuch = 1\n")
    assert refused(lambda: load({}, str(config))) == (
        f"the config file {config} has an unknown key 'nosuch'; the keys it may set are: uri, uri_file, "
        "instance_id, checkpoint_database, server_selection_timeout, metrics_port, metrics_host, log_level, "
        "log_format, progress_interval, spark_master, spark_conf, spark_log"
    )


def test_a_refused_value_names_the_setting_what_it_accepts_and_where_it_is_set(tmp_path: Path) -> None:
    config = tmp_path / "flowwarden.toml"
    config.write_text("metrics_port = 70000\n")
    assert refused(lambda: load({}, str(config))) == (
        "setting metrics_port 70000 is refused: Input should be less than or equal to 65535 (serve "
        "/metrics, /healthz and /readyz on this port (0: any free one)). It is set by --metrics-port, "
        "FLOWWARDEN_METRICS_PORT or metrics_port in the config file"
    )


def test_a_refused_uri_is_not_quoted(tmp_path: Path) -> None:
    config = tmp_path / "flowwarden.toml"
    config.write_text("uri = 12345\n")
    assert refused(lambda: load({}, str(config))) == (
        "setting uri is refused: Input should be a valid string (MongoDB URI of a replica set or sharded "
        "cluster (kept out of every log line)). It is set by --uri, FLOWWARDEN_URI or uri in the config file"
    )


def test_a_missing_config_file_is_named_with_what_named_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "none.toml"
    assert refused(lambda: load({}, str(missing))) == (
        f"cannot read the config file {missing} (--config): No such file or directory"
    )
    monkeypatch.setenv("FLOWWARDEN_CONFIG", str(missing))
    assert refused(lambda: load({})) == (
        f"cannot read the config file {missing} (FLOWWARDEN_CONFIG): No such file or directory"
    )


def test_flowwarden_config_names_the_file_when_no_config_flag_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "flowwarden.toml"
    config.write_text('checkpoint_database = "from-file"\n')
    monkeypatch.setenv("FLOWWARDEN_CONFIG", str(config))
    assert load({}).checkpoint_database == "from-file"


def test_each_source_that_sets_both_uri_and_uri_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "flowwarden.toml"
    config.write_text('uri = "mongodb://db1/"\nuri_file = "/run/secrets/uri"\n')
    assert refused(lambda: load({}, str(config))) == (
        f"{config} (uri and uri_file) sets both the URI and a URI file; keep one of them"
    )
    monkeypatch.setenv("FLOWWARDEN_URI", "mongodb://db1/")
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", "/run/secrets/uri")
    assert refused(lambda: load({})) == f"{ENVIRONMENT} sets both the URI and a URI file; keep one of them"


def test_a_uri_file_that_is_not_a_file_name_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "flowwarden.toml"
    config.write_text("uri_file = 5\n")
    assert refused(lambda: load({}, str(config))) == (
        f"uri_file in {config} (uri and uri_file) must be the name of a file, got int 5"
    )


def test_a_uri_file_ending_with_a_windows_line_end_gives_the_uri_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "uri"
    secret.write_bytes(b"mongodb://app:p\xc3\xa4ss@db1/\r\n")
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", str(secret))
    assert load({}).mongodb_uri() == "mongodb://app:päss@db1/"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file or directory"),
        (b"mongodb://app:p\xe4ss@db1/", "it is not UTF-8 text"),
    ],
    ids=["missing", "not UTF-8"],
)
def test_an_unreadable_uri_file_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes | None, reason: str
) -> None:
    secret = tmp_path / "uri"
    if content is not None:
        secret.write_bytes(content)
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", str(secret))
    assert refused(lambda: load({})) == f"cannot read the URI file {secret} named by {ENVIRONMENT}: {reason}"


def test_an_empty_uri_file_is_refused_as_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "uri"
    secret.write_text("\n")
    monkeypatch.setenv("FLOWWARDEN_URI_FILE", str(secret))
    assert refused(lambda: load({})) == f"the URI file {secret} named by {ENVIRONMENT} is empty"


def test_no_uri_says_every_place_to_give_one() -> None:
    assert refused(lambda: load({}).mongodb_uri()) == (
        "no MongoDB URI: give --uri, set FLOWWARDEN_URI or FLOWWARDEN_URI_FILE, or set uri or uri_file in "
        "the config file (--config)"
    )


def test_the_settings_in_effect_line() -> None:
    assert load({}).in_effect("host-1") == (
        "instance_id=host-1 (generated), checkpoint_database=flowwarden, metrics_port=off, "
        "metrics_host=127.0.0.1, progress_interval=30, server_selection_timeout=10, log_level=INFO, "
        "log_format=text, spark_master=local[*], spark_conf={}, spark_log=log, uri=none, config=none"
    )
    given = load({"uri": "mongodb://app:pw@db1/", "instance_id": "orders-1", "metrics_port": 9464})
    assert given.in_effect("orders-1") == (
        "instance_id=orders-1, checkpoint_database=flowwarden, metrics_port=9464, metrics_host=127.0.0.1, "
        "progress_interval=30, server_selection_timeout=10, log_level=INFO, log_format=text, "
        "spark_master=local[*], spark_conf={}, spark_log=log, uri=mongodb://app:***@db1/, config=none"
    )


def test_a_setting_without_a_flag_is_described_with_an_empty_flag() -> None:
    rows = {name: (flag, variable) for name, flag, variable, _ in described()}
    assert rows["uri_file"] == ("", "FLOWWARDEN_URI_FILE")
    assert rows["uri"] == ("--uri", "FLOWWARDEN_URI")
    assert isinstance(Settings.model_fields["uri_file"].description, str)
