"""``flowwarden dlq``: list, show, replay and purge the dead-letter collection (``_fw_dlq``).

An entry is ``{stream, token, clusterTime, event, errorType, message, traceback, attempts,
failedAt}`` as the runtime wrote it, plus ``replayedAt``, ``replayCount`` and ``lastReplayError``
once replayed. ``replay`` runs each entry's stored event through a handler class's method for its
operation type, under the class's retry policy, and marks the entry after the method returned.
Replay is at least once: an entry whose method returned but whose mark was not written (the
process died in between) is replayed again next time, so the method must tolerate that, as it must
for the connector itself. ``purge`` deletes only with ``--yes``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from bson import ObjectId, json_util
from bson.errors import InvalidId
from rich.console import Console
from rich.table import Table

from flowwarden.cli.common import CommandError, ExitCode, Parser, existing_database, say
from flowwarden.cli.settings import Settings


def dlq(args: argparse.Namespace, settings: Settings) -> ExitCode:
    handler = None
    if args.action == "replay":
        from flowwarden.cli.run import load_handler

        if not args.handler:
            raise CommandError(
                ExitCode.USAGE, "dlq replay needs --handler module:Class, the class to replay through"
            )
        handler = load_handler(args.handler)
    if args.action == "show" and not args.ids:
        raise CommandError(ExitCode.USAGE, "dlq show needs the entry's id: flowwarden dlq show ID ...")
    query = _filter(args)  # ids and times are checked before anything connects
    with settings.client() as client:
        collection = existing_database(client, args.database)[args.collection]
        if args.action == "list":
            return _list(collection, query, args.limit, args.json)
        if args.action == "show":
            return _show(collection, query)
        if args.action == "purge":
            return _purge(collection, query, args.yes)
        assert handler is not None
        return _replay(collection, handler, args)


def _filter(args: argparse.Namespace, stream: str | None = None) -> dict[str, Any]:
    """The entries the options select."""
    query: dict[str, Any] = {}
    if args.ids:
        query["_id"] = {"$in": [_object_id(text) for text in args.ids]}
    if stream or args.stream:
        query["stream"] = stream or args.stream
    if args.error:
        pattern = {"$regex": re.escape(args.error), "$options": "i"}
        query["$or"] = [{"errorType": pattern}, {"message": pattern}]
    if args.since:
        query["failedAt"] = {"$gte": _time(args.since, "--since")}
    if getattr(args, "not_replayed", False):
        query["replayedAt"] = {"$exists": False}
    return query


def _object_id(text: str) -> ObjectId:
    try:
        return ObjectId(text)
    except (InvalidId, TypeError):
        raise CommandError(
            ExitCode.USAGE,
            f"{text!r} is not an entry id; copy one from `flowwarden dlq list` (24 hex digits)",
        ) from None


def _time(text: str, option: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CommandError(
            ExitCode.USAGE,
            f"{option} {text!r} is not an ISO-8601 date-time with a time zone; give one such as "
            "2026-11-20T08:00:00Z",
        )
    return moment.astimezone(timezone.utc)


# -- list, show ------------------------------------------------------------------------------------


def _summary(entry: dict[str, Any]) -> dict[str, Any]:
    event = entry.get("event") or {}
    key = (event.get("documentKey") or {}).get("_id") if isinstance(event, dict) else None
    return {
        "id": str(entry["_id"]),
        "stream": entry.get("stream"),
        "failedAt": _iso(entry.get("failedAt")),
        "operationType": event.get("operationType") if isinstance(event, dict) else None,
        "documentKey": json.loads(json_util.dumps(key)) if key is not None else None,
        "errorType": entry.get("errorType"),
        "message": entry.get("message"),
        "attempts": entry.get("attempts"),
        "replayCount": entry.get("replayCount", 0),
        "replayedAt": _iso(entry.get("replayedAt")),
    }


def _iso(moment: Any) -> str | None:
    return moment.isoformat() if isinstance(moment, datetime) else None


def _list(collection: Any, query: dict[str, Any], limit: int, as_json: bool) -> ExitCode:
    entries = [_summary(e) for e in collection.find(query, sort=[("failedAt", 1), ("_id", 1)], limit=limit)]
    total = collection.count_documents(query)
    if as_json:
        for entry in entries:
            print(json.dumps(entry))
        return ExitCode.CLEAN_STOP
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    table = Table(
        title=f"{collection.full_name}: {total} entr{'y' if total == 1 else 'ies'}", title_justify="left"
    )
    for column in ("id", "stream", "failed at", "operation", "document key", "error", "attempts", "replayed"):
        table.add_column(column)
    for entry in entries:
        error = f"{(entry['errorType'] or '').rsplit('.', 1)[-1]}: {entry['message']}"
        table.add_row(
            entry["id"],
            str(entry["stream"]),
            entry["failedAt"] or "-",
            entry["operationType"] or "-",
            json.dumps(entry["documentKey"]),
            error if len(error) <= 60 else error[:57] + "...",
            str(entry["attempts"]),
            f"{entry['replayCount']}x, last {entry['replayedAt']}" if entry["replayCount"] else "no",
        )
    console.print(table)
    if total > len(entries):
        console.print(f"showing the first {len(entries)}; --limit shows more, --stream/--error/--since fewer")
    return ExitCode.CLEAN_STOP


def _show(collection: Any, query: dict[str, Any]) -> ExitCode:
    wanted = {str(i) for i in query["_id"]["$in"]}
    found = list(collection.find(query, sort=[("_id", 1)]))
    for entry in found:
        print(
            json.dumps(
                json.loads(json_util.dumps(entry, json_options=json_util.RELAXED_JSON_OPTIONS)), indent=2
            )
        )
    missing = wanted - {str(entry["_id"]) for entry in found}
    if missing:
        raise CommandError(
            ExitCode.USAGE,
            f"no entry {', '.join(sorted(missing))} in {collection.full_name} (with the other options "
            "given); `flowwarden dlq list` shows the ids",
        )
    return ExitCode.CLEAN_STOP


# -- purge -------------------------------------------------------------------------------------------


def _purge(collection: Any, query: dict[str, Any], confirmed: bool) -> ExitCode:
    count = collection.count_documents(query)
    if not confirmed:
        raise CommandError(
            ExitCode.USAGE,
            f"this would delete {count} entr{'y' if count == 1 else 'ies'} from {collection.full_name}; "
            "run it again with --yes to delete them",
        )
    deleted = collection.delete_many(query).deleted_count
    print(f"deleted {deleted} entr{'y' if deleted == 1 else 'ies'} from {collection.full_name}")
    return ExitCode.CLEAN_STOP


# -- replay ------------------------------------------------------------------------------------------


def _replay(collection: Any, handler_class: type, args: argparse.Namespace) -> ExitCode:
    from flowwarden.config.spec import partition_specs, stream_spec

    spec = stream_spec(handler_class)
    # A partitioned class dead-letters under its buckets' names: each is the class's stream.
    own = [part.name for part in partition_specs(spec)]
    stream = args.stream or spec.name
    if args.stream and args.stream not in own and not args.any_stream:
        raise CommandError(
            ExitCode.USAGE,
            f"--stream {stream!r} is not {handler_class.__name__}'s stream ({', '.join(map(repr, own))}); "
            "replay the entries of a stream through its own class, or give --any-stream to do it anyway",
        )
    query = _filter(args, stream=args.stream or (own[0] if len(own) == 1 else None))
    if not args.stream and len(own) > 1:
        query["stream"] = {"$in": own}
    if not args.again:
        query["replayedAt"] = {"$exists": False}  # an entry replayed once is done
    entries = list(collection.find(query, sort=[("failedAt", 1), ("_id", 1)]))
    if not entries:
        again = "" if args.again else " that were not replayed before (--again takes those too)"
        print(f"no entries of stream {stream!r} in {collection.full_name}{again} match")
        return ExitCode.CLEAN_STOP
    print(
        f"replaying {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} of stream {stream!r} through "
        f"{handler_class.__name__}. Replay is at least once: an entry whose method returned but could "
        "not be marked is replayed again next time"
    )
    replayed, failed, taken = asyncio.run(_replay_all(collection, spec, entries, again=args.again))
    print(f"replayed {replayed}, failed {failed}" + (f", {taken} taken by another replay" if taken else ""))
    if failed:
        say(
            f"{failed} entr{'y' if failed == 1 else 'ies'} failed again (lastReplayError says why; they "
            "stay in the queue); fix the cause and replay them again"
        )
        return ExitCode.FAILED
    return ExitCode.CLEAN_STOP


# A replay claims an entry before it replays it, for this long: two replays at once never handle
# the same entry, and the claim of a replay that was killed lapses.
CLAIM_SECONDS = 300.0


def _claim(collection: Any, entry: dict[str, Any], claimant: str, *, again: bool) -> bool:
    """Whether this replay took ``entry``: no other replay holds it, and (unless ``again``) it was
    not replayed since it was listed."""
    now = datetime.now(timezone.utc)
    query: dict[str, Any] = {
        "_id": entry["_id"],
        "$or": [{"replayClaim": {"$exists": False}}, {"replayClaim.until": {"$lt": now}}],
    }
    if not again:
        query["replayedAt"] = {"$exists": False}
    claim = {"by": claimant, "until": now + timedelta(seconds=CLAIM_SECONDS)}
    return collection.find_one_and_update(query, {"$set": {"replayClaim": claim}}) is not None


async def _replay_all(
    collection: Any, spec: Any, entries: list[dict[str, Any]], *, again: bool
) -> tuple[int, int, int]:
    """Each entry's event through its method under the class's retry policy, once this replay
    claimed it; how many were replayed, failed again, and taken by another replay."""

    from flowwarden.runtime.invoke import Exhausted, Invoker
    from flowwarden.runtime.lease import instance_token

    instance = spec.handler_class()
    stopping = asyncio.Event()
    claimant = instance_token()
    replayed = failed = taken = 0
    for entry in entries:
        if not _claim(collection, entry, claimant, again=again):
            print(f"  {entry['_id']}: taken by another replay, or replayed since")
            taken += 1
            continue
        event = entry.get("event")
        if not isinstance(event, dict):
            failed += _mark_failed(collection, entry, "the entry holds no event to replay")
            continue
        method = spec.batch or spec.dataframe or spec.handler_for(str(event.get("operationType", "")))
        if method is None:
            failed += _mark_failed(
                collection,
                entry,
                f"{spec.handler_class.__name__} has no method for {event.get('operationType')!r}",
            )
            continue
        invoker = Invoker(
            method.bind(instance),
            is_async=method.is_async,
            wants_ctx=method.wants_ctx,
            # The entry's own stream: a bucket's name (orders[1/4]) for a partitioned class.
            stream=str(entry.get("stream") or spec.name),
            policy=spec.retry,
            stopping=stopping,
            threaded=method.kind != "event",
        )
        token = event.get("_id")
        batch_id = f"dlq-{token['_data']}" if isinstance(token, dict) and "_data" in token else None
        ctx = invoker.context(batch_id)
        try:
            payload = _payload(spec, method, event)
        except Exception as error:  # a document that does not fit the schema: the batch's failure
            failed += _mark_failed(collection, entry, str(error))
            continue
        try:
            await invoker(payload, ctx)
        except Exhausted as exhausted:
            failed += _mark_failed(collection, entry, str(exhausted))
            continue
        collection.update_one(
            {"_id": entry["_id"]},
            {
                "$set": {"replayedAt": datetime.now(timezone.utc)},
                "$inc": {"replayCount": 1},
                "$unset": {"lastReplayError": "", "replayClaim": ""},
            },
        )
        replayed += 1
        print(f"  {entry['_id']}: replayed")
    return replayed, failed, taken


def _payload(spec: Any, method: Any, event: dict[str, Any]) -> Any:
    """What the method takes: the event, a list of it (``@on_batch``) or a DataFrame of it.

    Raises when the event's document does not fit the ``@on_dataframe`` schema under FAILFAST or
    DROPMALFORMED: the method would not see the event, so the entry must not be marked replayed.
    """
    from flowwarden.events import ChangeEvent

    if method.kind == "event":
        return ChangeEvent(event)
    if method.kind == "batch":
        return [ChangeEvent(event)]
    from flowwarden.config import SchemaMode
    from flowwarden.spark import events_to_dataframe, get_or_create_session

    mode = spec.dataframe.mode
    frame, malformed = events_to_dataframe(
        get_or_create_session(), [event], schema=spec.dataframe.schema, mode=mode
    )
    if malformed and mode is SchemaMode.DROPMALFORMED:
        unfit = malformed[0]
        raise ValueError(
            f"field {unfit.field!r} does not fit the schema: {unfit.error}; under mode=DROPMALFORMED "
            "the method would get no row for it. Fix the schema (or the document) and replay again"
        )
    return frame


def _mark_failed(collection: Any, entry: dict[str, Any], reason: str) -> int:
    collection.update_one(
        {"_id": entry["_id"]},
        {
            "$set": {"lastReplayError": reason, "lastReplayAttemptAt": datetime.now(timezone.utc)},
            "$unset": {"replayClaim": ""},
        },
    )
    print(f"  {entry['_id']}: failed: {reason}")
    return 1


def add_parser(sub: argparse._SubParsersAction[Parser], connection: Parser) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "dlq",
        parents=[connection],
        help="list, show, replay or purge dead-lettered events",
        description="Work with the dead-letter collection: list entries (filtered by stream, error and "
        "time), show whole entries, replay entries through a handler class (those never replayed, "
        "unless --again; each claimed first, so two replays at once never take the same one; at "
        "least once: marked after the method returned), or purge them (only with --yes).",
    )
    parser.add_argument("action", choices=["list", "show", "replay", "purge"], help="what to do")
    parser.add_argument(
        "ids",
        nargs="*",
        metavar="ID",
        help="entry ids (show needs one; replay and purge take them as a filter)",
    )
    parser.add_argument("--database", required=True, help="the database holding the dead-letter collection")
    parser.add_argument("--collection", default="_fw_dlq", help="default: _fw_dlq")
    parser.add_argument("--stream", default=None, help="only entries of this stream")
    parser.add_argument(
        "--error", default=None, help="only entries whose error type or message contains this text"
    )
    parser.add_argument(
        "--since", default=None, help="only entries that failed at or after this ISO-8601 time"
    )
    parser.add_argument(
        "--not-replayed", action="store_true", help="list, show, purge: only entries never replayed"
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="replay: also entries replayed before (by default replay takes only those never replayed)",
    )
    parser.add_argument("--limit", type=int, default=50, help="list: at most this many entries (default 50)")
    parser.add_argument("--json", action="store_true", help="list: one JSON object per line")
    parser.add_argument("--handler", default=None, metavar="module:Class", help="replay: the handler class")
    parser.add_argument(
        "--any-stream", action="store_true", help="replay: allow entries of a stream other than the class's"
    )
    parser.add_argument("--yes", action="store_true", help="purge: really delete the entries selected")
    return parser
