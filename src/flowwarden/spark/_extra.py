"""Optional packages: pyarrow (the ``arrow`` extra) and pyspark (the ``spark`` extra), imported
only when a feature needs them.

Importing :mod:`flowwarden` or :mod:`flowwarden.spark` must not import either; a feature that
needs one imports it through here, so a missing package fails with the pip line to run. A
cluster that brings its own PySpark (Databricks, a spark-submit image) installs
``flowwarden[arrow]``: the ``spark`` extra would install a PySpark over the cluster's.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from flowwarden.errors import ConfigurationError, MissingDependencyError

# The extra that brings each optional package.
_EXTRAS = {"pyarrow": "arrow", "pyspark": "spark", "pandas": "spark"}

STREAMING_SOURCE_PYSPARK = (4, 2)
"""The oldest PySpark whose Python data sources take read limits and Trigger.AvailableNow."""


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (``pyarrow``, ``pyspark.sql`` ...) or raise MissingDependencyError."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.split(".", 1)[0]
        raise MissingDependencyError(feature, extra=_EXTRAS.get(package, "spark"), package=package) from exc


def require_pyspark(version: str, oldest: tuple[int, int], feature: str) -> None:
    """Raise ConfigurationError naming ``feature`` when PySpark ``version`` is older than ``oldest``."""
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    found = tuple(parts + [0] * (2 - len(parts)))
    if found < oldest:
        wanted = ".".join(map(str, oldest))
        raise ConfigurationError(
            f"{feature} needs PySpark {wanted} or newer; this process runs PySpark {version}. "
            f'Upgrade the cluster\'s Spark (or pip install "pyspark>={wanted}"); DataFrames in '
            "the connector (@on_dataframe) need only PySpark 4.0"
        )
