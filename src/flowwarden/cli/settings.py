"""The command's settings: command-line flags, then ``FLOWWARDEN_*`` environment variables, then a
TOML file, then defaults (pydantic-settings merges them, in that order of precedence).

The TOML file is ``--config PATH`` or ``FLOWWARDEN_CONFIG``; its keys are the field names below,
at the top level::

    uri_file = "/run/secrets/mongodb-uri"
    instance_id = "orders-1"
    metrics_port = 9464
    log_format = "json"

``spark_conf`` is a table of Spark settings: ``--spark-conf KEY=VALUE`` once per setting, a JSON
object in ``FLOWWARDEN_SPARK_CONF``, a ``[spark_conf]`` table in the TOML file; the sources are
merged key by key, in the same order of precedence.

The URI may come from a file (``FLOWWARDEN_URI_FILE``, or ``uri_file`` in the TOML file), for
secrets mounted as files; one trailing newline is stripped. A source that sets both ``uri`` and
``uri_file`` is refused, as are unknown keys in the TOML file and values a field does not accept:
:func:`load` raises :class:`~flowwarden.cli.common.CommandError` (exit 2) with one line that
names the setting, where it can be set, and what it accepts. A URI never appears in such a line.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from flowwarden.cli.common import CommandError, ExitCode, mongo_client
from flowwarden.cli.logs import LogFormat, LogLevel
from flowwarden.mongo.redaction import redact_uri
from flowwarden.mongo.signals import DEFAULT_CHECKPOINT_DATABASE
from flowwarden.runtime.preflight import database_name_problem, instance_id_problem

if TYPE_CHECKING:
    import pymongo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]

ENV_PREFIX = "FLOWWARDEN_"
CONFIG_ENV = "FLOWWARDEN_CONFIG"
# FLOWWARDEN_* variables that are not settings, yet belong to flowwarden: no warning for them.
OTHER_VARIABLES = frozenset({CONFIG_ENV, "FLOWWARDEN_TEST_MONGODB_URI"})
# Files a setting names are read whole, so they are bounded: a URI file holds one line, a config
# file a few settings. A FIFO or a device (/dev/zero) is refused before it is opened.
MAX_URI_FILE_BYTES = 64 * 1024
MAX_CONFIG_FILE_BYTES = 1024 * 1024
DEFAULT_SERVER_SELECTION_TIMEOUT = 10.0


class Settings(BaseSettings):
    """Where the command connects, and how ``flowwarden run`` runs and reports."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    uri: SecretStr | None = Field(
        None, description="MongoDB URI of a replica set or sharded cluster (kept out of every log line)"
    )
    uri_file: Path | None = Field(None, description="a file holding the URI (a mounted secret)")
    instance_id: str | None = Field(
        None,
        description="this process's name in checkpoints, leases and logs (default: generated); "
        "give each process its own",
    )
    checkpoint_database: str = Field(
        DEFAULT_CHECKPOINT_DATABASE,
        description="where streams over a whole deployment keep their checkpoints",
    )
    server_selection_timeout: float = Field(
        DEFAULT_SERVER_SELECTION_TIMEOUT,
        gt=0,
        allow_inf_nan=False,
        description="seconds a command waits for the deployment to answer before it exits with code 3 "
        "(run: at start-up only; a serverSelectionTimeoutMS in the URI wins)",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve /metrics, /healthz and /readyz on this port (0: any free one)",
    )
    metrics_host: str = Field("127.0.0.1", description="the address the metrics port listens on")
    log_level: LogLevel = Field("INFO", description="flowwarden's log level: DEBUG, INFO, WARNING or ERROR")
    log_format: LogFormat = Field("text", description="text, or json (one object per line)")
    progress_interval: float = Field(
        30.0, ge=0, allow_inf_nan=False, description="seconds between progress lines per stream (0: none)"
    )
    spark_master: str = Field(
        "local[*]", min_length=1, description="the Spark master of the session run starts for @on_dataframe"
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description="Spark settings of that session (flag: KEY=VALUE, once per setting; environment: "
        "a JSON object; config file: a table)",
    )
    spark_log: Path | None = Field(
        None,
        description="a file that gets the output of Spark's JVM and its Python workers, appended "
        "(default: flowwarden's log, as the logger spark, WARN and above)",
    )

    # Set per load() on a subclass: the TOML file to read, if any.
    _toml_file: Path | None = None

    @field_validator("instance_id")
    @classmethod
    def _usable_instance_id(cls, value: str | None) -> str | None:
        problem = instance_id_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; leave it unset for a generated one")
        return value

    @field_validator("checkpoint_database")
    @classmethod
    def _database_name(cls, value: str) -> str:
        problem = database_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _port_not_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # TOML's true would read as port 1
            raise ValueError("it must be a port number, not true or false")
        return value

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _conf_pairs(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):  # the flag: KEY=VALUE each
            return spark_pairs(value)
        if isinstance(value, dict):  # TOML and JSON give numbers and booleans as such; Spark reads text
            return {key: _spark_text(setting) for key, setting in value.items()}
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            _UriFromFile(env_settings, f"the environment ({ENV_PREFIX}URI and {ENV_PREFIX}URI_FILE)"),
        ]
        toml_file = cls.__private_attributes__["_toml_file"].default
        if toml_file is not None:
            toml = TomlConfigSettingsSource(settings_cls, toml_file=toml_file)
            sources.append(_UriFromFile(toml, f"{toml_file} (uri and uri_file)"))
        return tuple(sources)

    def mongodb_uri(self) -> str:
        """The URI, or the error that says where to give one."""
        if self.uri is None:
            raise CommandError(
                ExitCode.USAGE,
                f"no MongoDB URI: give --uri, set {ENV_PREFIX}URI or {ENV_PREFIX}URI_FILE, or set uri or "
                "uri_file in the config file (--config)",
            )
        return self.uri.get_secret_value()

    def client(self) -> pymongo.MongoClient[dict[str, Any]]:
        """A client of the URI for the command's own reads, waiting ``server_selection_timeout``."""
        return mongo_client(self.mongodb_uri(), server_selection_timeout=self.server_selection_timeout)

    def in_effect(self, instance_id: str) -> str:
        """The settings ``run`` runs with, as one line of ``name=value`` for its start-up log line:
        ``instance_id`` as the connector uses it (generated when not set), the URI with its
        password hidden, and the TOML file they were read from."""
        generated = " (generated)" if self.instance_id is None else ""
        # Commas without a space: the line's settings stay apart at ", ".
        spark_conf = ",".join(f"{key}={_shown(key, text)}" for key, text in sorted(self.spark_conf.items()))
        values = {
            "instance_id": f"{instance_id}{generated}",
            "checkpoint_database": self.checkpoint_database,
            "metrics_port": "off" if self.metrics_port is None else self.metrics_port,
            "metrics_host": self.metrics_host,
            "progress_interval": f"{self.progress_interval:g}",
            "server_selection_timeout": f"{self.server_selection_timeout:g}",
            "log_level": self.log_level,
            "log_format": self.log_format,
            "spark_master": self.spark_master,
            "spark_conf": f"{{{spark_conf}}}",
            "spark_log": self.spark_log or "log",
            "uri": redact_uri(self.uri.get_secret_value()) if self.uri is not None else "none",
            "config": self._toml_file or "none",
        }
        return ", ".join(f"{name}={value}" for name, value in values.items())


# Spark's own rule for settings that hold secrets (spark.redaction.regex's default).
_SECRET_SETTING = re.compile(r"(?i)secret|password|token|access[.]?key")


def _shown(key: str, value: str) -> str:
    return "***" if _SECRET_SETTING.search(key) else value


def spark_pairs(items: Any) -> dict[str, str]:
    """``KEY=VALUE`` strings (the ``--spark-conf`` flags) as a mapping; ValueError for another."""
    pairs = {}
    for item in items:
        key, found, setting = str(item).partition("=")
        if not found or not key.strip():
            raise ValueError(f"{item!r} is not KEY=VALUE, e.g. spark.sql.shuffle.partitions=8")
        pairs[key.strip()] = setting
    return pairs


def _spark_text(value: Any) -> Any:
    """A TOML or JSON scalar as Spark spells it (true, not True); anything else as it is."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, (int, float)) else value


class _UriFromFile(PydanticBaseSettingsSource):
    """A source whose ``uri_file`` is replaced by the URI read from that file."""

    def __init__(self, source: PydanticBaseSettingsSource, where: str) -> None:
        super().__init__(source.settings_cls)
        self._source = source
        self._where = where

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = dict(self._source())
        path = values.pop("uri_file", None)
        if path is None:
            return values
        if values.get("uri") is not None:
            raise CommandError(
                ExitCode.USAGE, f"{self._where} sets both the URI and a URI file; keep one of them"
            )
        if not isinstance(path, (str, os.PathLike)):
            # A TOML file can give any value; the environment only strings.
            raise CommandError(
                ExitCode.USAGE,
                f"uri_file in {self._where} must be the name of a file, got {type(path).__name__} {path!r}",
            )
        try:
            # Bytes, not text: one trailing "\n" or "\r\n" is stripped, and nothing else changes.
            data = read_bounded(Path(path), MAX_URI_FILE_BYTES)
            values["uri"] = data.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except (OSError, UnicodeDecodeError, ValueError) as error:
            if isinstance(error, UnicodeDecodeError):
                reason = "it is not UTF-8 text"
            elif isinstance(error, OSError) and error.strerror:
                reason = error.strerror
            else:
                reason = str(error)
            raise CommandError(
                ExitCode.USAGE, f"cannot read the URI file {path} named by {self._where}: {reason}"
            ) from None
        if not values["uri"].strip():
            raise CommandError(ExitCode.USAGE, f"the URI file {path} named by {self._where} is empty")
        return values


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``; ValueError for anything else (a FIFO or a device
    would block or never end) or for a file over ``limit`` bytes."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise ValueError("it is not a regular file")
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"it is larger than {limit:,} bytes")
    return data


FLAGS = {
    "uri": "--uri",
    "instance_id": "--instance-id",
    "checkpoint_database": "--checkpoint-database",
    "metrics_port": "--metrics-port",
    "metrics_host": "--metrics-host",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "progress_interval": "--progress-interval",
    "server_selection_timeout": "--server-selection-timeout",
    "spark_master": "--spark-master",
    "spark_conf": "--spark-conf",
    "spark_log": "--spark-log",
}


def load(flags: dict[str, Any], config: str | None = None) -> Settings:
    """The settings, with ``flags`` (the command-line values given; None for those not given) over
    the environment over the TOML file (``config``, else ``FLOWWARDEN_CONFIG``) over defaults."""
    path = config or os.environ.get(CONFIG_ENV) or None
    toml_file = _check_config(Path(path), "--config" if config else CONFIG_ENV) if path else None
    given = {name: value for name, value in flags.items() if value is not None}
    with contextlib.suppress(ValueError):  # else the setting's validator says what is wrong
        # A mapping, which the sources below are merged into key by key (a list would replace them).
        if isinstance(given.get("spark_conf"), (list, tuple)):
            given["spark_conf"] = spark_pairs(given["spark_conf"])
    loaded_from = type("Settings", (Settings,), {"_toml_file": toml_file})
    try:
        settings: Settings = loaded_from(**given)
    except ValidationError as error:
        raise CommandError(ExitCode.USAGE, _explain(error, toml_file)) from None
    return settings


def _check_config(path: Path, named_by: str) -> Path:
    """The TOML file, once it exists and parses (pydantic-settings skips a missing file silently)."""
    try:
        tomllib.loads(read_bounded(path, MAX_CONFIG_FILE_BYTES).decode("utf-8"))
    except OSError as error:
        raise CommandError(
            ExitCode.USAGE, f"cannot read the config file {path} ({named_by}): {error.strerror or error}"
        ) from None
    except UnicodeDecodeError:
        raise CommandError(
            ExitCode.USAGE, f"the config file {path} ({named_by}) is not UTF-8 text; TOML files are UTF-8"
        ) from None
    except ValueError as error:  # not a regular file, or too large (TOMLDecodeError is one too)
        if isinstance(error, tomllib.TOMLDecodeError):
            problem = f"the config file {path} is not valid TOML: {error}"
        else:
            problem = f"cannot read the config file {path} ({named_by}): {error}"
        raise CommandError(ExitCode.USAGE, problem) from None
    return path


def unknown_variables(environ: dict[str, str] | None = None) -> list[str]:
    """One warning per ``FLOWWARDEN_*`` environment variable that is no setting (a misspelt one
    would otherwise be ignored without a word), naming the closest setting's variable."""
    environ = dict(os.environ) if environ is None else environ
    known = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    warnings = []
    for name in sorted(environ):
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"the variables are {', '.join(sorted(known))}"
            warnings.append(f"the environment variable {name} is no setting and is ignored; {hint}")
    return warnings


def _explain(error: ValidationError, toml_file: Path | None) -> str:
    """One line for the first problem: which setting, where it is set, what it accepts."""
    problem = error.errors()[0]
    name = str(problem["loc"][0]) if problem["loc"] else "?"
    known = ", ".join(Settings.model_fields)
    if problem["type"] == "extra_forbidden":
        return f"the config file {toml_file} has an unknown key {name!r}; the keys it may set are: {known}"
    field = Settings.model_fields.get(name)
    places = [part for part in (FLAGS.get(name), f"{ENV_PREFIX}{name.upper()}") if part]
    where = f"{', '.join(places)} or {name} in the config file"
    value = "" if name in ("uri", "uri_file") else f" {problem.get('input')!r}"
    accepts = f" ({field.description})" if field is not None and field.description else ""
    return f"setting {name}{value} is refused: {problem['msg']}{accepts}. It is set by {where}"


def described() -> list[tuple[str, str, str, str]]:
    """(field, flag, environment variable, description) of every setting, for help texts and docs."""
    return [
        (name, FLAGS.get(name, ""), f"{ENV_PREFIX}{name.upper()}", field.description or "")
        for name, field in Settings.model_fields.items()
    ]
