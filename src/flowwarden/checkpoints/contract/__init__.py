"""The checkpoint store contract, as an importable pytest suite.

One suite holds every rule of the store SPI (:class:`StoreRules`); it runs on a blocking store as
:class:`CheckpointStoreContract` and on an asyncio store as :class:`AsyncCheckpointStoreContract`,
the same tests either way. Subclass the one for your store in a test module, name the subclass
``Test...`` and implement ``make_store()``; every rule then runs against your store::

    from flowwarden.checkpoints.contract import CheckpointStoreContract

    class TestMyStore(CheckpointStoreContract):
        def make_store(self):
            return MyStore(self.backing)   # every call: a new store object on the same data

A store that also keeps initial-snapshot progress (``save_snapshot``) adds
:class:`SnapshotStoreContract` (or :class:`AsyncSnapshotStoreContract`) to the class's bases.

``make_store()`` is called several times in one test (the racing tests play several application
instances, one store object each); every store it returns within a test must see the same data,
and each test must start from empty data (build the backing in an autouse fixture).
The async suite marks its tests with ``pytest.mark.asyncio``, so it needs pytest-asyncio.

This package needs pytest and is for tests only; nothing in flowwarden imports it.
"""

from flowwarden.checkpoints.contract.damaged import DAMAGED_RECORDS, UnreadableRecordContract, damaged_record
from flowwarden.checkpoints.contract.snapshots import (
    AsyncSnapshotStoreContract,
    SnapshotRules,
    SnapshotStoreContract,
)
from flowwarden.checkpoints.contract.store import (
    AsyncCheckpointStoreContract,
    CheckpointStoreContract,
    StoreRules,
)
from flowwarden.checkpoints.contract.support import STREAM, sample_token

__all__ = [
    "DAMAGED_RECORDS",
    "STREAM",
    "AsyncCheckpointStoreContract",
    "AsyncSnapshotStoreContract",
    "CheckpointStoreContract",
    "SnapshotRules",
    "SnapshotStoreContract",
    "StoreRules",
    "UnreadableRecordContract",
    "damaged_record",
    "sample_token",
]
