"""``flowwarden snapshot``: request an incremental snapshot of a running stream, list requests, cancel one.

``request`` writes a request into ``_fw_signals`` of the database given (the stream's database,
or the checkpoint database of a cluster stream), after checking that a stream of that name keeps
its checkpoints there (``--force`` skips the check, for a stream whose checkpoints live in a file
or elsewhere). The stream running it takes the request at its next heartbeat and copies the
documents in chunks between its changes (:mod:`flowwarden.runtime.incremental`). ``list`` shows
each request with the progress its streams stored in their checkpoint records; ``cancel`` marks a
request cancelled, and a stream copying it stops at its next chunk.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from typing import Any

from bson import json_util
from rich.console import Console
from rich.table import Table

from flowwarden.cli.common import CommandError, ExitCode, Parser, existing_database, positive_int
from flowwarden.cli.settings import Settings

_BUCKET = re.compile(r"^(?P<base>.+)\[(?P<index>\d+)/(?P<count>\d+)\]$")


def snapshot(args: argparse.Namespace, settings: Settings) -> ExitCode:
    from flowwarden.mongo.signals import SIGNALS_COLLECTION, RequestProblem, object_id, request_document

    try:
        if args.action == "request":
            document = request_document(
                args.stream, args.collections, _filter(args.filter), args.chunk_size
            )
        identity = object_id(args.id) if args.action == "cancel" else None
    except RequestProblem as problem:
        raise CommandError(ExitCode.USAGE, str(problem)) from None
    with settings.client() as client:
        database = existing_database(client, args.database)
        signals = database[SIGNALS_COLLECTION]
        if args.action == "request":
            return _request(database, signals, document, args)
        if args.action == "cancel":
            assert identity is not None
            return _cancel(signals, identity, args.database)
        return _list(database, signals, args.collection, args.json)


def _filter(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json_util.loads(text)
    except (ValueError, TypeError) as error:
        example = '{"region": "eu"}'
        raise CommandError(
            ExitCode.USAGE, f"--filter is not JSON ({error}); give a find filter such as '{example}'"
        ) from None
    if not isinstance(value, dict):
        raise CommandError(
            ExitCode.USAGE,
            f"--filter must be a JSON object (a find filter on the documents), not {type(value).__name__}",
        )
    return value


def _request(database: Any, signals: Any, document: dict[str, Any], args: argparse.Namespace) -> ExitCode:
    from flowwarden.mongo.calls import run
    from flowwarden.mongo.signals import SOURCE_KIND, insert_request

    stream = document["stream"]
    if not args.force:
        names = [str(name) for name in database[args.collection].distinct("_id")]
        # A Spark query read with .option("name", ...) keeps an entry of its own in _fw_signals.
        names += [str(name) for name in signals.distinct("stream", {"kind": SOURCE_KIND})]
        if not any(_of_stream(name, stream) for name in names):
            shown = ", ".join(sorted(names)[:10]) or "none"
            raise CommandError(
                ExitCode.USAGE,
                f"no stream {stream!r} keeps its checkpoint in {database.name}.{args.collection} (streams "
                f"there: {shown}); check the stream's name and --database (its database, or the "
                "checkpoint database of a cluster stream), or give --force for a stream whose "
                "checkpoints are kept elsewhere",
            )
    identity = run(insert_request(signals, document))
    print(
        f"requested an incremental snapshot of stream {stream!r}: request {identity}. The stream takes it "
        f"at its next heartbeat; `flowwarden snapshot list --database {database.name}` shows its progress"
    )
    return ExitCode.CLEAN_STOP


def _of_stream(name: str, stream: str) -> bool:
    """Whether checkpoint ``name`` is stream ``stream``'s, or one of its buckets'."""
    match = _BUCKET.match(name)
    return name == stream or (match is not None and match["base"] == stream)


def _cancel(signals: Any, identity: Any, database: str) -> ExitCode:
    from flowwarden.mongo.calls import run
    from flowwarden.mongo.signals import RequestState, cancel_request

    before = run(cancel_request(signals, identity))
    if before is None:
        raise CommandError(
            ExitCode.USAGE,
            f"no snapshot request {identity} in {signals.full_name}; `flowwarden snapshot list "
            f"--database {database}` shows the ids",
        )
    if before.state is not RequestState.REQUESTED:
        raise CommandError(
            ExitCode.USAGE, f"snapshot request {identity} was {before.state.value} already; nothing to cancel"
        )
    print(
        f"cancelled snapshot request {identity} of stream {before.stream!r}; a stream copying it stops at "
        "its next chunk (the rows handed over so far stay delivered)"
    )
    return ExitCode.CLEAN_STOP


def _list(database: Any, signals: Any, checkpoints: str, as_json: bool) -> ExitCode:
    from flowwarden.cli.checkpoints import read_checkpoints
    from flowwarden.mongo.calls import run
    from flowwarden.mongo.signals import requests

    found = run(requests(signals))
    progress: dict[str, list[tuple[str, Any]]] = {}
    for stream, checkpoint, _ in read_checkpoints(database[checkpoints]):
        incremental = None if checkpoint is None else checkpoint.incremental_snapshot
        if incremental is not None:
            progress.setdefault(incremental.request, []).append((stream, incremental))
    rows = [_row(request, progress.get(request.id, [])) for request in found]
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return ExitCode.CLEAN_STOP
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a pipe or a file: one row per line, never wrapped
    table = Table(title=f"snapshot requests in {signals.full_name}: {len(rows)}", title_justify="left")
    for column in ("id", "stream", "collections", "requested at", "state", "copied", "left out", "of ~"):
        table.add_column(column, justify="right" if column in ("copied", "left out", "of ~") else "left")
    for row in rows:
        table.add_row(
            row["id"],
            row["stream"],
            ", ".join(row["collections"]) if row["collections"] else "all",
            row["requestedAt"] or "-",
            row["state"] + (f": {row['reason']}" if row["reason"] else ""),
            f"{row['copied']:,}",
            f"{row['dropped']:,}",
            "-" if row["total"] is None else f"{row['total']:,}",
        )
    console.print(table)
    return ExitCode.CLEAN_STOP


def _row(request: Any, progress: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """One request with its streams' progress; its state as an operator reads it: waiting (no
    stream took it yet), copying, done (every stream, every bucket of a partitioned class,
    copied everything), cancelled or refused."""
    from flowwarden.checkpoints.model import IncrementalState
    from flowwarden.mongo.signals import RequestState

    streams = {
        stream: {
            "state": each.state.value,
            "copied": each.copied,
            "dropped": each.dropped,
            "total": each.total,
            "namespace": each.namespace,
            "chunks": each.chunk,
        }
        for stream, each in progress
    }
    totals = [entry["total"] for entry in streams.values() if entry["total"] is not None]
    state = request.state.value
    if request.state is RequestState.REQUESTED:
        done = [name for name, entry in streams.items() if entry["state"] == IncrementalState.DONE.value]
        expected = _expected_streams(request.stream, streams)
        if not streams:
            state = "waiting"
        elif expected is not None and len(done) >= expected:
            state = "done"
        else:
            state = "copying"
    return {
        "id": request.id,
        "stream": request.stream,
        "collections": list(request.collections) if request.collections else None,
        "filter": None if request.filter is None else json.loads(json_util.dumps(request.filter)),
        "chunkSize": request.chunk_size,
        "requestedAt": request.requested_at.isoformat() if request.requested_at else None,
        "state": state,
        "reason": request.reason,
        "copied": sum(entry["copied"] for entry in streams.values()),
        "dropped": sum(entry["dropped"] for entry in streams.values()),
        "total": sum(totals) if totals else None,
        "streams": streams,
    }


def _expected_streams(stream: str, streams: dict[str, Any]) -> int | None:
    """How many streams copy a request of ``stream``: 1, or a partitioned class's bucket count
    (as the buckets' names say); None when none reported yet."""
    for name in streams:
        match = _BUCKET.match(name)
        if match is not None and match["base"] == stream:
            return int(match["count"])
    return 1 if streams else None


def add_parser(sub: argparse._SubParsersAction[Parser], connection: Parser) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "snapshot",
        help="request, list or cancel incremental snapshots of running streams",
        description="Copy existing documents into a running stream without stopping it: request an "
        "incremental snapshot (the stream copies the documents in _id chunks between its changes, "
        "and a change made while a chunk was read wins over its copy), list the requests with "
        "their progress, or cancel one.",
    )
    actions = parser.add_subparsers(dest="action", required=True, parser_class=Parser)
    request = actions.add_parser(
        "request",
        parents=[connection],
        help="ask a running stream to copy existing documents",
        description="Write a snapshot request for STREAM (a stream's name, or a partitioned class's: "
        "each bucket copies its own documents) into _fw_signals of --database; the stream takes it "
        "at its next heartbeat (every save_interval_seconds).",
    )
    request.add_argument("stream", metavar="STREAM", help="the stream's name (its checkpoint's _id)")
    request.add_argument(
        "--collection",
        dest="collections",
        action="append",
        default=None,
        metavar="C",
        help="a collection to copy (repeat for more; default: every collection the stream covers); "
        "a cluster stream's are database.collection",
    )
    request.add_argument(
        "--filter", default=None, metavar="JSON", help="copy only the documents this find filter matches"
    )
    request.add_argument(
        "--chunk-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="documents per chunk (default: the stream's snapshot_chunk_size; at most max_events for "
        "@on_batch and @on_dataframe)",
    )
    request.add_argument(
        "--force",
        action="store_true",
        help="write the request even though no checkpoint of STREAM is in --database",
    )
    listing = actions.add_parser(
        "list",
        parents=[connection],
        help="every snapshot request, with its streams' progress",
        description="List the snapshot requests of --database: their state (waiting, copying, done, "
        "cancelled, refused), and the documents copied and left out (a change made while their "
        "chunk was read was delivered instead), from the streams' checkpoint records.",
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per line, for scripts")
    cancel = actions.add_parser(
        "cancel",
        parents=[connection],
        help="cancel a snapshot request",
        description="Mark a snapshot request cancelled; a stream copying it stops at its next chunk.",
    )
    cancel.add_argument("id", metavar="ID", help="the request's id (from `flowwarden snapshot list`)")
    for each in (request, listing, cancel):
        each.add_argument(
            "--database",
            required=True,
            help="the database of _fw_signals and _fw_checkpoints: the stream's, or the checkpoint "
            "database of a cluster stream",
        )
        each.add_argument(
            "--checkpoints-collection",
            dest="collection",
            default="_fw_checkpoints",
            metavar="NAME",
            help="the checkpoint collection (default: _fw_checkpoints)",
        )
        each.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser
