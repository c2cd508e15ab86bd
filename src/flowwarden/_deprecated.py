"""The old import path of the checkpoint store SPI, ``flowwarden.checkpoint``, for one release.

The stores live in :mod:`flowwarden.checkpoints`; ``flowwarden.checkpoint`` is the ``@checkpoint``
class decorator. Code that still imports ``flowwarden.checkpoint`` (or ``flowwarden.checkpoint.X``)
gets a DeprecationWarning and what it asked for: the names of :mod:`flowwarden.checkpoints`, and
its submodules themselves.

Importing a submodule binds its name on the parent package, so importing the old path rebinds
``flowwarden.checkpoint``; the module this path yields is therefore also callable as the
decorator, so that ``from flowwarden import checkpoint`` stays the decorator either way. That
double role is confined to this deprecated path and goes with it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

OLD = "flowwarden.checkpoint"
NEW = "flowwarden.checkpoints"


def _warn(name: str) -> None:
    warnings.warn(
        f"{name} is deprecated; import {NEW + name[len(OLD) :]} instead (flowwarden.checkpoint is "
        "the @checkpoint decorator). The old path goes in the next release.",
        DeprecationWarning,
        stacklevel=3,
    )


class _OldPackage(types.ModuleType):
    """``flowwarden.checkpoint`` as a package: the names of flowwarden.checkpoints, and callable
    as the ``@checkpoint`` decorator."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from flowwarden.decorators import checkpoint

        return checkpoint(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(NEW), name)


class _OldPathLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _warn(spec.name)
        if spec.name == OLD:
            package = _OldPackage(OLD, f"Deprecated: use {NEW}.")
            package.__path__ = []
            return package
        # A submodule is the new module itself, so classes and state are shared, not copied.
        return importlib.import_module(NEW + spec.name[len(OLD) :])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module was complete when it was created."""


class _OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != OLD and not fullname.startswith(OLD + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _OldPathLoader(), is_package=fullname == OLD)


def install_old_checkpoint_path() -> None:
    """Make ``flowwarden.checkpoint[.X]`` importable again (once per process)."""
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(_OldPathFinder())


__all__ = ["install_old_checkpoint_path"]
