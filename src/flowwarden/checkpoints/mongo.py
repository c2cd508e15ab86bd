"""Checkpoint stores in a MongoDB collection (``_fw_checkpoints`` by default), sync and asyncio.

Every save is ONE conditional single-document update with upsert: the filter admits the write
only when the stored epoch is not higher and the stored token is older, so no read-modify-write
race exists. When the filter does not match an existing document, the upsert's insert collides on
``_id`` (duplicate key, code 11000); the store then reads the document once to tell the caller
why: a higher epoch (FencedError) or a same-or-newer position (IGNORED). Two racing first
inserts resolve the same way, so a stream never has two documents.

Tokens are compared on ``_data``: upper-case hex of KeyString bytes, whose string order is the
oplog order. Writes use majority write concern by default, so a saved checkpoint survives a
failover; reads go to the primary so a restart never resumes from a stale copy.

The sync and the asyncio store share every rule: each operation is written once, as a procedure
of the driver calls it needs (:mod:`flowwarden.mongo.calls`), and each store only runs it, with
blocking or awaited calls.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import Any

from bson.errors import InvalidBSON
from pymongo import ReadPreference, WriteConcern
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, PyMongoError

from flowwarden.checkpoints.model import (
    DEFAULT_COLLECTION,
    F_BATCH_END,
    F_EPOCH,
    F_EVENTS,
    F_ID,
    F_INCREMENTAL,
    F_INSTANCE,
    F_INSTANCE_TOKEN,
    F_METADATA,
    F_PROCESSED_AT,
    F_PROCESSED_TOKEN,
    F_SEEN_AT,
    F_SEEN_TOKEN,
    F_SNAPSHOT,
    F_UPDATED_AT,
    Checkpoint,
    IncrementalProgress,
    SaveResult,
    SnapshotProgress,
    copy_token,
    token_time,
    utc_now,
)
from flowwarden.checkpoints.transitions import (
    apply_save_incremental,
    apply_save_snapshot,
    check_epoch,
    is_newer,
    require_processed_token,
)
from flowwarden.errors import CheckpointError, UnreadableCheckpointError
from flowwarden.events import ResumeToken, token_data
from flowwarden.mongo.calls import Procedure, call, find_all, run, run_async

MAJORITY = WriteConcern(w="majority")

# A duplicate key followed by a read that finds the write would now match means another writer
# (a rewind or delete) changed the document between the two calls; the write is tried again,
# a few times at most, since each retry needs yet another concurrent change to fail again.
_CONFLICT_ATTEMPTS = 5


# -- the conditional writes, shared by the sync and the async store --------------------------------


def _epoch_allows(epoch: int) -> dict[str, Any]:
    # A missing epoch (a FlowWarden-for-Java document) counts as epoch 0.
    return {"$or": [{F_EPOCH: {"$lte": epoch}}, {F_EPOCH: None}]}


def _token_older_than(field: str, data: str) -> dict[str, Any]:
    # {field: None} matches a null or missing token, i.e. "no position yet".
    return {"$or": [{f"{field}._data": {"$lt": data}}, {field: None}]}


# What a record holds where a write creates it (an upsert): every field the write does not set.
_NEW_RECORD: dict[str, Any] = {
    F_INSTANCE: None,
    F_INSTANCE_TOKEN: None,
    F_PROCESSED_TOKEN: None,
    F_PROCESSED_AT: None,
    F_SEEN_TOKEN: None,
    F_SEEN_AT: None,
    F_EVENTS: 0,
    F_EPOCH: 0,
    F_METADATA: {},
}


def _upsert_update(written: dict[str, Any]) -> dict[str, Any]:
    """The update of an upsert that sets ``written``: a record it creates gets the rest of
    :data:`_NEW_RECORD`."""
    created = {field: value for field, value in _NEW_RECORD.items() if field not in written}
    if F_METADATA in created:
        created[F_METADATA] = {}  # a fresh document for each write, never the shared default
    return {"$set": written, "$setOnInsert": created}


def _save_write(checkpoint: Checkpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    data = require_processed_token(checkpoint)
    query = {
        F_ID: checkpoint.stream_id,
        "$and": [_epoch_allows(checkpoint.epoch), _token_older_than(F_PROCESSED_TOKEN, data)],
    }
    update = _upsert_update(
        {
            F_INSTANCE: checkpoint.instance_id,
            F_INSTANCE_TOKEN: checkpoint.instance_token,
            F_PROCESSED_TOKEN: copy_token(checkpoint.last_processed_token),
            F_PROCESSED_AT: checkpoint.last_processed_at,
            F_EVENTS: checkpoint.events_processed,
            F_EPOCH: checkpoint.epoch,
            F_UPDATED_AT: utc_now(),
            F_METADATA: dict(checkpoint.metadata),
        }
    )
    return query, update


def _seen_write(stream_id: str, token: ResumeToken, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    seen = copy_token(token)
    query = {
        F_ID: stream_id,
        "$and": [_epoch_allows(epoch), _token_older_than(F_SEEN_TOKEN, token_data(token))],
    }
    update = _upsert_update(
        {
            F_SEEN_TOKEN: seen,
            F_SEEN_AT: token_time(seen),
            F_EPOCH: epoch,
            F_UPDATED_AT: utc_now(),
        }
    )
    return query, update


def _batch_end_write(stream_id: str, token: ResumeToken, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    query = {
        F_ID: stream_id,
        "$and": [_epoch_allows(epoch), _token_older_than(F_BATCH_END, token_data(token))],
    }
    update = _upsert_update({F_BATCH_END: copy_token(token), F_EPOCH: epoch, F_UPDATED_AT: utc_now()})
    return query, update


def _rewind_write(stream_id: str, token: ResumeToken | None) -> tuple[dict[str, Any], dict[str, Any]]:
    processed = copy_token(token)
    update = _upsert_update(
        {
            F_PROCESSED_TOKEN: processed,
            F_PROCESSED_AT: token_time(processed),
            F_SEEN_TOKEN: None,
            F_SEEN_AT: None,
            F_BATCH_END: None,
            F_SNAPSHOT: None,
            F_UPDATED_AT: utc_now(),
        }
    )
    return {F_ID: stream_id}, update


def _conflict_result(
    current: Checkpoint | None, stream_id: str, token: ResumeToken, epoch: int, slot: str
) -> SaveResult | None:
    """Why a conditional upsert collided: IGNORED, FencedError, or None to try the write again."""
    if current is None:
        return None  # deleted since the collision; the next insert will succeed
    check_epoch(current, stream_id, epoch)
    stored = {
        F_PROCESSED_TOKEN: current.last_processed_token,
        F_SEEN_TOKEN: current.last_seen_token,
        F_BATCH_END: current.batch_end_token,
    }[slot]
    if not is_newer(token, stored):
        return SaveResult.IGNORED
    return None


def _read(document: Mapping[str, Any] | None) -> Checkpoint | None:
    return None if document is None else Checkpoint.from_document(document)


def _undecodable(stream_id: str | None, exc: InvalidBSON) -> UnreadableCheckpointError:
    """A stored document the driver cannot decode (a date out of range, broken UTF-8)."""
    which = f"the checkpoint of stream {stream_id!r}" if stream_id else "a checkpoint document"
    return UnreadableCheckpointError(
        f"{which} cannot be decoded: {exc}. Fix or delete it (`flowwarden checkpoints delete`); "
        "flowwarden will not guess a position.",
        stream=stream_id,
    )


def _failure(action: str, stream_id: str | None, exc: PyMongoError) -> CheckpointError:
    where = f"stream {stream_id!r}: " if stream_id else ""
    return CheckpointError(
        f"{where}checkpoint {action} failed: {type(exc).__name__}: {exc}. Check that MongoDB is "
        "reachable and the user may read and write the checkpoint collection.",
        stream=stream_id,
    )


def _gave_up(stream_id: str) -> CheckpointError:
    return CheckpointError(
        f"stream {stream_id!r}: the checkpoint document kept changing under a conditional write "
        f"({_CONFLICT_ATTEMPTS} attempts); another process is rewinding or deleting it. Stop the "
        "other writer and try again.",
        stream=stream_id,
    )


def _collection_options(write_concern: WriteConcern | None) -> dict[str, Any]:
    options: dict[str, Any] = {"read_preference": ReadPreference.PRIMARY}
    if write_concern is not None:
        options["write_concern"] = write_concern
    return options


# -- each operation once, as a procedure of driver calls -------------------------------------------
#
# Each operation is a procedure (flowwarden.mongo.calls): it yields the collection calls it needs
# and decides what their results and errors mean. The sync store runs it with blocking calls, the
# asyncio store awaits the same calls; neither holds any rule of its own.


def _load(collection: Any, stream_id: str) -> Procedure[Checkpoint | None]:
    try:
        document = yield call(collection, "find_one", {F_ID: stream_id})
    except PyMongoError as exc:
        raise _failure("load", stream_id, exc) from exc
    except InvalidBSON as exc:
        raise _undecodable(stream_id, exc) from exc
    return _read(document)


def _conditional(
    collection: Any,
    stream_id: str,
    write: tuple[dict[str, Any], dict[str, Any]],
    token: ResumeToken,
    epoch: int,
    slot: str,
) -> Procedure[SaveResult]:
    return _upsert(
        collection, stream_id, write, lambda current: _conflict_result(current, stream_id, token, epoch, slot)
    )


def _upsert(
    collection: Any,
    stream_id: str,
    write: tuple[dict[str, Any], dict[str, Any]],
    collided: Callable[[Checkpoint | None], SaveResult | None],
) -> Procedure[SaveResult]:
    """A conditional upsert; when its condition fails (a duplicate key), ``collided(stored)``
    says why: IGNORED, a FencedError, or None to try the write again."""
    query, update = write
    for _ in range(_CONFLICT_ATTEMPTS):
        try:
            yield call(collection, "update_one", query, update, upsert=True)
            return SaveResult.STORED
        except DuplicateKeyError:
            result = collided((yield from _load(collection, stream_id)))
            if result is not None:
                return result
        except PyMongoError as exc:
            raise _failure("save", stream_id, exc) from exc
    raise _gave_up(stream_id)


def _save_snapshot(
    collection: Any, stream_id: str, progress: SnapshotProgress, epoch: int
) -> Procedure[SaveResult]:
    data = token_data(progress.token)
    # Progress of the stored snapshot only moves forward; another snapshot's replaces it.
    query = {
        F_ID: stream_id,
        "$and": [
            _epoch_allows(epoch),
            {
                "$or": [
                    {F_SNAPSHOT: None},
                    {f"{F_SNAPSHOT}.token._data": {"$ne": data}},
                    {f"{F_SNAPSHOT}.order": {"$lt": progress.order}},
                ]
            },
        ],
    }
    update = _upsert_update({F_SNAPSHOT: progress.to_document(), F_EPOCH: epoch, F_UPDATED_AT: utc_now()})

    def collided(current: Checkpoint | None) -> SaveResult | None:
        if current is None:
            return None
        result, _ = apply_save_snapshot(current, stream_id, progress, epoch, utc_now())
        return SaveResult.IGNORED if result is SaveResult.IGNORED else None

    return _upsert(collection, stream_id, (query, update), collided)


def _save_incremental(
    collection: Any, stream_id: str, progress: IncrementalProgress, epoch: int
) -> Procedure[SaveResult]:
    # Progress of the stored request only moves forward; another request's replaces it.
    query = {
        F_ID: stream_id,
        "$and": [
            _epoch_allows(epoch),
            {
                "$or": [
                    {F_INCREMENTAL: None},
                    {f"{F_INCREMENTAL}.request": {"$ne": progress.request}},
                    {f"{F_INCREMENTAL}.order": {"$lt": progress.order}},
                ]
            },
        ],
    }
    update = _upsert_update({F_INCREMENTAL: progress.to_document(), F_EPOCH: epoch, F_UPDATED_AT: utc_now()})

    def collided(current: Checkpoint | None) -> SaveResult | None:
        if current is None:
            return None
        result, _ = apply_save_incremental(current, stream_id, progress, epoch, utc_now())
        return SaveResult.IGNORED if result is SaveResult.IGNORED else None

    return _upsert(collection, stream_id, (query, update), collided)


def _save(collection: Any, checkpoint: Checkpoint) -> Procedure[SaveResult]:
    write = _save_write(checkpoint)
    assert checkpoint.last_processed_token is not None
    return _conditional(
        collection,
        checkpoint.stream_id,
        write,
        checkpoint.last_processed_token,
        checkpoint.epoch,
        F_PROCESSED_TOKEN,
    )


def _save_seen(collection: Any, stream_id: str, token: ResumeToken, epoch: int) -> Procedure[SaveResult]:
    write = _seen_write(stream_id, token, epoch)
    return _conditional(collection, stream_id, write, token, epoch, F_SEEN_TOKEN)


def _save_batch_end(collection: Any, stream_id: str, token: ResumeToken, epoch: int) -> Procedure[SaveResult]:
    write = _batch_end_write(stream_id, token, epoch)
    return _conditional(collection, stream_id, write, token, epoch, F_BATCH_END)


def _delete(collection: Any, stream_id: str) -> Procedure[bool]:
    try:
        result = yield call(collection, "delete_one", {F_ID: stream_id})
    except PyMongoError as exc:
        raise _failure("delete", stream_id, exc) from exc
    return bool(result.deleted_count == 1)


def _list(collection: Any) -> Procedure[builtins.list[Checkpoint]]:
    try:
        documents = yield find_all(collection, {}, sort=[(F_ID, 1)])
    except PyMongoError as exc:
        raise _failure("list", None, exc) from exc
    except InvalidBSON as exc:
        raise _undecodable(None, exc) from exc
    return [Checkpoint.from_document(document) for document in documents]


def _rewind(collection: Any, stream_id: str, token: ResumeToken | None) -> Procedure[None]:
    query, update = _rewind_write(stream_id, token)
    try:
        yield call(collection, "update_one", query, update, upsert=token is not None)
    except PyMongoError as exc:
        raise _failure("rewind", stream_id, exc) from exc


# -- the two stores -----------------------------------------------------------------------------------


class MongoCheckpointStore:
    """A :class:`~flowwarden.checkpoints.CheckpointStore` in ``database[collection]`` (PyMongo, blocking).

    ``write_concern`` defaults to majority; pass ``None`` to use the database's own.
    """

    in_mongodb = True

    def __init__(
        self,
        database: Database[Any],
        collection: str = DEFAULT_COLLECTION,
        *,
        write_concern: WriteConcern | None = MAJORITY,
    ) -> None:
        self.collection: Collection[Any] = database.get_collection(
            collection, **_collection_options(write_concern)
        )

    def load(self, stream_id: str) -> Checkpoint | None:
        return run(_load(self.collection, stream_id))

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        return run(_save(self.collection, checkpoint))

    def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return run(_save_seen(self.collection, stream_id, token, epoch))

    def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return run(_save_batch_end(self.collection, stream_id, token, epoch))

    def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        return run(_save_snapshot(self.collection, stream_id, progress, epoch))

    def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult:
        return run(_save_incremental(self.collection, stream_id, progress, epoch))

    def delete(self, stream_id: str) -> bool:
        return run(_delete(self.collection, stream_id))

    def list(self) -> builtins.list[Checkpoint]:
        return run(_list(self.collection))

    def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        run(_rewind(self.collection, stream_id, token))

    def __repr__(self) -> str:
        return f"MongoCheckpointStore({self.collection.full_name!r})"


class AsyncMongoCheckpointStore:
    """An :class:`~flowwarden.checkpoints.AsyncCheckpointStore` in ``database[collection]``.

    ``database`` is a PyMongo ``AsyncDatabase`` or a motor ``AsyncIOMotorDatabase``: both have the
    same method names and return awaitables. ``write_concern`` defaults to majority.
    """

    in_mongodb = True

    def __init__(
        self,
        database: Any,
        collection: str = DEFAULT_COLLECTION,
        *,
        write_concern: WriteConcern | None = MAJORITY,
    ) -> None:
        self.collection: Any = database.get_collection(collection, **_collection_options(write_concern))

    async def load(self, stream_id: str) -> Checkpoint | None:
        return await run_async(_load(self.collection, stream_id))

    async def save(self, checkpoint: Checkpoint) -> SaveResult:
        return await run_async(_save(self.collection, checkpoint))

    async def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return await run_async(_save_seen(self.collection, stream_id, token, epoch))

    async def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        return await run_async(_save_batch_end(self.collection, stream_id, token, epoch))

    async def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        return await run_async(_save_snapshot(self.collection, stream_id, progress, epoch))

    async def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult:
        return await run_async(_save_incremental(self.collection, stream_id, progress, epoch))

    async def delete(self, stream_id: str) -> bool:
        return await run_async(_delete(self.collection, stream_id))

    async def list(self) -> builtins.list[Checkpoint]:
        return await run_async(_list(self.collection))

    async def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        await run_async(_rewind(self.collection, stream_id, token))

    def __repr__(self) -> str:
        return f"AsyncMongoCheckpointStore({self.collection.full_name!r})"


__all__ = ["AsyncMongoCheckpointStore", "MongoCheckpointStore"]
