"""Checkpoints: the stored position of each stream, the stores that keep it, and the committer.

The model (:class:`Checkpoint`, :class:`SaveResult`) and the store SPI (:class:`CheckpointStore`,
:class:`AsyncCheckpointStore`) are the contract; the four stores implement it, and
:class:`CheckpointCommitter` decides what to save and when. The importable contract test suite is
:mod:`flowwarden.checkpoint.contract` (it needs pytest, so it is not imported here).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from flowwarden.checkpoint.committer import CheckpointCommitter, is_retryable_save_error
from flowwarden.checkpoint.file import FileCheckpointStore
from flowwarden.checkpoint.memory import InMemoryCheckpointStore
from flowwarden.checkpoint.model import DEFAULT_COLLECTION, Checkpoint, SaveResult
from flowwarden.checkpoint.mongo import AsyncMongoCheckpointStore, MongoCheckpointStore
from flowwarden.checkpoint.store import AsyncCheckpointStore, CheckpointStore

__all__ = [
    "DEFAULT_COLLECTION",
    "AsyncCheckpointStore",
    "AsyncMongoCheckpointStore",
    "Checkpoint",
    "CheckpointCommitter",
    "CheckpointStore",
    "FileCheckpointStore",
    "InMemoryCheckpointStore",
    "MongoCheckpointStore",
    "SaveResult",
    "is_retryable_save_error",
]


class _CheckpointPackage(types.ModuleType):
    """``flowwarden.checkpoint`` is this package and, when called, the ``@checkpoint`` decorator.

    The public API names both ``flowwarden.checkpoint`` (the store SPI) and ``from flowwarden import
    checkpoint`` (the class decorator). Python binds a subpackage's name on its parent as soon as
    it is imported, so the one name has to serve both: calling the package applies the decorator.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from flowwarden.decorators import checkpoint

        return checkpoint(*args, **kwargs)


sys.modules[__name__].__class__ = _CheckpointPackage
