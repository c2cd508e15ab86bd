"""The documents the MongoDB store writes, field by field where a loaded Checkpoint would hide a
difference: the times next to the tokens (FlowWarden for Java reads them) and the fields of a
record that a seen write creates."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pymongo
import pytest

from flowwarden.checkpoints import MongoCheckpointStore
from flowwarden.checkpoints.contract import sample_token

STREAM = "orders"
T1 = sample_token(1_700_000_000)
T1_TIME = datetime(2023, 11, 14, 22, 13, 20)  # T1's cluster time, as BSON gives it back


@pytest.fixture
def store_and_documents(client: pymongo.MongoClient[Any], db_name: str) -> tuple[MongoCheckpointStore, Any]:
    return MongoCheckpointStore(client[db_name]), client[db_name]["_fw_checkpoints"]


def test_a_seen_write_that_creates_the_record_writes_every_field_of_one(
    store_and_documents: tuple[MongoCheckpointStore, Any],
) -> None:
    store, documents = store_and_documents
    store.save_seen(STREAM, T1, 2)
    document = documents.find_one({"_id": STREAM})
    assert document["lastSeenToken"] == T1 and document["lastSeenTimestamp"] == T1_TIME
    assert (document["lastProcessedToken"], document["lastProcessedTimestamp"]) == (None, None)
    assert (document["instanceId"], document["instanceToken"]) == (None, None)
    assert (document["eventsProcessed"], document["epoch"], document["metadata"]) == (0, 2, {})


def test_a_rewind_writes_the_tokens_time_next_to_it(
    store_and_documents: tuple[MongoCheckpointStore, Any],
) -> None:
    store, documents = store_and_documents
    store.rewind(STREAM, T1)
    document = documents.find_one({"_id": STREAM})
    assert (document["lastProcessedToken"], document["lastProcessedTimestamp"]) == (T1, T1_TIME)
    assert (document["lastSeenToken"], document["lastSeenTimestamp"]) == (None, None)
