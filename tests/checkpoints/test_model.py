"""Checkpoint values and their _fw_checkpoints document form."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from bson import Int64, Timestamp

from flowwarden.checkpoints import Checkpoint, SaveResult
from flowwarden.checkpoints.contract import sample_token
from flowwarden.errors import CheckpointError, InvalidTokenError
from flowwarden.events import token_datetime

T1 = sample_token(1_700_000_000, 1)
T2 = sample_token(1_700_000_050, 3)


def test_only_stream_id_is_required_and_construction_is_by_keyword() -> None:
    checkpoint = Checkpoint(stream_id="s")
    assert checkpoint.last_processed_token is None
    assert checkpoint.last_seen_token is None
    assert checkpoint.resume_token is None
    assert (checkpoint.events_processed, checkpoint.epoch, checkpoint.metadata) == (0, 0, {})
    with pytest.raises(TypeError):
        Checkpoint("s")  # type: ignore[call-arg]


def test_it_is_frozen_and_does_not_share_state_with_the_caller() -> None:
    token = dict(T1)
    metadata = {"a": 1}
    checkpoint = Checkpoint(stream_id="s", last_processed_token=token, metadata=metadata)
    with pytest.raises(dataclasses.FrozenInstanceError):
        checkpoint.epoch = 3  # type: ignore[misc]
    token["_data"] = "82FF"
    metadata["a"] = 2
    assert checkpoint.last_processed_token == T1
    assert checkpoint.metadata == {"a": 1}


def test_timestamps_default_to_the_tokens_cluster_time_in_utc() -> None:
    checkpoint = Checkpoint(stream_id="s", last_processed_token=T1, last_seen_token=T2)
    assert checkpoint.last_processed_at == datetime.fromtimestamp(1_700_000_000, tz=timezone.utc)
    assert checkpoint.last_seen_at == token_datetime(T2)


def test_resume_token_is_the_newer_of_the_two() -> None:
    assert Checkpoint(stream_id="s", last_processed_token=T1, last_seen_token=T2).resume_token == T2
    assert Checkpoint(stream_id="s", last_processed_token=T2, last_seen_token=T1).resume_token == T2
    assert Checkpoint(stream_id="s", last_seen_token=T1).resume_token == T1
    assert Checkpoint(stream_id="s", last_processed_token=T1).resume_token == T1


def test_a_value_that_is_not_a_token_is_refused() -> None:
    with pytest.raises(InvalidTokenError):
        Checkpoint(stream_id="s", last_processed_token={"_data": 42})
    with pytest.raises(ValueError, match="stream_id"):
        Checkpoint(stream_id="")


def test_a_token_without_a_cluster_time_still_orders_but_has_no_timestamp() -> None:
    checkpoint = Checkpoint(stream_id="s", last_processed_token={"_data": "00AB"})
    assert checkpoint.last_processed_at is None


def test_document_round_trip() -> None:
    updated = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=timezone.utc)
    checkpoint = Checkpoint(
        stream_id="orders",
        instance_id="host:1",
        instance_token="host:1:5e6f7a8b",
        last_processed_token=T1,
        last_seen_token=T2,
        events_processed=10,
        epoch=2,
        updated_at=updated,
        metadata={"k": [1, 2]},
    )
    document = checkpoint.to_document()
    assert document == {
        "_id": "orders",
        "instanceId": "host:1",
        "instanceToken": "host:1:5e6f7a8b",
        "lastSeenToken": T2,
        "lastSeenTimestamp": token_datetime(T2),
        "lastProcessedToken": T1,
        "lastProcessedTimestamp": token_datetime(T1),
        "eventsProcessed": 10,
        "epoch": 2,
        "updatedAt": updated,
        "metadata": {"k": [1, 2]},
    }
    assert Checkpoint.from_document(document) == checkpoint


def test_a_flowwarden_for_java_document_loads() -> None:
    """Java writes the six shared fields only; its dates come back naive from PyMongo."""
    document = {
        "_id": "OrdersHandler",
        "instanceId": "pod-7",
        "lastSeenToken": {"_data": T2["_data"]},
        "lastSeenTimestamp": datetime(2023, 11, 14, 22, 14, 10),
        "lastProcessedToken": {"_data": T1["_data"]},
        "lastProcessedTimestamp": datetime(2023, 11, 14, 22, 13, 20),
        "lastHeartbeatTimestamp": datetime(2023, 11, 14, 22, 14, 11),
    }
    checkpoint = Checkpoint.from_document(document)
    assert checkpoint.stream_id == "OrdersHandler"
    assert (checkpoint.instance_id, checkpoint.instance_token) == ("pod-7", None)
    assert checkpoint.resume_token == T2
    assert checkpoint.last_processed_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert (checkpoint.epoch, checkpoint.events_processed, checkpoint.metadata) == (0, 0, {})


@pytest.mark.parametrize(
    "stored",
    [
        Timestamp(1_700_000_000, 5),
        1_700_000_000_000,
        "2023-11-14T22:13:20Z",
        datetime(2023, 11, 14, 23, 13, 20, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_stored_timestamps_in_other_shapes_read_as_utc(stored: object) -> None:
    checkpoint = Checkpoint.from_document({"_id": "s", "lastProcessedTimestamp": stored})
    assert checkpoint.last_processed_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)


def test_int64_counts_load_as_int() -> None:
    checkpoint = Checkpoint.from_document({"_id": "s", "eventsProcessed": Int64(5), "epoch": Int64(2)})
    assert (checkpoint.events_processed, checkpoint.epoch) == (5, 2)


@pytest.mark.parametrize(
    "document",
    [
        {"_id": 5},
        {"_id": "s", "lastProcessedToken": "not a document"},
        {"_id": "s", "lastProcessedToken": {"_data": 7}},
        {"_id": "s", "epoch": "2"},
        {"_id": "s", "eventsProcessed": 1.5},
        {"_id": "s", "metadata": [1]},
        {"_id": "s", "updatedAt": b"x"},
    ],
)
def test_an_unreadable_document_raises_instead_of_inventing_a_position(document: dict[str, object]) -> None:
    with pytest.raises(CheckpointError, match="not readable"):
        Checkpoint.from_document(document)


def test_save_result_members() -> None:
    assert {r.name for r in SaveResult} == {"STORED", "IGNORED"}
