"""The MongoDB checkpoint stores against the driver: the collection options they ask for, what they
raise when the driver fails, and how a conditional write that keeps colliding ends. A database
double stands in for PyMongo here, so each driver failure happens exactly where the test puts it;
the contract suite (test_mongo_stores.py) runs the stores against a server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from bson.errors import InvalidBSON
from pymongo import ReadPreference, WriteConcern
from pymongo.errors import AutoReconnect, DuplicateKeyError

from flowwarden.checkpoints import AsyncMongoCheckpointStore, Checkpoint, MongoCheckpointStore, SaveResult
from flowwarden.checkpoints.contract import sample_token
from flowwarden.checkpoints.model import SnapshotProgress
from flowwarden.errors import CheckpointError, FencedError, UnreadableCheckpointError

STREAM = "orders"
DOWN = AutoReconnect("connection refused")
HINT = "Check that MongoDB is reachable and the user may read and write the checkpoint collection."


class Collection:
    """The methods the stores call, each answering with ``answers[method](*args)`` (a value, or
    an exception raised); ``calls`` records them."""

    full_name = "shop._fw_checkpoints"

    def __init__(self, **answers: Callable[..., Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def _answer(self, method: str, *args: Any) -> Any:
        self.calls.append(method)
        result = self.answers[method](*args)
        if isinstance(result, BaseException):
            raise result
        return result

    def find_one(self, query: Any) -> Any:
        return self._answer("find_one", query)

    def update_one(self, query: Any, update: Any, upsert: bool = False) -> Any:
        return self._answer("update_one", query, update)

    def delete_one(self, query: Any) -> Any:
        return self._answer("delete_one", query)

    def find(self, query: Any, sort: Any = None) -> Any:
        return self._answer("find", query)


class AsyncCollection(Collection):
    async def find_one(self, query: Any) -> Any:  # type: ignore[override]
        return super().find_one(query)

    async def update_one(self, query: Any, update: Any, upsert: bool = False) -> Any:  # type: ignore[override]
        return super().update_one(query, update, upsert)

    async def delete_one(self, query: Any) -> Any:  # type: ignore[override]
        return super().delete_one(query)

    def find(self, query: Any, sort: Any = None) -> Any:
        documents = super().find(query, sort)

        async def each() -> AsyncIterator[Any]:
            for document in documents:
                yield document

        return each()


class Database:
    """``get_collection`` returns the double and remembers the options it was asked for."""

    def __init__(self, collection: Collection) -> None:
        self.collection = collection
        self.asked: tuple[str, dict[str, Any]] | None = None

    def get_collection(self, name: str, **options: Any) -> Collection:
        self.asked = (name, options)
        return self.collection


def failing(error: BaseException) -> Callable[..., BaseException]:
    return lambda *args: error


def stores(collection: Collection) -> list[Callable[[str], Any]]:
    """Each operation of the sync and the async store as a call that returns its outcome."""
    sync = MongoCheckpointStore(Database(collection))  # type: ignore[arg-type]
    asynchronous = AsyncMongoCheckpointStore(Database(_async_copy(collection)))

    def run(store: Any, name: str, *args: Any) -> Any:
        outcome = getattr(store, name)(*args)
        return asyncio.run(outcome) if asyncio.iscoroutine(outcome) else outcome

    return [lambda op, *a, s=store: run(s, op, *a) for store in (sync, asynchronous)]


def _async_copy(collection: Collection) -> AsyncCollection:
    return AsyncCollection(**collection.answers)


OPERATIONS: list[tuple[str, tuple[Any, ...], str]] = [
    ("load", (STREAM,), "load"),
    ("save", (Checkpoint(stream_id=STREAM, last_processed_token=sample_token(5)),), "save"),
    ("save_seen", (STREAM, sample_token(5), 0), "save"),
    ("delete", (STREAM,), "delete"),
    ("rewind", (STREAM, sample_token(5)), "rewind"),
]


@pytest.mark.parametrize("store", [0, 1], ids=["sync", "async"])
@pytest.mark.parametrize(("operation", "args", "action"), OPERATIONS, ids=[o[0] for o in OPERATIONS])
def test_a_driver_failure_is_a_checkpoint_error_naming_the_stream_and_the_operation(
    store: int, operation: str, args: tuple[Any, ...], action: str
) -> None:
    collection = Collection(
        find_one=failing(DOWN), update_one=failing(DOWN), delete_one=failing(DOWN), find=failing(DOWN)
    )
    with pytest.raises(CheckpointError) as raised:
        stores(collection)[store](operation, *args)
    error = raised.value
    assert type(error) is CheckpointError
    assert (error.stream, error.__cause__) == (STREAM, DOWN)
    assert str(error) == (
        f"stream 'orders': checkpoint {action} failed: AutoReconnect: connection refused. {HINT}"
    )


@pytest.mark.parametrize("store", [0, 1], ids=["sync", "async"])
def test_a_failed_list_names_no_stream(store: int) -> None:
    with pytest.raises(CheckpointError) as raised:
        stores(Collection(find=failing(DOWN)))[store]("list")
    assert (raised.value.stream, raised.value.__cause__) == (None, DOWN)
    assert str(raised.value) == f"checkpoint list failed: AutoReconnect: connection refused. {HINT}"


@pytest.mark.parametrize("store", [0, 1], ids=["sync", "async"])
def test_a_document_the_driver_cannot_decode_is_unreadable_and_named(store: int) -> None:
    broken = InvalidBSON("year 0 is out of range")
    with pytest.raises(UnreadableCheckpointError) as raised:
        stores(Collection(find_one=failing(broken)))[store]("load", STREAM)
    assert (raised.value.stream, raised.value.__cause__) == (STREAM, broken)
    assert str(raised.value) == (
        "the checkpoint of stream 'orders' cannot be decoded: year 0 is out of range. Fix or delete it "
        "(`flowwarden checkpoints delete`); flowwarden will not guess a position."
    )
    with pytest.raises(UnreadableCheckpointError) as listed:
        stores(Collection(find=failing(broken)))[store]("list")
    assert (listed.value.stream, listed.value.__cause__) == (None, broken)
    assert str(listed.value) == (
        "a checkpoint document cannot be decoded: year 0 is out of range. Fix or delete it "
        "(`flowwarden checkpoints delete`); flowwarden will not guess a position."
    )


@pytest.mark.parametrize("store", [0, 1], ids=["sync", "async"])
def test_a_write_that_keeps_colliding_with_other_writers_gives_up_after_5_attempts(store: int) -> None:
    # Each collision finds a document the write would now match: someone rewound it in between.
    older = Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)).to_document()
    collection = Collection(update_one=failing(DuplicateKeyError("E11000")), find_one=lambda query: older)
    with pytest.raises(CheckpointError) as raised:
        stores(collection)[store]("save", Checkpoint(stream_id=STREAM, last_processed_token=sample_token(5)))
    assert raised.value.stream == STREAM
    assert str(raised.value) == (
        "stream 'orders': the checkpoint document kept changing under a conditional write (5 attempts); "
        "another process is rewinding or deleting it. Stop the other writer and try again."
    )


def test_a_snapshot_save_that_collided_with_a_rewind_is_written_on_the_next_attempt() -> None:
    updates = iter([DuplicateKeyError("E11000"), None])
    rewound = Checkpoint(stream_id=STREAM).to_document()  # no snapshot any more: the save applies
    collection = Collection(update_one=lambda *args: next(updates), find_one=lambda query: rewound)
    progress = SnapshotProgress(token=sample_token(1), namespaces=("shop.orders",), namespace="shop.orders")
    store = MongoCheckpointStore(Database(collection))  # type: ignore[arg-type]
    assert store.save_snapshot(STREAM, progress, 0) is SaveResult.STORED
    assert collection.calls == ["update_one", "find_one", "update_one"]


def test_a_fenced_snapshot_save_names_the_stream() -> None:
    newer = Checkpoint(stream_id=STREAM, epoch=5).to_document()
    collection = Collection(update_one=failing(DuplicateKeyError("E11000")), find_one=lambda query: newer)
    progress = SnapshotProgress(token=sample_token(1), namespaces=("shop.orders",), namespace="shop.orders")
    with pytest.raises(FencedError) as raised:
        MongoCheckpointStore(Database(collection)).save_snapshot(STREAM, progress, 4)  # type: ignore[arg-type]
    assert raised.value.stream == STREAM


@pytest.mark.parametrize("kind", [MongoCheckpointStore, AsyncMongoCheckpointStore])
def test_the_collection_is_read_from_the_primary_and_written_with_majority_by_default(kind: type) -> None:
    database = Database(Collection())
    kind(database)
    assert database.asked == (
        "_fw_checkpoints",
        {"read_preference": ReadPreference.PRIMARY, "write_concern": WriteConcern(w="majority")},
    )
    kind(database, "checkpoints", write_concern=None)
    assert database.asked == ("checkpoints", {"read_preference": ReadPreference.PRIMARY})
    kind(database, write_concern=WriteConcern(w=1))
    assert database.asked is not None and database.asked[1]["write_concern"] == WriteConcern(w=1)
