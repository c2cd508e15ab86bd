"""Checkpoints: the stored position of each stream, the stores that keep it, and the committer.

The model (:class:`Checkpoint`, :class:`SaveResult`) and the store SPI (:class:`CheckpointStore`,
:class:`AsyncCheckpointStore`) are the contract; the four stores implement it, and
:class:`CheckpointCommitter` decides what to save and when. The importable contract test suite is
:mod:`flowwarden.checkpoints.contract` (it needs pytest, so it is not imported here). The
``@checkpoint`` class decorator is :func:`flowwarden.checkpoint`, not part of this package.

Each name imports its module on first use: the option models check a store against the SPI
(:func:`flowwarden.checkpoints.store.store_problem`) without loading the stores and the committer,
which build on those models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowwarden._lazy import lazy_attributes

if TYPE_CHECKING:
    from flowwarden.checkpoints.committer import CheckpointCommitter as CheckpointCommitter
    from flowwarden.checkpoints.file import FileCheckpointStore as FileCheckpointStore
    from flowwarden.checkpoints.memory import InMemoryCheckpointStore as InMemoryCheckpointStore
    from flowwarden.checkpoints.model import DEFAULT_COLLECTION as DEFAULT_COLLECTION
    from flowwarden.checkpoints.model import Checkpoint as Checkpoint
    from flowwarden.checkpoints.model import IncrementalProgress as IncrementalProgress
    from flowwarden.checkpoints.model import IncrementalState as IncrementalState
    from flowwarden.checkpoints.model import SaveResult as SaveResult
    from flowwarden.checkpoints.model import SnapshotProgress as SnapshotProgress
    from flowwarden.checkpoints.mongo import AsyncMongoCheckpointStore as AsyncMongoCheckpointStore
    from flowwarden.checkpoints.mongo import MongoCheckpointStore as MongoCheckpointStore
    from flowwarden.checkpoints.store import AsyncCheckpointStore as AsyncCheckpointStore
    from flowwarden.checkpoints.store import CheckpointStore as CheckpointStore
    from flowwarden.checkpoints.store import SnapshotStore as SnapshotStore
    from flowwarden.mongo.failures import is_retryable_save_error as is_retryable_save_error

_LAZY = {
    "CheckpointCommitter": "flowwarden.checkpoints.committer",
    "FileCheckpointStore": "flowwarden.checkpoints.file",
    "InMemoryCheckpointStore": "flowwarden.checkpoints.memory",
    "DEFAULT_COLLECTION": "flowwarden.checkpoints.model",
    "Checkpoint": "flowwarden.checkpoints.model",
    "IncrementalProgress": "flowwarden.checkpoints.model",
    "IncrementalState": "flowwarden.checkpoints.model",
    "SaveResult": "flowwarden.checkpoints.model",
    "SnapshotProgress": "flowwarden.checkpoints.model",
    "AsyncMongoCheckpointStore": "flowwarden.checkpoints.mongo",
    "MongoCheckpointStore": "flowwarden.checkpoints.mongo",
    "AsyncCheckpointStore": "flowwarden.checkpoints.store",
    "CheckpointStore": "flowwarden.checkpoints.store",
    "SnapshotStore": "flowwarden.checkpoints.store",
    "is_retryable_save_error": "flowwarden.mongo.failures",
}

__all__ = [
    "DEFAULT_COLLECTION",
    "AsyncCheckpointStore",
    "AsyncMongoCheckpointStore",
    "Checkpoint",
    "CheckpointCommitter",
    "CheckpointStore",
    "FileCheckpointStore",
    "InMemoryCheckpointStore",
    "IncrementalProgress",
    "IncrementalState",
    "MongoCheckpointStore",
    "SaveResult",
    "SnapshotProgress",
    "SnapshotStore",
    "is_retryable_save_error",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
