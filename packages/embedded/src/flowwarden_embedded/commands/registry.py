"""The command table: which handler answers each command name, and what a handler is given.

A group module registers its handlers with :func:`command`; the host finds them with
:func:`lookup`. Each :class:`CommandSpec` says which opcounter the command bumps, whether
``failCommand`` may fail it, whether it takes part in sessions, whether it is a retryable write and
which kinds of process have it (a mongos has no replSetGetStatus, a replica set member no
listShards): the host's per-command pipeline reads these flags and nothing else about a command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bson import Int64

from flowwarden_embedded.commands.arguments import bson_type_name
from flowwarden_embedded.crud import Scope
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.sessions import Session, Transaction, TxnState
from flowwarden_embedded.storage import Collection, Document
from flowwarden_embedded.topology import Role

if TYPE_CHECKING:
    from flowwarden_embedded.host import ConnectionInfo, ReplicaSetHost
    from flowwarden_embedded.operations import Operation


@dataclass(slots=True)
class Context:
    """One command being executed: who sent it, where it reads and writes."""

    host: ReplicaSetHost
    conn: ConnectionInfo
    cmd: Document
    db: str
    name: str
    session: Session | None
    txn: Transaction | None
    scope: Scope
    # The command as an operation in progress (currentOp); None for one that is never listed.
    operation: Operation | None = None

    @property
    def in_transaction(self) -> bool:
        return self.txn is not None and self.txn.state is TxnState.IN_PROGRESS

    def collection_name(self) -> str:
        value = self.cmd[self.name]
        if not isinstance(value, str):
            raise CommandError(
                73,
                f"collection name has invalid type {bson_type_name(value)}",
                code_name="InvalidNamespace",
            )
        if not value:
            raise CommandError(73, f"Invalid namespace specified '{self.db}.'", code_name="InvalidNamespace")
        return value

    def get(self, name: str) -> Collection | None:
        return self.scope.catalog.get(self.db, name)

    def describe_cursor(self, cursor_id: int) -> None:
        """Show the cursor this command (a getMore) uses in its currentOp entry."""
        if self.operation is None:
            return
        described = self.host.cursors.describe(cursor_id)
        if described is not None:
            described["operationUsingCursorId"] = Int64(self.operation.opid)
            self.operation.originating_command = described.get("originatingCommand")
            self.operation.cursor = described


Handler = Callable[[Context], Awaitable[Document]]


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """How the host runs a command: ``name`` is the one fail points match (``isMaster`` is
    ``hello``), ``counter`` the opcounter it bumps, ``failable`` whether ``failCommand`` may fail
    it, ``sessions`` whether its ``lsid`` is tracked, ``retryable`` whether it is a retryable write,
    ``roles`` the kinds of process that have it."""

    name: str
    handler: Handler
    counter: str = "command"
    failable: bool = True
    sessions: bool = True
    retryable: bool = False
    roles: frozenset[Role] = frozenset(Role)


_COMMANDS: dict[str, CommandSpec] = {}


def command(
    *names: str,
    counter: str = "command",
    failable: bool = True,
    sessions: bool = True,
    retryable: bool = False,
    roles: frozenset[Role] = frozenset(Role),
) -> Callable[[Handler], Handler]:
    """Register the decorated handler under ``names``; the first is the name fail points match."""

    def register(handler: Handler) -> Handler:
        for name in names:
            _COMMANDS[name] = CommandSpec(names[0], handler, counter, failable, sessions, retryable, roles)
        return handler

    return register


def lookup(name: str, role: Role) -> CommandSpec:
    """The command called ``name`` on a process of ``role``; CommandNotFound (59) as MongoDB
    answers a command that process does not have."""
    spec = _COMMANDS.get(name)
    if spec is None or role not in spec.roles:
        raise CommandError(59, f"no such command: '{name}'")
    return spec


def namespace_of(cmd: Document, db: str) -> str | None:
    """``db.coll`` for commands addressed to a collection (fail points can match on it)."""
    value = next(iter(cmd.values()), None)
    return f"{db}.{value}" if isinstance(value, str) else None
