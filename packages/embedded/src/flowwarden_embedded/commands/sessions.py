"""Session and transaction commands: ``startSession``, ``endSessions``, ``refreshSessions``,
``killSessions``, ``commitTransaction`` and ``abortTransaction``.

The bookkeeping itself (transaction states, snapshots, commit) belongs to
:mod:`flowwarden_embedded.sessions`; these handlers check the request as MongoDB does and
hand it over. Ending or killing a session also kills the cursors it owns.
"""

from __future__ import annotations

import functools
import uuid

from bson import Binary
from bson.binary import UuidRepresentation

from flowwarden_embedded.commands.handshake import LOGICAL_SESSION_TIMEOUT_MINUTES
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.commands.replies import write_concern_error
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.sessions import Session, Transaction, TxnState
from flowwarden_embedded.storage import Document


@command("endSessions", sessions=False)
async def cmd_end_sessions(ctx: Context) -> Document:
    ids = ctx.cmd.get("endSessions")
    if not isinstance(ids, list):
        raise CommandError(14, "BSON field 'endSessions' is the wrong type, expected type 'array'")
    for lsid in ids:
        if isinstance(lsid, dict) and "id" in lsid:
            session = ctx.host.sessions.end(lsid)
            if session is not None:
                ctx.host.cursors.kill_session(session.key)
    return {"ok": 1.0}


@command("refreshSessions", "killSessions", sessions=False)
async def cmd_refresh_sessions(ctx: Context) -> Document:
    ids = ctx.cmd.get(ctx.name)
    if not isinstance(ids, list):
        raise CommandError(14, f"BSON field '{ctx.name}' is the wrong type, expected type 'array'")
    for lsid in ids:
        if not isinstance(lsid, dict) or "id" not in lsid:
            continue
        if ctx.name == "killSessions":
            session = ctx.host.sessions.end(lsid)
            if session is not None:
                ctx.host.cursors.kill_session(session.key)
        else:
            ctx.host.sessions.get(lsid)
    return {"ok": 1.0}


@command("startSession", sessions=False)
async def cmd_start_session(ctx: Context) -> Document:
    lsid = {"id": Binary.from_uuid(uuid.uuid4(), UuidRepresentation.STANDARD)}
    ctx.host.sessions.get(lsid)
    return {"id": lsid, "timeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES, "ok": 1.0}


def _transaction_session(ctx: Context) -> tuple[Session, Transaction]:
    if ctx.session is None:
        raise CommandError(50768, f"{ctx.name} must be run within a session")
    if ctx.txn is None:
        if "txnNumber" not in ctx.cmd:
            raise CommandError(50768, f"{ctx.name} must be run within a transaction")
        raise ctx.host.sessions.no_such_transaction(int(ctx.cmd["txnNumber"]))
    return ctx.session, ctx.txn


@command("commitTransaction")
async def cmd_commit_transaction(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "commitTransaction may only be run against the admin database.", code_name="Unauthorized"
        )
    session, _ = _transaction_session(ctx)
    ctx.host.sessions.commit(session, functools.partial(ctx.host.log_transaction, ctx.conn.process))
    reply: Document = {"ok": 1.0}
    wce = write_concern_error(ctx)
    if wce is not None:
        reply["writeConcernError"] = wce
    return reply


@command("abortTransaction")
async def cmd_abort_transaction(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "abortTransaction may only be run against the admin database.", code_name="Unauthorized"
        )
    session, txn = _transaction_session(ctx)
    if txn.state is TxnState.COMMITTED:
        raise CommandError(
            256,
            "Cannot abort transaction since it has already been committed",
            code_name="TransactionCommitted",
        )
    if txn.state is TxnState.ABORTED:
        raise ctx.host.sessions.no_such_transaction(txn.number, aborted=True)
    ctx.host.sessions.abort(session)
    return {"ok": 1.0}
