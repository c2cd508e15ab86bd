"""The contract suite on the in-process stores, plus what only the file store can get wrong."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from bson import json_util

from flowwarden.checkpoints import Checkpoint, FileCheckpointStore, InMemoryCheckpointStore, SaveResult
from flowwarden.checkpoints.contract import (
    STREAM,
    CheckpointStoreContract,
    SnapshotStoreContract,
    UnreadableRecordContract,
    damaged_record,
    sample_token,
)
from flowwarden.errors import CheckpointError, UnreadableCheckpointError


class TestInMemoryCheckpointStore(CheckpointStoreContract, SnapshotStoreContract):
    @pytest.fixture(autouse=True)
    def _backing(self) -> None:
        self.backing = InMemoryCheckpointStore()

    def make_store(self) -> InMemoryCheckpointStore:
        # One object is the whole "database": every simulated instance shares it.
        return self.backing

    def test_loaded_checkpoints_cannot_edit_the_store(self) -> None:
        store = self.make_store()
        store.save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1), metadata={"n": {"x": 1}})
        )
        loaded = store.load(STREAM)
        assert loaded is not None
        loaded.metadata["n"]["x"] = 2
        again = store.load(STREAM)
        assert again is not None and again.metadata == {"n": {"x": 1}}


class TestFileCheckpointStore(CheckpointStoreContract, SnapshotStoreContract):
    @pytest.fixture(autouse=True)
    def _backing(self, tmp_path: Path) -> None:
        self.path = tmp_path / "checkpoints.json"

    def make_store(self) -> FileCheckpointStore:
        return FileCheckpointStore(self.path)

    def test_the_file_is_canonical_extended_json(self) -> None:
        self.make_store().save(
            Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1_700_000_000), events_processed=3)
        )
        content = json.loads(self.path.read_text())
        assert content["format"] == "flowwarden-checkpoints"
        document = content["checkpoints"][STREAM]
        assert document["eventsProcessed"] == {"$numberInt": "3"}
        assert document["lastProcessedTimestamp"] == {"$date": {"$numberLong": "1700000000000"}}
        assert document["lastProcessedToken"] == sample_token(1_700_000_000)

    def test_no_temp_files_are_left_behind(self) -> None:
        store = self.make_store()
        for i in range(5):
            store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(i + 1)))
        assert sorted(p.name for p in self.path.parent.iterdir()) == [
            "checkpoints.json",
            "checkpoints.json.lock",
        ]

    def test_an_ignored_save_does_not_rewrite_the_file(self) -> None:
        store = self.make_store()
        store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(5)))
        before = self.path.stat().st_mtime_ns, self.path.stat().st_ino
        assert (
            store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(4)))
            is SaveResult.IGNORED
        )
        assert (self.path.stat().st_mtime_ns, self.path.stat().st_ino) == before

    def test_a_corrupt_file_raises_on_load_instead_of_returning_none(self) -> None:
        self.path.write_text('{"format": "flowwarden-checkpoints", "version": 1, "checkpoints": {')
        with pytest.raises(CheckpointError, match="unreadable"):
            self.make_store().load(STREAM)
        with pytest.raises(CheckpointError):
            self.make_store().save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))

    def test_a_foreign_file_is_not_mistaken_for_an_empty_store(self) -> None:
        self.path.write_text('{"some": "other file"}')
        with pytest.raises(CheckpointError, match="not a flowwarden checkpoint file"):
            self.make_store().list()

    def test_an_unreadable_file_raises(self) -> None:
        self.path.mkdir()  # reading a directory fails with an OSError other than "not found"
        with pytest.raises(CheckpointError, match="cannot read"):
            self.make_store().load(STREAM)

    def test_a_failed_write_leaves_the_old_file_intact(self, monkeypatch: pytest.MonkeyPatch) -> None:
        store = self.make_store()
        store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
        before = self.path.read_bytes()

        def broken_fsync(fd: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fsync", broken_fsync)
        with pytest.raises(CheckpointError, match="No space left"):
            store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2)))
        monkeypatch.undo()
        assert self.path.read_bytes() == before
        assert sorted(p.name for p in self.path.parent.iterdir()) == [
            "checkpoints.json",
            "checkpoints.json.lock",
        ]

    def test_racing_processes_leave_one_record_with_the_newest_token(self) -> None:
        """The OS file lock, not only the thread lock, serialises writers in separate processes."""
        context = multiprocessing.get_context("spawn")
        workers = [
            context.Process(target=_save_many, args=(str(self.path), worker, 15)) for worker in range(3)
        ]
        for process in workers:
            process.start()
        for process in workers:
            process.join(60)
            assert process.exitcode == 0
        records = self.make_store().list()
        assert len(records) == 1
        assert records[0].last_processed_token == sample_token(3000 + 14, 3)
        assert records[0].epoch == 2


def _save_many(path: str, worker: int, rounds: int) -> None:
    """A separate process saving increasing tokens; a lower epoch may be fenced, nothing else."""
    from flowwarden.errors import FencedError

    store = FileCheckpointStore(path)
    for round_ in range(rounds):
        try:
            store.save(
                Checkpoint(
                    stream_id=STREAM,
                    last_processed_token=sample_token(3000 + round_, worker + 1),
                    epoch=worker,
                )
            )
        except FencedError:
            pass


class TestFileStoreWithDamagedRecords(UnreadableRecordContract):
    @pytest.fixture(autouse=True)
    def _backing(self, tmp_path: Path) -> None:
        self.path = tmp_path / "checkpoints.json"

    def make_store(self) -> FileCheckpointStore:
        return FileCheckpointStore(self.path)

    def write_raw(self, document: dict[str, Any]) -> None:
        _write_file(self.path, {document["_id"]: document})

    def read_raw(self, stream_id: str) -> bytes:
        return self.path.read_bytes()


def _write_file(path: Path, checkpoints: dict[str, Any]) -> None:
    content = {"format": "flowwarden-checkpoints", "version": 1, "checkpoints": checkpoints}
    path.write_text(json_util.dumps(content, json_options=json_util.CANONICAL_JSON_OPTIONS))


class TestFileStoreRefusesWhatItCannotRead:
    """A damaged file fails every call with UnreadableCheckpointError and is never rewritten."""

    @pytest.fixture(autouse=True)
    def _backing(self, tmp_path: Path) -> None:
        self.path = tmp_path / "checkpoints.json"
        self.store = FileCheckpointStore(self.path)

    def _refused_everywhere(self) -> None:
        before = self.path.read_bytes()
        with pytest.raises(UnreadableCheckpointError):
            self.store.load(STREAM)
        with pytest.raises(UnreadableCheckpointError):
            self.store.list()
        with pytest.raises(UnreadableCheckpointError):
            self.store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(9)))
        with pytest.raises(UnreadableCheckpointError):
            self.store.save_seen(STREAM, sample_token(9), 0)
        assert self.path.read_bytes() == before

    def test_a_truncated_file(self) -> None:
        self.store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
        whole = self.path.read_bytes()
        self.path.write_bytes(whole[: len(whole) // 2])
        self._refused_everywhere()

    def test_a_file_that_is_not_utf8(self) -> None:
        _write_file(self.path, {STREAM: damaged_record("instanceId", "host-A")})
        self.path.write_bytes(self.path.read_bytes().replace(b"host-A", b"host-\xff"))
        self._refused_everywhere()

    def test_an_entry_that_is_not_an_object(self) -> None:
        _write_file(self.path, {STREAM: 5})
        self._refused_everywhere()

    def test_an_entry_filed_under_another_stream(self) -> None:
        _write_file(self.path, {STREAM: damaged_record("_id", "payments")})
        with pytest.raises(UnreadableCheckpointError, match="payments"):
            self.store.load(STREAM)
        self._refused_everywhere()


def test_temp_files_of_an_interrupted_save_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints.json"
    FileCheckpointStore(path).save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(1)))
    # What a process killed between creating its temp file and renaming it leaves behind.
    leftovers = [tmp_path / f".checkpoints.json.{n}.tmp" for n in ("a1b2", "c3d4")]
    for leftover in leftovers:
        leftover.write_text("partial")
    unrelated = tmp_path / ".other.json.x.tmp"
    unrelated.write_text("not ours")
    store = FileCheckpointStore(path)
    assert store.load(STREAM) is not None  # a read alone takes no lock: nothing removed yet
    store.save(Checkpoint(stream_id=STREAM, last_processed_token=sample_token(2)))
    assert not any(leftover.exists() for leftover in leftovers)
    assert unrelated.exists()
