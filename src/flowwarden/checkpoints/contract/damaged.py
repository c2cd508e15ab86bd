"""Stored records that cannot be checkpoints, and what a store that keeps documents does with them."""

from __future__ import annotations

import abc
from typing import Any

import pytest

from flowwarden.checkpoints.contract.support import STREAM, sample_token
from flowwarden.checkpoints.model import Checkpoint
from flowwarden.checkpoints.store import CheckpointStore
from flowwarden.errors import CheckpointError, UnreadableCheckpointError

# Stored records that cannot be checkpoints, as an operator or another program might leave them.
# Each maps a name to (field, value); the field is set on an otherwise good record.
DAMAGED_RECORDS: dict[str, tuple[str, Any]] = {
    "token is not a document": ("lastProcessedToken", "8263A1B2C3"),
    "token _data is not a string": ("lastProcessedToken", {"_data": 123}),
    "token _data is not hex": ("lastProcessedToken", {"_data": "82zz00"}),
    "token _data is too short": ("lastProcessedToken", {"_data": "82"}),
    "seen token has no cluster time": ("lastSeenToken", {"_data": "0102030405060708090A"}),
    "epoch is a string": ("epoch", "1"),
    "events count is a float": ("eventsProcessed", 1.5),
    "metadata is a list": ("metadata", [1, 2]),
    "timestamp is a string that is no date": ("lastProcessedTimestamp", "yesterday"),
}


def damaged_record(field: str, value: Any) -> dict[str, Any]:
    """A stored ``_fw_checkpoints`` document for :data:`STREAM` whose ``field`` holds ``value``."""
    document = Checkpoint(
        stream_id=STREAM, last_processed_token=sample_token(1_700_000_000), epoch=1
    ).to_document()
    document[field] = value
    return document


class UnreadableRecordContract(abc.ABC):
    """What a store does with a stored record that cannot be a checkpoint.

    For stores that keep documents (a database, a file): implement :meth:`make_store` and
    :meth:`write_raw`. ``load`` and ``list`` must raise
    :class:`~flowwarden.errors.UnreadableCheckpointError` naming the problem instead of
    returning a guessed position, and the record must stay as it was.
    """

    @abc.abstractmethod
    def make_store(self) -> CheckpointStore: ...

    @abc.abstractmethod
    def write_raw(self, document: dict[str, Any]) -> None:
        """Store ``document`` as the record of ``document["_id"]``, bypassing every check."""

    @abc.abstractmethod
    def read_raw(self, stream_id: str) -> Any:
        """The record stored for ``stream_id`` as the store holds it, for comparison."""

    @pytest.mark.parametrize("damage", sorted(DAMAGED_RECORDS))
    def test_a_damaged_record_is_refused_and_left_as_it_was(self, damage: str) -> None:
        store = self.make_store()
        field, value = DAMAGED_RECORDS[damage]
        self.write_raw(damaged_record(field, value))
        before = self.read_raw(STREAM)
        with pytest.raises(UnreadableCheckpointError) as raised:
            store.load(STREAM)
        assert field in str(raised.value)
        assert issubclass(type(raised.value), CheckpointError)
        with pytest.raises(UnreadableCheckpointError):
            store.list()
        assert self.read_raw(STREAM) == before
