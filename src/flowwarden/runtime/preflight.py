"""What a connector checks before it starts anything, so that a mistake ends the start with one
clear :class:`~flowwarden.errors.FlowWardenError` instead of surfacing at the first event.

- every handler class can be created with no arguments (the runtime makes one instance per
  stream);
- a class with ``@on_dataframe`` has what its batches need: pyarrow and pyspark (the ``spark``
  extra) and, unless a session is handed in or Spark Connect is used, a Java for Spark's JVM;
- the names the connector stores under are usable: the instance id (printable, non-empty) and
  the checkpoint database (a MongoDB database name);
- a class with ``hash_fields`` finds its salt in the environment variable ``hash_salt_env`` names.

Nothing here talks to MongoDB or starts Spark.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections.abc import Iterable

from flowwarden.config.spec import StreamSpec
from flowwarden.errors import ConfigurationError, MissingDependencyError
from flowwarden.mongo.sensitive_fields import salted_hasher

# MongoDB database names may hold none of these, nor be empty or over 63 bytes.
_DATABASE_NAME_FORBIDDEN = re.compile(r'[/\\. "$*<>:|?\x00]')


def check_handlers(specs: Iterable[StreamSpec]) -> None:
    """Each handler class can be created as ``Class()``; else a ConfigurationError naming the
    parameters it wants."""
    for spec in specs:
        cls = spec.handler_class
        try:
            inspect.signature(cls).bind()
        except TypeError:
            wanted = [
                name
                for name, parameter in inspect.signature(cls).parameters.items()
                if parameter.default is inspect.Parameter.empty
                and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
            ]
            raise ConfigurationError(
                f"{cls.__name__}() needs arguments ({', '.join(wanted)}), but flowwarden creates one "
                "instance per stream with none: give them defaults, or read them in __init__ from "
                "settings or the environment",
                owner=cls.__name__,
            ) from None
        except ValueError:
            pass  # no signature to read (a builtin base): its instance is made as it is


def check_hash_salts(specs: Iterable[StreamSpec]) -> None:
    """The salt of each class with ``hash_fields`` is in its environment variable; else a
    ConfigurationError naming the variable (the stream would have to hash without one)."""
    for spec in specs:
        stream = spec.stream
        salted_hasher(stream.hash_fields, stream.hash_salt_env, owner=spec.handler_class.__qualname__)


def check_dataframe_needs(specs: Iterable[StreamSpec], *, spark_given: bool, spark_master: str) -> None:
    """The ``spark`` extra, and a Java, for classes with ``@on_dataframe``."""
    frames = [spec for spec in specs if spec.dataframe is not None]
    if not frames:
        return
    feature = f"@on_dataframe of {frames[0].handler_class.__name__}"
    for module in ("pyarrow", "pyspark"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a finder that knows the module is missing says so by raising
            found = False
        if not found:
            raise MissingDependencyError(feature, extra="spark", package=module)
    if not spark_given and not spark_master.startswith("sc://"):
        from flowwarden.spark.session import require_java

        require_java(feature, without="hand the Connector a running SparkSession (spark=...)")


def instance_id_problem(instance_id: str | None) -> str | None:
    """Why ``instance_id`` cannot name this connector in checkpoints, leases and log lines."""
    if instance_id is not None and (not instance_id.strip() or not instance_id.isprintable()):
        return "it must be non-empty and printable (it appears in checkpoints, leases and log lines)"
    return None


def database_name_problem(name: str) -> str | None:
    """Why ``name`` is not a MongoDB database name."""
    if not name or len(name.encode()) > 63 or _DATABASE_NAME_FORBIDDEN.search(name):
        return 'a MongoDB database name is 1 to 63 bytes, none of / \\ . " $ * < > : | ? and no spaces'
    return None


def check_names(instance_id: str | None, checkpoint_database: str) -> None:
    """The instance id and checkpoint database the connector writes into every record."""
    problem = instance_id_problem(instance_id)
    if problem is not None:
        raise ConfigurationError(
            f"instance_id {instance_id!r} is not a usable name: {problem}; leave it out for a generated one",
            owner="Connector",
            option="instance_id",
        )
    problem = database_name_problem(checkpoint_database)
    if problem is not None:
        raise ConfigurationError(
            f"checkpoint_database {checkpoint_database!r} is refused: {problem}",
            owner="Connector",
            option="checkpoint_database",
        )


__all__ = [
    "check_dataframe_needs",
    "check_handlers",
    "check_hash_salts",
    "check_names",
    "database_name_problem",
    "instance_id_problem",
]
