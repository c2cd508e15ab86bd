"""Logical sessions, multi-document transactions and retryable writes.

A transaction reads and writes a private :class:`Catalog` that copies each collection from the
server's catalog on first access; nothing it writes is visible to anyone else until commit. Commit
checks that no other write touched the documents the transaction wrote since it copied them
(WriteConflict otherwise), installs the new documents, and hands all of the transaction's oplog
ops to the log it is given, in ONE call: one cluster time for the whole transaction, as MongoDB
does (the host logs them as one entry, or one entry per shard at one commit time).

A write outside any transaction to a document an open transaction has written waits for that
transaction to end (:meth:`SessionRegistry.wait_for_transaction_end`), as mongod's does: every
commit, abort and expiry wakes the waiting writes, which then try again.

A retryable write (``lsid`` + ``txnNumber``, no ``autocommit``) stores its reply; the same
``txnNumber`` again returns that reply without writing twice.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowwarden_embedded.crud import write_conflict
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.oplog import OplogOp
from flowwarden_embedded.storage import Catalog, Collection, Document, DuplicateKey

# MongoDB's transactionLifetimeLimitSeconds default: an open transaction older than this is aborted.
TRANSACTION_LIFETIME_SECONDS = 60.0

# Commands MongoDB refuses inside a multi-document transaction.
_NOT_IN_TRANSACTION = frozenset(
    {
        "count",
        "listCollections",
        "listIndexes",
        "listDatabases",
        "drop",
        "dropDatabase",
        "renameCollection",
        "collMod",
        "dropIndexes",
        "createIndexes",
        "configureFailPoint",
        "endSessions",
        "killCursors",
        "getCmdLineOpts",
        "serverStatus",
        "buildInfo",
        "getParameter",
    }
)
TRANSACTION_CONTROL = frozenset({"commitTransaction", "abortTransaction"})


class TxnState(enum.Enum):
    IN_PROGRESS = "inProgress"
    COMMITTED = "committed"
    ABORTED = "aborted"


_txn_ids = itertools.count(1)


@dataclass(slots=True)
class Transaction:
    number: int
    catalog: Catalog
    started: float = field(default_factory=time.monotonic)
    state: TxnState = TxnState.IN_PROGRESS
    ops: list[OplogOp] = field(default_factory=list)
    txn_id: int = field(default_factory=lambda: next(_txn_ids))


@dataclass(slots=True)
class Session:
    key: Hashable
    lsid: Document
    last_used: float = field(default_factory=time.monotonic)
    txn_number: int = -1
    txn: Transaction | None = None
    # Retryable writes: the reply of the newest txnNumber executed outside a transaction.
    retry_number: int = -1
    retry_reply: dict[str, Any] | None = None


def session_key(lsid: Any) -> Hashable:
    """The registry key of an ``lsid`` document (its ``id`` UUID bytes, plus ``uid`` if present)."""
    if not isinstance(lsid, dict) or "id" not in lsid:
        raise CommandError(40414, "BSON field 'OperationSessionInfo.lsid.id' is missing but a required field")
    ident = lsid["id"]
    raw = bytes(ident) if isinstance(ident, (bytes, bytearray)) else repr(ident).encode()
    uid = lsid.get("uid")
    return (raw, bytes(uid) if isinstance(uid, (bytes, bytearray)) else None)


class SessionRegistry:
    """Every session the server has seen, by lsid; runs on the event loop only."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._sessions: dict[Hashable, Session] = {}
        self._end_waiters: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, lsid: Document) -> Session:
        key = session_key(lsid)
        session = self._sessions.get(key)
        if session is None:
            session = Session(key=key, lsid=lsid)
            self._sessions[key] = session
        session.last_used = time.monotonic()
        return session

    def end(self, lsid: Document) -> Session | None:
        session = self._sessions.pop(session_key(lsid), None)
        if session is not None and session.txn is not None:
            self.abort(session)
        return session

    def close_all(self) -> None:
        for session in list(self._sessions.values()):
            if session.txn is not None:
                self.abort(session)
        self._sessions.clear()

    def expire_idle(self, idle_seconds: float, now: float | None = None) -> list[Session]:
        """Forget sessions unused for ``idle_seconds`` (MongoDB's logical session timeout).

        Returns them so their cursors can be closed too.
        """
        now = time.monotonic() if now is None else now
        idle = [
            session
            for session in self._sessions.values()
            if now - session.last_used > idle_seconds
            and (session.txn is None or session.txn.state is not TxnState.IN_PROGRESS)
        ]
        for session in idle:
            del self._sessions[session.key]
        return idle

    def expire_transactions(self, now: float | None = None) -> int:
        """Abort transactions open longer than the lifetime limit, as MongoDB's reaper does."""
        now = time.monotonic() if now is None else now
        expired = 0
        for session in self._sessions.values():
            txn = session.txn
            if (
                txn is not None
                and txn.state is TxnState.IN_PROGRESS
                and now - txn.started > TRANSACTION_LIFETIME_SECONDS
            ):
                self.abort(session)
                expired += 1
        return expired

    # -----------------------------------------------------------------------------------------

    def transaction_for(self, session: Session, command_name: str, cmd: Document) -> Transaction | None:
        """The transaction this command runs in, starting one on ``startTransaction``.

        Returns None for a command outside any transaction; raises MongoDB's errors for a
        command that names a transaction which does not exist or cannot take it.
        """
        autocommit = cmd.get("autocommit")
        if autocommit is None:
            return None
        if autocommit is not False:
            raise CommandError(
                72, "autocommit field can only be specified as false", code_name="InvalidOptions"
            )
        number = cmd.get("txnNumber")
        if number is None:
            raise CommandError(
                50768,
                "txnNumber must be provided for multi-document transactions",
            )
        number = int(number)
        if cmd.get("startTransaction"):
            if command_name in TRANSACTION_CONTROL:
                raise CommandError(50768, f"Cannot start a transaction with a {command_name} command")
            if command_name in _NOT_IN_TRANSACTION:
                raise CommandError(263, f"Cannot run '{command_name}' in a multi-document transaction.")
            if number < session.txn_number:
                raise CommandError(
                    225,
                    f"Cannot start transaction {number} on session because a newer transaction "
                    f"with txnNumber {session.txn_number} has already started on this session.",
                    code_name="TransactionTooOld",
                )
            if number == session.txn_number:
                raise CommandError(
                    251 if session.txn is None or session.txn.state is TxnState.ABORTED else 256,
                    f"Transaction with {{ txnNumber: {number} }} has already been started or completed",
                )
            if session.txn is not None and session.txn.state is TxnState.IN_PROGRESS:
                self.abort(session)
            session.txn_number = number
            session.txn = Transaction(number=number, catalog=Catalog(parent=self._catalog))
            return session.txn
        txn = session.txn
        if number != session.txn_number or txn is None:
            raise self.no_such_transaction(number)
        if txn.state is TxnState.ABORTED:
            raise self.no_such_transaction(number, aborted=True)
        if txn.state is TxnState.COMMITTED and command_name not in TRANSACTION_CONTROL:
            raise CommandError(
                256,
                f"Transaction with {{ txnNumber: {number} }} has been committed.",
                code_name="TransactionCommitted",
            )
        if txn.state is TxnState.IN_PROGRESS and command_name in _NOT_IN_TRANSACTION:
            # As any failed statement does, a refused one aborts the transaction.
            self.abort(session)
            raise CommandError(
                263,
                f"Cannot run '{command_name}' in a multi-document transaction.",
            )
        return txn

    @staticmethod
    def no_such_transaction(number: int, *, aborted: bool = False) -> CommandError:
        message = (
            f"Transaction with {{ txnNumber: {number} }} has been aborted."
            if aborted
            else f"Given transaction number {number} does not match any in-progress transactions."
        )
        return CommandError(251, message, labels=["TransientTransactionError"])

    def commit(self, session: Session, log: Callable[[Sequence[OplogOp], Document, int], None]) -> None:
        """Make the transaction's writes visible, handing its ops to ``log`` (with its lsid and
        txnNumber) to be logged at one new cluster time; or raise WriteConflict."""
        txn = session.txn
        assert txn is not None
        if txn.state is TxnState.COMMITTED:
            return  # a retried commit succeeds again, as MongoDB answers it
        if txn.state is TxnState.ABORTED:
            raise self.no_such_transaction(txn.number, aborted=True)
        try:
            self._install(txn)
        except CommandError:
            self.abort(session)
            raise
        txn.state = TxnState.COMMITTED
        self._release(txn)
        if txn.ops:
            lsid = {k: v for k, v in session.lsid.items()}
            log(txn.ops, lsid, txn.number)
        txn.ops = []

    def abort(self, session: Session) -> None:
        txn = session.txn
        if txn is None:
            return
        if txn.state is TxnState.IN_PROGRESS:
            txn.state = TxnState.ABORTED
            self._release(txn)
            txn.ops = []

    async def wait_for_transaction_end(self, timeout: float | None) -> bool:
        """Wait until an open transaction commits, aborts or expires; False when ``timeout``
        seconds passed first. Without a timeout the wait is still bounded: a transaction that
        outlives its lifetime limit is aborted, which ends it."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._end_waiters.add(waiter)
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout)
        finally:
            self._end_waiters.discard(waiter)
        return bool(done)

    def _release(self, txn: Transaction) -> None:
        for coll in txn.catalog.touched():
            if coll.origin is not None:
                for key in coll.base:
                    if coll.origin.locks.get(key) == txn.txn_id:
                        del coll.origin.locks[key]
        waiters, self._end_waiters = self._end_waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _install(self, txn: Transaction) -> None:
        main = self._catalog
        touched = txn.catalog.touched()
        created = [c for c in touched if c.origin is None]
        copies = [c for c in touched if c.origin is not None and c.base]
        for coll in created:
            if main.get(coll.db, coll.name) is not None:
                raise write_conflict()
        for coll in copies:
            origin = coll.origin
            assert origin is not None
            if main.get(coll.db, coll.name) is not origin:
                raise write_conflict()
            for key, base in coll.base.items():
                if origin.docs.get(key) is not base:
                    raise write_conflict()
        undo: list[tuple[Collection, Hashable, Document | None]] = []
        try:
            for coll in copies:
                origin = coll.origin
                assert origin is not None
                for key in coll.base:
                    new = coll.docs.get(key)
                    if new is None:
                        undo.append((origin, key, origin.remove(key)))
                for key in coll.base:
                    new = coll.docs.get(key)
                    if new is not None:
                        undo.append((origin, key, origin.put(key, new)))
        except DuplicateKey:
            for origin, key, previous in reversed(undo):
                if previous is None:
                    origin.remove(key)
                else:
                    origin.put(key, previous)
            raise write_conflict() from None
        for coll in created:
            main.adopt(coll)
