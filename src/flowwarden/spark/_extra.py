"""The ``spark`` extra: pyarrow and pyspark, imported only when a feature needs them.

Importing :mod:`flowwarden` or :mod:`flowwarden.spark` must not import either; a feature that
needs one imports it through here, so a missing package fails with the pip line to run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from flowwarden.errors import MissingDependencyError


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (``pyarrow``, ``pyspark.sql`` ...) or raise MissingDependencyError."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.split(".", 1)[0]
        raise MissingDependencyError(feature, extra="spark", package=package) from exc
