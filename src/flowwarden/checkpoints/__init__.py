"""Checkpoints: the stored position of each stream, the stores that keep it, and the committer.

The model (:class:`Checkpoint`, :class:`SaveResult`) and the store SPI (:class:`CheckpointStore`,
:class:`AsyncCheckpointStore`) are the contract; the four stores implement it, and
:class:`CheckpointCommitter` decides what to save and when. The importable contract test suite is
:mod:`flowwarden.checkpoints.contract` (it needs pytest, so it is not imported here). The
``@checkpoint`` class decorator is :func:`flowwarden.checkpoint`, not part of this package.
"""

from __future__ import annotations

from flowwarden.checkpoints.committer import CheckpointCommitter, is_retryable_save_error
from flowwarden.checkpoints.file import FileCheckpointStore
from flowwarden.checkpoints.memory import InMemoryCheckpointStore
from flowwarden.checkpoints.model import DEFAULT_COLLECTION, Checkpoint, SaveResult, SnapshotProgress
from flowwarden.checkpoints.mongo import AsyncMongoCheckpointStore, MongoCheckpointStore
from flowwarden.checkpoints.store import AsyncCheckpointStore, CheckpointStore, SnapshotStore

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
    "SnapshotProgress",
    "SnapshotStore",
    "is_retryable_save_error",
]
