"""The checkpoint store contract, as importable pytest suites.

Subclass :class:`CheckpointStoreContract` (sync stores) or :class:`AsyncCheckpointStoreContract`
(async stores) in a test module, name the subclass ``Test...`` and implement ``make_store()``;
every rule of the store SPI then runs against your store::

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

from flowwarden.checkpoints.contract.async_store import AsyncCheckpointStoreContract
from flowwarden.checkpoints.contract.damaged import DAMAGED_RECORDS, UnreadableRecordContract, damaged_record
from flowwarden.checkpoints.contract.snapshots import AsyncSnapshotStoreContract, SnapshotStoreContract
from flowwarden.checkpoints.contract.support import STREAM, sample_token
from flowwarden.checkpoints.contract.sync_store import CheckpointStoreContract

__all__ = [
    "DAMAGED_RECORDS",
    "STREAM",
    "AsyncCheckpointStoreContract",
    "AsyncSnapshotStoreContract",
    "CheckpointStoreContract",
    "SnapshotStoreContract",
    "UnreadableRecordContract",
    "damaged_record",
    "sample_token",
]
