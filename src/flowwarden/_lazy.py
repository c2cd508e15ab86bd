"""Package attributes that import their module on first use (PEP 562).

``flowwarden`` and ``flowwarden.spark`` name many things a process rarely needs all of: a Spark
worker unpickling the streaming source, or the command line printing its help, should not import
the runtime, pydantic models or pyarrow for names it never touches.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, modules: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``modules`` (name ->
    module) is imported from its module on first use and kept in ``namespace`` (the package's
    globals), so later uses cost nothing."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__


__all__ = ["lazy_attributes"]
