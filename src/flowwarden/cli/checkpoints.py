"""``flowwarden checkpoints``: list, show, rewind or delete the stored positions of streams.

``rewind`` checks its one target against the server before it writes: a token must be one the
server could resume from and not ahead of its cluster time, a time must have passed and still be in
the oplog; a stream with no checkpoint is refused unless ``--create``. It prints the position
before and after.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from bson import json_util
from bson.errors import BSONError

from flowwarden.cli.common import CommandError, ExitCode, Parser, existing_database, say
from flowwarden.cli.settings import Settings


def checkpoints(args: argparse.Namespace, settings: Settings) -> ExitCode:
    from flowwarden.checkpoints import MongoCheckpointStore

    if args.action != "list" and not args.stream:
        raise CommandError(ExitCode.USAGE, f"checkpoints {args.action}: name the stream")
    targets = [option for option in ("to_token", "to_time", "to_start") if getattr(args, option)]
    if args.action == "rewind" and len(targets) != 1:
        raise CommandError(
            ExitCode.USAGE,
            'checkpoints rewind needs exactly one target: --to-token \'{"_data": "82..."}\' (resume '
            "after that event), --to-time 2026-11-20T08:00:00Z (resume at that cluster time) or "
            "--to-start (forget the position: the stream's start_position applies at its next start)",
        )
    if args.action != "rewind" and (targets or args.create):
        raise CommandError(ExitCode.USAGE, "--to-token, --to-time, --to-start and --create are for rewind")
    token = _parse_token(args.to_token) if args.to_token else None
    at = _parse_time(args.to_time) if args.to_time else None
    with settings.client() as client:
        store = MongoCheckpointStore(existing_database(client, args.database), collection=args.collection)
        if args.action == "list":
            return _list_checkpoints(store)
        if args.action == "show":
            return _show(store, args.stream)
        if args.action == "delete":
            if not args.yes:
                raise CommandError(
                    ExitCode.USAGE,
                    f"checkpoints delete forgets stream {args.stream!r}'s position for good (its "
                    "start_position applies at its next start); run it again with --yes to do it",
                )
            _refuse_if_running(client, store, args)
            found = store.delete(args.stream)
            print("deleted" if found else f"no checkpoint for stream {args.stream!r}")
            return ExitCode.CLEAN_STOP
        return _rewind(client, store, args, token, at)


def _rewind(client: Any, store: Any, args: argparse.Namespace, token: Any, at: Any) -> ExitCode:
    """Move one stream's stored position: check the target against the server, refuse a stream
    that has no checkpoint unless --create, print the old and the new position."""
    from flowwarden.errors import UnreadableCheckpointError
    from flowwarden.mongo.positions import ahead_of_server, cluster_time_of

    stream = args.stream
    try:
        before = store.load(stream)
        old = _position(before) if before is not None else None
    except UnreadableCheckpointError as error:
        before, old = True, f"unreadable ({error})"
    if before is None and not args.create:
        unknown = _unknown_stream(store, stream)
        raise CommandError(
            unknown.code,
            f"{unknown.message}, or give --create to store a position for a stream that has none yet",
        )
    _refuse_if_running(client, store, args)
    server_time = cluster_time_of(client.admin.command("ping"))
    if at is not None:
        _refuse_before_the_oplog(client, at)
        token = _token_at(client[args.database], at, server_time)
    if token is not None:
        reason = ahead_of_server(token, server_time)
        if reason is not None:
            raise CommandError(ExitCode.USAGE, f"--to-token {json_util.dumps(token)} is refused: {reason}")
    store.rewind(stream, token)
    print(f"stream {stream!r}")
    print(f"  before: {old or 'no checkpoint'}")
    if token is None:
        print("  now:    no position; the stream's start_position applies at its next start")
    else:
        print(f"  now:    {_position(store.load(stream))}")
    return ExitCode.CLEAN_STOP


def _refuse_if_running(client: Any, store: Any, args: argparse.Namespace) -> None:
    """A rewind or delete of a stream that a connector runs would be overwritten by its next save
    (a delete re-created): refused while the stream's lease is held or a connector records that
    it runs it (``_fw_locks``), unless ``--force``."""
    from flowwarden.mongo.positions import cluster_time_of
    from flowwarden.runtime.lease import LOCKS_COLLECTION, running_filter

    if args.force:
        return
    server_time = cluster_time_of(client.admin.command("ping"))
    now = server_time.as_datetime() if server_time is not None else datetime.now(timezone.utc)
    locks = store.collection.database[LOCKS_COLLECTION]
    running = locks.find_one(running_filter(args.stream, now))
    if running is not None:
        raise CommandError(
            ExitCode.USAGE,
            f"stream {args.stream!r} is running: instance {running.get('owner')!r} "
            f"({running.get('ownerToken')}) runs it, and its next save would undo this {args.action}. "
            "Stop it first (a stopped connector lets go at once; a killed one after lease_ttl_seconds), "
            "or give --force",
        )


def _refuse_before_the_oplog(client: Any, at: Any) -> None:
    """A time before the oplog's oldest entry names history that is gone: a stream resumed there
    would fail with lost history (or its on_history_lost would move it elsewhere)."""
    from flowwarden.events import timestamp_datetime
    from flowwarden.mongo.positions import oplog_edge

    oldest = oplog_edge(client, 1)
    if oldest is not None and at < oldest:
        raise CommandError(
            ExitCode.USAGE,
            f"--to-time {timestamp_datetime(at).isoformat()} is before the oldest entry of the oplog "
            f"({timestamp_datetime(oldest).isoformat()}): the history before it is gone. Give that "
            "time or a later one, or --to-start",
        )


def _position(checkpoint: Any) -> str:
    """Where a checkpoint resumes, for people: the time and the token."""
    from flowwarden.events import token_datetime

    token = checkpoint.resume_token
    if token is None:
        return "no position (the stream's start_position applies)"
    which = "lastSeen" if token == checkpoint.last_seen_token else "lastProcessed"
    at = token_datetime(token)
    return f"resumes after {at.isoformat() if at else '?'} ({which} token {token['_data']})"


def _parse_time(text: str) -> Any:
    """An ISO-8601 date-time with its time zone, as the cluster time of its second."""
    import datetime as dt

    from bson import Timestamp

    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CommandError(
            ExitCode.USAGE,
            f"--to-time {text!r} is not an ISO-8601 date-time with a time zone; give one such as "
            "2026-11-20T08:00:00Z or 2026-11-20T09:00:00+01:00",
        )
    seconds = int(moment.timestamp() // 1)
    if not 0 <= seconds < 2**32:  # a cluster time counts unsigned 32-bit seconds
        raise CommandError(
            ExitCode.USAGE,
            f"--to-time {text!r} is outside the times MongoDB can name (1970-01-01 to 2106-02-07)",
        )
    return Timestamp(seconds, 0)


def _token_at(database: Any, at: Any, server_time: Any) -> Any:
    """The resume token of cluster time ``at``: the post-batch token of a change stream opened
    there with batchSize 0 (a position, not an event; resuming after it delivers what happened
    from ``at`` on)."""
    from pymongo.errors import OperationFailure

    from flowwarden.events import timestamp_datetime
    from flowwarden.mongo import codes
    from flowwarden.mongo.positions import FUTURE_TOLERANCE_SECONDS

    when = timestamp_datetime(at).isoformat()
    if server_time is not None and at.time > server_time.time + FUTURE_TOLERANCE_SECONDS:
        raise CommandError(
            ExitCode.USAGE,
            f"--to-time {when} is after the server's cluster time "
            f"({timestamp_datetime(server_time).isoformat()}); give a time that has passed",
        )
    try:
        with database.watch(start_at_operation_time=at, batch_size=0) as stream:
            token = stream.resume_token
    except OperationFailure as error:
        if error.code == codes.CHANGE_STREAM_HISTORY_LOST:
            raise CommandError(
                ExitCode.USAGE,
                f"--to-time {when} is older than the oplog's oldest entry; what happened then can no "
                "longer be read. Give a later time, or --to-start",
            ) from None
        raise
    if token is None:
        raise CommandError(ExitCode.USAGE, "the server returned no position for --to-time")
    return dict(token)


def _parse_token(text: str) -> Any:
    from flowwarden.errors import InvalidTokenError
    from flowwarden.events import check_resume_token

    try:
        token = json_util.loads(text)
    except (ValueError, TypeError, BSONError) as error:
        raise CommandError(
            ExitCode.USAGE,
            f"--to-token is not valid JSON ({type(error).__name__}: {error}); give a resume token such "
            'as \'{"_data": "8263..."}\', in single quotes so the shell passes it unchanged',
        ) from None
    if not isinstance(token, dict) or set(token) != {"_data"}:
        raise CommandError(ExitCode.USAGE, '--to-token takes a resume token such as \'{"_data": "8263..."}\'')
    try:
        check_resume_token(token)
    except InvalidTokenError as error:
        raise CommandError(
            ExitCode.USAGE,
            f"--to-token is not a resume token the server could resume from: {error}. Copy the _id "
            "of a change event, or a token `flowwarden checkpoints show STREAM` prints",
        ) from None
    return token


def read_checkpoints(collection: Any) -> Iterator[tuple[Any, Any, str | None]]:
    """``(stream id, Checkpoint or None, why it cannot be read or None)`` for every document of a
    checkpoint collection, in stream order: an unreadable document does not hide the others."""
    import bson
    from bson.codec_options import CodecOptions, DatetimeConversion
    from bson.errors import InvalidBSON
    from bson.raw_bson import RawBSONDocument

    from flowwarden.checkpoints import Checkpoint
    from flowwarden.errors import CheckpointError

    strict = collection.codec_options
    # Only to name an undecodable document: read its _id however odd the rest of it is.
    lenient = strict.with_options(
        datetime_conversion=DatetimeConversion.DATETIME_AUTO, unicode_decode_error_handler="replace"
    )
    raw = collection.with_options(codec_options=CodecOptions(document_class=RawBSONDocument))
    for document in raw.find({}, sort=[("_id", 1)]):
        try:
            checkpoint = Checkpoint.from_document(bson.decode(document.raw, strict))
        except InvalidBSON as error:
            reason = f"cannot be decoded: {error}"
        except CheckpointError as error:
            reason = str(error)
        else:
            yield checkpoint.stream_id, checkpoint, None
            continue
        try:
            stream_id = bson.decode(document.raw, lenient).get("_id")
        except InvalidBSON:
            stream_id = None
        yield stream_id, None, reason


def unreadable_report(count: int, collection: Any) -> str:
    return (
        f"{count} checkpoint document(s) in {collection.full_name} cannot be read (marked "
        '"unreadable" above); fix each, or delete it with `flowwarden checkpoints delete STREAM` '
        "and let that stream start from its start_position"
    )


def _list_checkpoints(store: Any) -> ExitCode:
    """Print one JSON line per checkpoint document, readable or not, in stream order; the exit
    status says whether some were unreadable."""
    unreadable = 0
    for stream_id, checkpoint, reason in read_checkpoints(store.collection):
        if checkpoint is not None:
            print(json.dumps(_listing(checkpoint)))
        else:
            unreadable += 1
            print(json_util.dumps({"stream": stream_id, "unreadable": reason}))
    if unreadable:
        say(unreadable_report(unreadable, store.collection))
        return ExitCode.FAILED
    return ExitCode.CLEAN_STOP


def _listing(checkpoint: Any) -> dict[str, Any]:
    return {
        "stream": checkpoint.stream_id,
        "lastProcessedTimestamp": checkpoint.last_processed_at.isoformat()
        if checkpoint.last_processed_at
        else None,
        "lastSeenTimestamp": checkpoint.last_seen_at.isoformat() if checkpoint.last_seen_at else None,
        "eventsProcessed": checkpoint.events_processed,
        "epoch": checkpoint.epoch,
        "instanceId": checkpoint.instance_id,
        "instanceToken": checkpoint.instance_token,
    }


def _show(store: Any, stream: str) -> ExitCode:
    """The stream's whole checkpoint document as JSON, each token with its cluster time."""
    from bson.codec_options import DatetimeConversion

    collection = store.collection
    lenient = collection.with_options(
        codec_options=collection.codec_options.with_options(
            datetime_conversion=DatetimeConversion.DATETIME_AUTO, unicode_decode_error_handler="replace"
        )
    )
    document = lenient.find_one({"_id": stream})
    if document is None:
        raise _unknown_stream(store, stream)
    shown = {
        key: _with_cluster_time(value) if key.endswith("Token") else value for key, value in document.items()
    }
    print(
        json.dumps(json.loads(json_util.dumps(shown, json_options=json_util.RELAXED_JSON_OPTIONS)), indent=2)
    )
    return ExitCode.CLEAN_STOP


def _with_cluster_time(value: Any) -> Any:
    """A stored token with what it means: its cluster time, as a Timestamp and as a UTC time."""
    from flowwarden.errors import InvalidTokenError
    from flowwarden.events import timestamp_datetime, token_cluster_time

    if not isinstance(value, dict) or "_data" not in value:
        return value
    try:
        at = token_cluster_time(value)
    except (InvalidTokenError, ValueError, TypeError) as error:
        return {**value, "clusterTime": None, "problem": f"not a token the server could resume from: {error}"}
    return {**value, "clusterTime": {"t": at.time, "i": at.inc}, "at": timestamp_datetime(at).isoformat()}


def _unknown_stream(store: Any, stream: str) -> CommandError:
    known = sorted(str(doc["_id"]) for doc in store.collection.find({}, projection={"_id": 1}))
    return CommandError(
        ExitCode.USAGE,
        f"no checkpoint for stream {stream!r} in {store.collection.full_name} (streams with one: "
        f"{', '.join(known) or 'none'}). Check the name and --database",
    )


def add_parser(sub: argparse._SubParsersAction[Parser], connection: Parser) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "checkpoints",
        parents=[connection],
        help="list, show, rewind or delete stored checkpoints",
        description="Inspect and move the positions streams resume from. list prints one JSON line per "
        "stream; show prints one stream's whole document, each token with its cluster time; rewind "
        "moves a stream's position to exactly one target, checked against the server; delete "
        "forgets it (the stream's start_position applies at its next start). Stop every instance "
        "running a stream before rewinding or deleting its checkpoint.",
    )
    parser.add_argument("action", choices=["list", "show", "rewind", "delete"], help="what to do")
    parser.add_argument("stream", nargs="?", help="the stream's name (show, rewind, delete)")
    parser.add_argument("--database", required=True, help="the database holding the checkpoint collection")
    parser.add_argument("--collection", default="_fw_checkpoints", help="default: _fw_checkpoints")
    parser.add_argument("--to-token", default=None, help="rewind: resume after this token (JSON)")
    parser.add_argument(
        "--to-time", default=None, help="rewind: resume at this ISO-8601 time, with its time zone"
    )
    parser.add_argument(
        "--to-start", action="store_true", help="rewind: forget the position (start_position applies)"
    )
    parser.add_argument("--create", action="store_true", help="rewind: a stream with no checkpoint yet")
    parser.add_argument("--yes", action="store_true", help="delete: yes, forget the position")
    parser.add_argument(
        "--force",
        action="store_true",
        help="rewind, delete: even while a connector runs the stream (its next save undoes it)",
    )
    return parser
