"""The contract suite on the MongoDB stores (sync, PyMongo async, motor), plus Mongo-only cases.

Runs against EmbeddedReplicaSet, or the server named by FLOWWARDEN_TEST_MONGODB_URI.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import pymongo
import pytest
from bson.datetime_ms import DatetimeMS

from flowwarden.checkpoints import (
    AsyncMongoCheckpointStore,
    Checkpoint,
    CheckpointCommitter,
    MongoCheckpointStore,
    SaveResult,
)
from flowwarden.checkpoints.contract import (
    STREAM,
    AsyncCheckpointStoreContract,
    AsyncSnapshotStoreContract,
    CheckpointStoreContract,
    SnapshotStoreContract,
    UnreadableRecordContract,
    sample_token,
)
from flowwarden.errors import CheckpointError, FencedError, UnreadableCheckpointError
from flowwarden.mongo.failures import Failure, classify


class TestMongoCheckpointStore(CheckpointStoreContract, SnapshotStoreContract):
    @pytest.fixture(autouse=True)
    def _backing(self, client: pymongo.MongoClient[Any], db_name: str) -> Iterator[None]:
        self.database = client[db_name]
        yield
        client.drop_database(db_name)

    def make_store(self) -> MongoCheckpointStore:
        return MongoCheckpointStore(self.database)

    def test_documents_use_the_shared_field_names(self) -> None:
        token = sample_token(1_700_000_000, 2)
        self.make_store().save(
            Checkpoint(
                stream_id=STREAM, instance_id="i", last_processed_token=token, epoch=1, metadata={"m": 1}
            )
        )
        document = self.database["_fw_checkpoints"].find_one({"_id": STREAM})
        assert document is not None
        assert set(document) == {
            "_id",
            "instanceId",
            "instanceToken",
            "lastSeenToken",
            "lastSeenTimestamp",
            "lastProcessedToken",
            "lastProcessedTimestamp",
            "eventsProcessed",
            "epoch",
            "updatedAt",
            "metadata",
        }
        assert document["lastProcessedToken"] == token
        assert document["lastProcessedTimestamp"] == datetime(2023, 11, 14, 22, 13, 20)
        assert isinstance(document["updatedAt"], datetime)

    def test_a_flowwarden_for_java_document_loads_and_keeps_working(self) -> None:
        self.database["_fw_checkpoints"].insert_one(
            {
                "_id": STREAM,
                "instanceId": "pod-1",
                "lastSeenToken": sample_token(200),
                "lastSeenTimestamp": datetime(1970, 1, 1, 0, 3, 20),
                "lastProcessedToken": sample_token(100),
                "lastProcessedTimestamp": datetime(1970, 1, 1, 0, 1, 40),
            }
        )
        store = self.make_store()
        loaded = store.load(STREAM)
        assert loaded is not None
        assert (loaded.resume_token, loaded.epoch, loaded.instance_id) == (sample_token(200), 0, "pod-1")
        # No epoch stored counts as epoch 0: the Python owner takes over with epoch 0 or higher.
        assert (
            store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(150)))
            is SaveResult.STORED
        )
        assert store.save_seen(STREAM, sample_token(250), 1) is SaveResult.STORED
        with pytest.raises(FencedError):
            store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(300), epoch=0))

    def test_a_custom_collection_name(self) -> None:
        store = MongoCheckpointStore(self.database, "my_checkpoints")
        store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
        assert self.database["my_checkpoints"].count_documents({}) == 1
        assert self.database["_fw_checkpoints"].count_documents({}) == 0

    def test_an_unreadable_document_raises(self) -> None:
        self.database["_fw_checkpoints"].insert_one({"_id": STREAM, "lastProcessedToken": "garbage"})
        with pytest.raises(CheckpointError, match="not readable"):
            self.make_store().load(STREAM)

    def test_a_failing_server_raises_on_load_rather_than_returning_none(
        self, client: pymongo.MongoClient[Any], mongodb_uri: str
    ) -> None:
        app = f"fw-cp-{uuid.uuid4().hex[:8]}"
        own: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            mongodb_uri, appname=app, retryReads=False, retryWrites=False
        )
        with own:
            store = MongoCheckpointStore(own[self.database.name])
            store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
            with _fail_command(client, app, ["find"], error_code=2):
                with pytest.raises(CheckpointError, match="load failed"):
                    store.load(STREAM)
            with _fail_command(client, app, ["update"], error_code=8000, times=1):
                with pytest.raises(CheckpointError, match="save failed"):
                    store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2)))
            assert store.load(STREAM) is not None

    @pytest.mark.parametrize(
        ("code", "kind"),
        [
            (13, Failure.FATAL),
            (18, Failure.FATAL),
            (8000, Failure.FATAL),
            (91, Failure.TRANSIENT),
            (2, Failure.UNKNOWN),
        ],
        ids=["Unauthorized", "AuthenticationFailed", "AtlasError", "ShutdownInProgress", "BadValue"],
    )
    def test_a_failed_read_or_write_is_judged_by_the_error_it_wraps(
        self, client: pymongo.MongoClient[Any], mongodb_uri: str, code: int, kind: Failure
    ) -> None:
        app = f"fw-cp-{uuid.uuid4().hex[:8]}"
        own: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            mongodb_uri, appname=app, retryReads=False, retryWrites=False
        )
        with own:
            store = MongoCheckpointStore(own[self.database.name])
            with _fail_command(client, app, ["find", "update"], error_code=code):
                with pytest.raises(CheckpointError) as load:
                    store.load(STREAM)
                with pytest.raises(CheckpointError) as save:
                    store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2)))
        assert classify(load.value) is kind and classify(save.value) is kind

    def test_an_unreachable_server_raises(self) -> None:
        dead: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            "mongodb://127.0.0.1:1/", serverSelectionTimeoutMS=100, connect=False
        )
        with dead:
            store = MongoCheckpointStore(dead["db"])
            with pytest.raises(CheckpointError, match="load failed"):
                store.load(STREAM)
            with pytest.raises(CheckpointError, match="list failed"):
                store.list()


class TestMongoStoreWithDamagedRecords(UnreadableRecordContract):
    @pytest.fixture(autouse=True)
    def _backing(self, client: pymongo.MongoClient[Any], db_name: str) -> Iterator[None]:
        self.database = client[db_name]
        yield
        client.drop_database(db_name)

    def make_store(self) -> MongoCheckpointStore:
        return MongoCheckpointStore(self.database)

    def write_raw(self, document: dict[str, Any]) -> None:
        self.database["_fw_checkpoints"].replace_one({"_id": document["_id"]}, document, upsert=True)

    def read_raw(self, stream_id: str) -> Any:
        return self.database["_fw_checkpoints"].find_one({"_id": stream_id})

    def test_a_date_out_of_range_is_refused(self) -> None:
        # A BSON date the driver cannot turn into a datetime (year 292278994).
        self.database["_fw_checkpoints"].insert_one(
            {"_id": STREAM, "lastProcessedToken": sample_token(1), "updatedAt": DatetimeMS(2**62)}
        )
        with pytest.raises(UnreadableCheckpointError, match="cannot be decoded"):
            self.make_store().load(STREAM)
        with pytest.raises(UnreadableCheckpointError):
            self.make_store().list()


class TestAsyncMongoCheckpointStore(AsyncCheckpointStoreContract, AsyncSnapshotStoreContract):
    @pytest.fixture(autouse=True)
    async def _backing(
        self, async_client: pymongo.AsyncMongoClient[Any], db_name: str
    ) -> AsyncIterator[None]:
        self.database = async_client[db_name]
        yield
        await async_client.drop_database(db_name)

    def make_store(self) -> AsyncMongoCheckpointStore:
        return AsyncMongoCheckpointStore(self.database)

    async def test_an_unreachable_server_raises(self) -> None:
        dead: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(
            "mongodb://127.0.0.1:1/", serverSelectionTimeoutMS=100, connect=False
        )
        try:
            store = AsyncMongoCheckpointStore(dead["db"])
            with pytest.raises(CheckpointError, match="load failed"):
                await store.load(STREAM)
            with pytest.raises(CheckpointError, match="save failed"):
                await store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
        finally:
            await dead.close()


class TestMotorCheckpointStore(AsyncCheckpointStoreContract, AsyncSnapshotStoreContract):
    """The async store handed a motor database: same methods, same rules."""

    @pytest.fixture(autouse=True)
    async def _backing(self, mongodb_uri: str, db_name: str) -> AsyncIterator[None]:
        motor_asyncio = pytest.importorskip("motor.motor_asyncio")
        motor_client = motor_asyncio.AsyncIOMotorClient(mongodb_uri, serverSelectionTimeoutMS=10_000)
        self.database = motor_client[db_name]
        yield
        await motor_client.drop_database(db_name)
        motor_client.close()

    def make_store(self) -> AsyncMongoCheckpointStore:
        return AsyncMongoCheckpointStore(self.database)


# -- the committer on the Mongo stores ---------------------------------------------------------------


async def test_the_committer_saves_through_the_sync_store_and_survives_a_failed_write(
    client: pymongo.MongoClient[Any], mongodb_uri: str, db_name: str
) -> None:
    app = f"fw-cp-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []
    own: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongodb_uri, appname=app)
    with own:
        store = MongoCheckpointStore(own[db_name])
        committer = CheckpointCommitter(
            store,
            STREAM,
            save_every_n=0,
            save_interval_seconds=0,
            on_save_error=lambda e, n: errors.append(e),
        )
        # Two failures: the driver retries a retryable write once (NetworkTimeout, 89), then the
        # committer sees the second one.
        with _fail_command(client, app, ["update"], error_code=89, times=2):
            await committer.commit(1, sample_token(10))
        assert len(errors) == 1 and isinstance(errors[0], CheckpointError)
        assert store.load(STREAM) is None
        await committer.commit(2, sample_token(20))
        loaded = store.load(STREAM)
        assert loaded is not None and loaded.last_processed_token == sample_token(20)
        assert await committer.close() is True
    client.drop_database(db_name)


async def test_the_committer_saves_through_the_async_store(
    async_client: pymongo.AsyncMongoClient[Any], db_name: str
) -> None:
    store = AsyncMongoCheckpointStore(async_client[db_name])
    committer = CheckpointCommitter(store, STREAM, save_every_n=2, save_interval_seconds=0, epoch=1)
    for sequence in (2, 1, 3):
        await committer.commit(sequence, sample_token(100 + sequence))
    committer.observe_seen(sample_token(500))
    assert await committer.close() is True
    loaded = await store.load(STREAM)
    assert loaded is not None
    assert loaded.last_processed_token == sample_token(103)
    assert loaded.last_seen_token == sample_token(500)
    assert (loaded.events_processed, loaded.epoch) == (3, 1)
    await async_client.drop_database(db_name)


# -- helpers -------------------------------------------------------------------------------------------


class _fail_command:
    """``failCommand`` scoped to one appName, switched off on exit."""

    def __init__(
        self,
        admin_client: pymongo.MongoClient[Any],
        app_name: str,
        commands: list[str],
        *,
        error_code: int,
        times: int | None = None,
    ) -> None:
        self.admin = admin_client.admin
        self.mode: Any = {"times": times} if times is not None else "alwaysOn"
        self.data = {"failCommands": commands, "errorCode": error_code, "appName": app_name}

    def __enter__(self) -> None:
        self.admin.command({"configureFailPoint": "failCommand", "mode": self.mode, "data": self.data})

    def __exit__(self, *exc: object) -> None:
        self.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
