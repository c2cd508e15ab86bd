"""``flowwarden status``: every stream of a checkpoint collection, as the deployment sees it now.

Times are compared with the cluster's own time (the operationTime of a ping), not this machine's
clock. A stream whose resume position is older than the oplog's oldest entry cannot resume: its
history is lost, and the command exits 2 so that scripts and alerts notice. Where the oplog cannot
be read (a user without read on ``local``; through a mongos, on a shard) the command says so and
judges nothing.

Instances are shown by their configured instance id and their instance token (``host:pid:random``,
one per connector): two processes given the same id are told apart by the token. Each bucket of a
partitioned stream is a stream of its own here, with its lease holder; the table then lists the
members sharing each partitioned ``single_leader`` stream and the buckets each one holds.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from bson import Timestamp
from rich.console import Console
from rich.table import Table

from flowwarden.cli.checkpoints import read_checkpoints, unreadable_report
from flowwarden.cli.common import ExitCode, Parser, existing_database, say
from flowwarden.cli.settings import Settings


def status(args: argparse.Namespace, settings: Settings) -> ExitCode:
    from flowwarden.mongo.positions import cluster_time_of, oplog_edge
    from flowwarden.runtime.lease import LOCKS_COLLECTION

    with settings.client() as client:
        database = existing_database(client, args.database)
        now = cluster_time_of(client.admin.command("ping"))
        oldest = oplog_edge(client, 1)
        leases = {doc["_id"]: doc for doc in database[LOCKS_COLLECTION].find({})}
        members = _members(leases, now)
        rows = [
            _row(stream, checkpoint, reason, now, oldest, leases.get(stream))
            for stream, checkpoint, reason in read_checkpoints(database[args.collection])
        ]
        collection = database[args.collection]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows, collection.full_name, oldest, members)
    lost = [row["stream"] for row in rows if row["inOplog"] is False]
    unreadable = sum(1 for row in rows if row["unreadable"])
    if lost:
        say(
            f"the position of {', '.join(map(repr, lost))} is older than the oplog's oldest entry: "
            "that history is lost. The stream's on_history_lost decides what it does at its next "
            "start; `flowwarden checkpoints rewind` moves it by hand"
        )
        return ExitCode.USAGE
    if unreadable:
        say(unreadable_report(unreadable, collection))
        return ExitCode.FAILED
    return ExitCode.CLEAN_STOP


def _row(
    stream: Any,
    checkpoint: Any,
    reason: str | None,
    now: Timestamp | None,
    oldest: Timestamp | None,
    lease: dict[str, Any] | None,
) -> dict[str, Any]:
    from flowwarden.events import token_cluster_time

    holder, holder_token = _holder(lease, now)
    row: dict[str, Any] = {
        "stream": stream,
        "lastProcessed": None,
        "lastSeen": None,
        "secondsBehind": None,
        "eventsProcessed": None,
        "instanceId": None,
        "instanceToken": None,
        "leaseHolder": holder,
        "leaseHolderToken": holder_token,
        "inOplog": None,
        "snapshot": None,
        "incrementalSnapshot": None,
        "unreadable": reason,
    }
    if checkpoint is None:
        return row
    row.update(
        lastProcessed=_iso(checkpoint.last_processed_at),
        lastSeen=_iso(checkpoint.last_seen_at),
        eventsProcessed=checkpoint.events_processed,
        instanceId=checkpoint.instance_id,
        instanceToken=checkpoint.instance_token,
    )
    if checkpoint.snapshot is not None:
        progress = checkpoint.snapshot
        row["snapshot"] = {"copied": progress.copied, "total": progress.total, "done": progress.done}
    if checkpoint.incremental_snapshot is not None:
        requested = checkpoint.incremental_snapshot
        row["incrementalSnapshot"] = {
            "request": requested.request,
            "state": requested.state.value,
            "copied": requested.copied,
            "dropped": requested.dropped,
            "total": requested.total,
            "namespace": requested.namespace,
        }
    token = checkpoint.resume_token
    if token is not None:
        at = token_cluster_time(token)
        if now is not None:
            row["secondsBehind"] = max(0, now.time - at.time)
        if oldest is not None:
            # Resuming after a token needs the oplog to still hold the entry at its time.
            row["inOplog"] = at >= oldest
    return row


def _holder(lease: dict[str, Any] | None, now: Timestamp | None) -> tuple[str | None, str | None]:
    """Who holds the stream's single-leader lease, if anyone does now: its instance id and token."""
    if lease is None or lease.get("owner") is None or not _live(lease, now):
        return None, None
    token = lease.get("ownerToken")
    return str(lease["owner"]), None if token is None else str(token)


def _live(document: dict[str, Any], now: Timestamp | None) -> bool:
    expires = document.get("expiresAt")
    return not (isinstance(expires, datetime) and now is not None and expires.timestamp() <= now.time)


def _members(leases: dict[Any, dict[str, Any]], now: Timestamp | None) -> list[tuple[str, str, list[str]]]:
    """Each live member of a fleet sharing a partitioned single_leader stream: the stream, the
    member ("id (token)"), and the buckets whose lease it holds now."""
    held: dict[str, list[str]] = {}
    for stream, lease in leases.items():
        token = lease.get("ownerToken")
        if lease.get("kind") is None and token is not None and _live(lease, now):
            held.setdefault(str(token), []).append(str(stream))
    found = []
    for document in leases.values():
        if document.get("kind") != "member" or not _live(document, now):
            continue
        stream, token = str(document.get("stream")), str(document.get("ownerToken"))
        buckets = sorted(b for b in held.get(token, []) if b.startswith(f"{stream}["))
        found.append((stream, _instance_text(str(document.get("owner")), token), buckets))
    return sorted(found)


def _instance_text(instance: str | None, token: str | None) -> str:
    """An instance for the table: "orders-1 (host:pid:random)", the id alone without a token."""
    if instance is None:
        return "-"
    return instance if token is None else f"{instance} ({token})"


def _snapshot_text(snapshot: dict[str, Any] | None) -> str:
    """The initial snapshot's progress: "done: 5,000", "1,200 of ~5,000", or "-" (none)."""
    if snapshot is None:
        return "-"
    if snapshot["done"]:
        return f"done: {snapshot['copied']:,}"
    total = snapshot["total"]
    return f"{snapshot['copied']:,}" + ("" if total is None else f" of ~{total:,}")


def _requested_text(requested: dict[str, Any] | None) -> str:
    """An incremental snapshot's progress: "copying: 1,200 of ~5,000 (3 left out)", "done: 5,000"."""
    if requested is None:
        return "-"
    total = requested["total"]
    text = f"{requested['state']}: {requested['copied']:,}"
    if requested["state"] == "running":
        text = f"copying: {requested['copied']:,}" + ("" if total is None else f" of ~{total:,}")
    if requested["dropped"]:
        text += f" ({requested['dropped']:,} left out)"
    return text


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _print_table(
    rows: list[dict[str, Any]],
    collection: str,
    oldest: Timestamp | None,
    members: list[tuple[str, str, list[str]]],
) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a pipe or a file: one row per line, never wrapped
    table = Table(title=f"streams in {collection}", title_justify="left")
    for column, justify in (
        ("stream", "left"),
        ("last processed", "left"),
        ("behind (s)", "right"),
        ("last seen", "left"),
        ("events", "right"),
        ("instance", "left"),
        ("lease holder", "left"),
        ("in oplog", "left"),
        ("snapshot", "left"),
        ("requested snapshot", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        if row["unreadable"]:
            table.add_row(str(row["stream"]), f"unreadable: {row['unreadable']}", *[""] * 8)
            continue
        table.add_row(
            str(row["stream"]),
            row["lastProcessed"] or "-",
            "-" if row["secondsBehind"] is None else f"{row['secondsBehind']:,}",
            row["lastSeen"] or "-",
            f"{row['eventsProcessed']:,}",
            _instance_text(row["instanceId"], row["instanceToken"]),
            _instance_text(row["leaseHolder"], row["leaseHolderToken"]),
            {True: "yes", False: "NO: history lost", None: "?"}[row["inOplog"]],
            _snapshot_text(row["snapshot"]),
            _requested_text(row["incrementalSnapshot"]),
        )
    console.print(table)
    if members:
        fleet = Table(title="members sharing partitioned streams", title_justify="left")
        for column in ("stream", "member", "buckets held"):
            fleet.add_column(column)
        for stream, member, buckets in members:
            fleet.add_row(stream, member, f"{len(buckets)}: {', '.join(buckets)}" if buckets else "0")
        console.print(fleet)
    if oldest is None:
        console.print(
            "the oplog cannot be read here (no read on local, here or on a shard): 'in oplog' is unknown"
        )


def add_parser(sub: argparse._SubParsersAction[Parser], connection: Parser) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "status",
        parents=[connection],
        help="every stream's position, lag and lease, as the deployment sees it now",
        description="Print every stream of a checkpoint collection: when its last processed and last "
        "seen events happened, how many seconds its resume position is behind the cluster's "
        "current time, events processed, the instance that saved it and the holder of its lease "
        "(each by instance id and instance token, which tells apart processes given the same id), "
        "whether its position is still in the oplog, and its snapshots' progress (initial, and "
        "requested with `flowwarden snapshot request`); then the members sharing each partitioned "
        "single_leader stream and the buckets each one holds. Exits 2 when a position has left the oplog "
        "(its history is lost), 1 when a document cannot be read.",
    )
    parser.add_argument("--database", required=True, help="the database holding the checkpoint collection")
    parser.add_argument("--collection", default="_fw_checkpoints", help="default: _fw_checkpoints")
    parser.add_argument("--json", action="store_true", help="a JSON list instead of the table, for scripts")
    return parser
