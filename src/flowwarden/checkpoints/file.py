"""A checkpoint store in one local JSON file, for users who may not write to the source database.

All streams share the file. Every write is a read-modify-write under an exclusive lock (a
``threading.Lock`` for this process plus an OS file lock on ``<path>.lock`` for other processes),
and the new content replaces the old by temp file + fsync + ``os.replace``, so a crash leaves
either the old or the new file, never a torn one. Values are MongoDB extended JSON (canonical),
so tokens, dates and 64-bit integers round-trip exactly.

A file that cannot be read (truncated, not UTF-8, not this format, an entry that is not a
checkpoint) raises :class:`~flowwarden.errors.UnreadableCheckpointError` and is never rewritten:
every write reads the file first, so a damaged file stops the writers instead of being replaced
by a file that lost the other streams' positions. Temp files left by a process killed in the
middle of a save are removed the first time a store takes the file lock.
"""

from __future__ import annotations

import builtins
import contextlib
import glob
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from bson import json_util

from flowwarden.checkpoints.model import (
    Checkpoint,
    IncrementalProgress,
    SaveResult,
    SnapshotProgress,
    utc_now,
)
from flowwarden.checkpoints.transitions import (
    apply_rewind,
    apply_save,
    apply_save_batch_end,
    apply_save_incremental,
    apply_save_seen,
    apply_save_snapshot,
)
from flowwarden.errors import CheckpointError, UnreadableCheckpointError
from flowwarden.events import ResumeToken

if sys.platform == "win32":
    import msvcrt

    def _lock_fd(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_LOCK, 1)

    def _unlock_fd(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


_FORMAT = "flowwarden-checkpoints"
_VERSION = 1
_JSON_OPTIONS = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True)

# One lock per file for every store object of this process: two stores on one path (two
# connectors in one process) must not interleave their read-modify-writes either.
_PROCESS_LOCKS: dict[str, threading.Lock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()

T = TypeVar("T")


def _process_lock(path: Path) -> threading.Lock:
    key = os.path.realpath(path)
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(key, threading.Lock())


class FileCheckpointStore:
    """A :class:`~flowwarden.checkpoints.CheckpointStore` in one JSON file at ``path``.

    The directory must exist; the file is created by the first write. Put it on local disk:
    the OS file lock is what serialises writers across processes, and network file systems
    do not all honour it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._thread_lock = _process_lock(self.path)
        self._swept = False

    # -- reads ------------------------------------------------------------------------------

    def load(self, stream_id: str) -> Checkpoint | None:
        document = self._read(stream_id).get(stream_id)
        return None if document is None else _checkpoint(self.path, stream_id, document)

    def list(self) -> builtins.list[Checkpoint]:
        documents = self._read(None)
        return [_checkpoint(self.path, key, documents[key]) for key in sorted(documents)]

    # -- writes -----------------------------------------------------------------------------

    def save(self, checkpoint: Checkpoint) -> SaveResult:
        def change(current: Checkpoint | None) -> tuple[SaveResult, Checkpoint | None]:
            return apply_save(current, checkpoint, utc_now())

        return self._modify(checkpoint.stream_id, change)

    def save_seen(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        def change(current: Checkpoint | None) -> tuple[SaveResult, Checkpoint | None]:
            return apply_save_seen(current, stream_id, token, epoch, utc_now())

        return self._modify(stream_id, change)

    def save_batch_end(self, stream_id: str, token: ResumeToken, epoch: int) -> SaveResult:
        def change(current: Checkpoint | None) -> tuple[SaveResult, Checkpoint | None]:
            return apply_save_batch_end(current, stream_id, token, epoch, utc_now())

        return self._modify(stream_id, change)

    def save_snapshot(self, stream_id: str, progress: SnapshotProgress, epoch: int) -> SaveResult:
        def change(current: Checkpoint | None) -> tuple[SaveResult, Checkpoint | None]:
            return apply_save_snapshot(current, stream_id, progress, epoch, utc_now())

        return self._modify(stream_id, change)

    def save_incremental(self, stream_id: str, progress: IncrementalProgress, epoch: int) -> SaveResult:
        def change(current: Checkpoint | None) -> tuple[SaveResult, Checkpoint | None]:
            return apply_save_incremental(current, stream_id, progress, epoch, utc_now())

        return self._modify(stream_id, change)

    def delete(self, stream_id: str) -> bool:
        def change(current: Checkpoint | None) -> tuple[bool, Checkpoint | None]:
            return current is not None, None

        return self._modify(stream_id, change, remove=True)

    def rewind(self, stream_id: str, token: ResumeToken | None) -> None:
        def change(current: Checkpoint | None) -> tuple[None, Checkpoint | None]:
            return None, apply_rewind(current, stream_id, token, utc_now())

        self._modify(stream_id, change)

    # -- internals --------------------------------------------------------------------------

    def _modify(
        self,
        stream_id: str,
        change: Callable[[Checkpoint | None], tuple[T, Checkpoint | None]],
        *,
        remove: bool = False,
    ) -> T:
        """Run ``change`` on the stream's record under both locks and write the result if it changed."""
        with self._locked(stream_id):
            documents = self._read(stream_id)
            before = documents.get(stream_id)
            current = None if before is None else _checkpoint(self.path, stream_id, before)
            outcome, record = change(current)
            if remove:
                if before is None:
                    return outcome
                del documents[stream_id]
            elif record is None or record is current:
                return outcome
            else:
                documents[stream_id] = record.to_document()
            self._write(stream_id, documents)
            return outcome

    @contextlib.contextmanager
    def _locked(self, stream_id: str) -> Iterator[None]:
        with self._thread_lock:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot open the checkpoint lock file {str(self._lock_path)!r}: {exc}",
                    stream=stream_id,
                ) from exc
            try:
                _lock_fd(fd)
                try:
                    if not self._swept:
                        self._sweep_temp_files()
                    yield
                finally:
                    _unlock_fd(fd)
            finally:
                os.close(fd)

    def _sweep_temp_files(self) -> None:
        """Remove temp files of saves that never finished (their process died before the rename).

        Runs under the file lock, which every writer holds from creating its temp file to
        renaming it, so no temp file found here belongs to a save in progress.
        """
        for leftover in self.path.parent.glob(f".{glob.escape(self.path.name)}.*.tmp"):
            with contextlib.suppress(OSError):
                leftover.unlink()
        self._swept = True

    def _read(self, stream_id: str | None) -> dict[str, dict[str, Any]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(
                f"cannot read the checkpoint file {str(self.path)!r}: {exc}", stream=stream_id
            ) from exc
        try:
            text = raw.decode("utf-8")
            content = json_util.loads(text, json_options=_JSON_OPTIONS)
            if not isinstance(content, dict) or content.get("format") != _FORMAT:
                raise ValueError(f"not a flowwarden checkpoint file (expected format {_FORMAT!r})")
            if content.get("version") != _VERSION:
                raise ValueError(f"unsupported version {content.get('version')!r}, expected {_VERSION}")
            documents = content.get("checkpoints")
            if not isinstance(documents, dict):
                raise ValueError("'checkpoints' must be an object keyed by stream id")
        except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UnreadableCheckpointError(
                f"the checkpoint file {str(self.path)!r} is unreadable: {exc}. Restore it from a "
                "backup or remove it (every stream then starts from its start_position).",
                stream=stream_id,
            ) from exc
        return documents

    def _write(self, stream_id: str, documents: dict[str, dict[str, Any]]) -> None:
        content = {"format": _FORMAT, "version": _VERSION, "checkpoints": documents}
        text = json_util.dumps(content, json_options=_JSON_OPTIONS, indent=1, sort_keys=True)
        directory = self.path.parent
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as tmp:
                    tmp.write(text)
                    tmp.flush()
                    os.fsync(tmp.fileno())
                os.replace(tmp_name, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
                raise
            _fsync_directory(directory)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write the checkpoint file {str(self.path)!r}: {exc}", stream=stream_id
            ) from exc

    def __repr__(self) -> str:
        return f"FileCheckpointStore({str(self.path)!r})"


def _checkpoint(path: Path, key: str, document: Any) -> Checkpoint:
    """The checkpoint stored under ``key``, checked to be a record of that very stream."""
    if not isinstance(document, dict):
        raise UnreadableCheckpointError(
            f"the checkpoint file {str(path)!r} holds {type(document).__name__} {document!r:.80} for "
            f"stream {key!r} instead of a checkpoint record. Fix or remove that entry.",
            stream=key,
        )
    if document.get("_id") != key:
        raise UnreadableCheckpointError(
            f"the checkpoint file {str(path)!r} holds the record of {document.get('_id')!r} under "
            f"stream {key!r}; the file was edited by hand. Fix the entry's key or its _id.",
            stream=key,
        )
    return Checkpoint.from_document(document)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); Windows has no directory handles to sync."""
    if sys.platform == "win32":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FileCheckpointStore"]
