"""The ``flowwarden`` command: run handler classes, inspect and rewind checkpoints, start the
embedded replica set, run the demo.

This module owns what a shell sees. Every failure it knows of ends as one line on stderr that
starts with ``flowwarden:``, says what was wrong and what to do, and one of these exit codes
(:class:`ExitCode`):

- 0: clean stop.
- 1: a stream failed or ended with an error (``run``; one line per stream), or a checkpoint document
  is unreadable (``checkpoints list``, which still lists every readable one).
- 2: usage or configuration error: bad arguments, a handler that cannot be imported, an invalid
  token, JSON or URI, a port that cannot be used, a FlowWardenError at start-up, or MongoDB
  refusing a command for a reason other than the credentials.
- 3: the MongoDB deployment could not be reached or refused the credentials, when the command
  needed it (``checkpoints list``, ``rewind``, ``delete``).
- 130: interrupted (Ctrl-C), or stopped at once by a second SIGINT/SIGTERM during ``run``'s
  graceful stop.

It never prints a traceback for those, and never prints a URI's password: URIs go through
:func:`flowwarden.redaction.redact_uri` first.
"""

from __future__ import annotations

import argparse
import enum
import errno
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from bson import json_util
from bson.errors import BSONError

from flowwarden.errors import FlowWardenError
from flowwarden.redaction import quotes_secret, redact_uri

if TYPE_CHECKING:
    import pymongo


class ExitCode(enum.IntEnum):
    """The ``flowwarden`` command's exit status; :data:`EXIT_CODE_MEANINGS` says what each means."""

    CLEAN_STOP = 0
    FAILED = 1
    USAGE = 2
    MONGODB_UNAVAILABLE = 3
    INTERRUPTED = 130


EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.CLEAN_STOP: "clean stop",
    ExitCode.FAILED: "a stream failed or ended with an error (run), or a checkpoint document is "
    "unreadable (checkpoints list)",
    ExitCode.USAGE: "usage or configuration error: bad arguments, a handler that cannot be imported, "
    "an invalid token, JSON or URI, a port that cannot be used, a start-up error, a command MongoDB "
    "refused for a reason other than the credentials",
    ExitCode.MONGODB_UNAVAILABLE: "MongoDB could not be reached or refused the credentials "
    "(checkpoints list/rewind/delete)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C), or run stopped at once by a second SIGINT/SIGTERM",
}

# The checkpoint commands do one thing and exit: better to say at once that MongoDB is out of reach
# than to wait PyMongo's default 30 s. A serverSelectionTimeoutMS in the URI still wins.
ONE_SHOT_SERVER_SELECTION_TIMEOUT_MS = 10_000
_URI_SETS_SERVER_SELECTION_TIMEOUT = re.compile(r"[?&;]serverSelectionTimeoutMS=", re.IGNORECASE)

# OperationFailure codes meaning the credentials were refused: Unauthorized, AuthenticationFailed.
_CREDENTIALS_REFUSED = frozenset({13, 18})


class _CommandError(Exception):
    """Ends the command: ``message`` goes to stderr as one line, ``code`` is the exit status."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _say(message: str) -> None:
    """One ``flowwarden:`` line on stderr, whatever line breaks the message carried."""
    print(f"flowwarden: {' '.join(message.split())}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``flowwarden:`` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"flowwarden: {message} (see `{self.prog} --help`)\n")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; give a number from 1 to 65535")
    return port


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


# -- run ----------------------------------------------------------------------------------------


def _load_handler(path: str) -> type:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise _CommandError(ExitCode.USAGE, f"handler {path!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as error:
        raise _CommandError(
            ExitCode.USAGE,
            f"cannot import handler module {module_name!r}: {type(error).__name__} in "
            f"{error.filename}, line {error.lineno}: {error.msg}. Fix the module and run again",
        ) from None
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name + ".").startswith(error.name + "."):
            raise _CommandError(
                ExitCode.USAGE,
                f"cannot import handler module {module_name!r}: {type(error).__name__}: {error}. Check "
                "the name, and run flowwarden from the folder that holds the package (or add that "
                "folder to PYTHONPATH)",
            ) from None
        raise _import_failed(module_name, error) from None
    except Exception as error:
        # Whatever the module's own code raised: the handler cannot run, and the module's error
        # (not ours) is what the operator must fix.
        raise _import_failed(module_name, error) from None
    try:
        handler: type = getattr(module, attr)
    except AttributeError:
        raise _CommandError(
            ExitCode.USAGE, f"module {module_name!r} has no attribute {attr!r}; name a class it defines"
        ) from None
    return handler


def _import_failed(module_name: str, error: Exception) -> _CommandError:
    return _CommandError(
        ExitCode.USAGE,
        f"cannot import handler module {module_name!r}: importing it raised {type(error).__name__}: "
        f"{error}. Fix the module; `python -c 'import {module_name}'` shows the traceback",
    )


def _cmd_run(args: argparse.Namespace) -> ExitCode:
    from flowwarden.runtime import Connector, ForcedStop

    # The connector builds its client once it runs; a URI PyMongo cannot parse is refused here,
    # before anything starts, with a message that cannot quote the password.
    _mongo_client(args.uri, connect=False).close()
    if "." not in sys.path:
        sys.path.insert(0, ".")
    handlers = [_load_handler(h) for h in args.handlers]
    connector = Connector(
        args.uri,
        handlers,
        instance_id=args.instance_id,
        checkpoint_database=args.checkpoint_database,
    )
    try:
        connector.run()
    except ForcedStop as stop:
        _say(
            f"stopped at once by a second {stop.signal_name}; the events of the handlers it abandoned "
            "stay unprocessed and are handled again after a restart"
        )
        # Not SystemExit: a handler stuck in a worker thread would keep the interpreter from
        # exiting, which is what the second signal asked for.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)
    errors = connector.stream_errors()
    for name, error in errors.items():
        _say(f"stream {name!r} failed: {type(error).__name__}: {error}")
    return ExitCode.FAILED if errors else ExitCode.CLEAN_STOP


# -- checkpoints --------------------------------------------------------------------------------


def _mongo_client(uri: str, *, connect: bool = True) -> pymongo.MongoClient[dict[str, Any]]:
    """A client for the one-shot commands; a URI PyMongo refuses ends the command (exit 2)."""
    import pymongo
    from pymongo.errors import ConfigurationError

    options: dict[str, Any] = {"tz_aware": True, "connect": connect}
    if not _URI_SETS_SERVER_SELECTION_TIMEOUT.search(uri):
        options["serverSelectionTimeoutMS"] = ONE_SHOT_SERVER_SELECTION_TIMEOUT_MS
    try:
        return pymongo.MongoClient(uri, **options)
    except (ConfigurationError, ValueError, TypeError) as error:
        raise _uri_refused(uri, error) from None


def _uri_refused(uri: str, error: Exception) -> _CommandError:
    # PyMongo quotes pieces of a URI it cannot parse, and a misplaced '@' or ':' can put a piece of
    # the password in them: such a message is withheld.
    message = str(error)
    if quotes_secret(message, uri):
        message = "its message is withheld because it may quote the password"
    return _CommandError(
        ExitCode.USAGE,
        f"PyMongo refused --uri {redact_uri(uri)}: {type(error).__name__}: {message}. Fix the URI; "
        "a user name or password must be escaped with urllib.parse.quote_plus",
    )


def _cmd_checkpoints(args: argparse.Namespace) -> ExitCode:
    from flowwarden.checkpoints import MongoCheckpointStore

    if args.action != "list" and not args.stream:
        raise _CommandError(ExitCode.USAGE, f"checkpoints {args.action}: name the stream")
    targets = [option for option in ("to_token", "to_time", "to_start") if getattr(args, option)]
    if args.action == "rewind" and len(targets) != 1:
        raise _CommandError(
            ExitCode.USAGE,
            'checkpoints rewind needs exactly one target: --to-token \'{"_data": "82..."}\' (resume '
            "after that event), --to-time 2026-11-20T08:00:00Z (resume at that cluster time) or "
            "--to-start (forget the position: the stream's start_position applies at its next start)",
        )
    if args.action != "rewind" and (targets or args.create):
        raise _CommandError(ExitCode.USAGE, "--to-token, --to-time, --to-start and --create are for rewind")
    token = _parse_token(args.to_token) if args.to_token else None
    at = _parse_time(args.to_time) if args.to_time else None
    with _mongo_client(args.uri) as client:
        store = MongoCheckpointStore(client[args.database], collection=args.collection)
        if args.action == "list":
            return _list_checkpoints(store)
        if args.action == "delete":
            found = store.delete(args.stream)
            print("deleted" if found else f"no checkpoint for stream {args.stream!r}")
            return ExitCode.CLEAN_STOP
        return _rewind(client, store, args, token, at)


def _rewind(client: Any, store: Any, args: argparse.Namespace, token: Any, at: Any) -> ExitCode:
    """Move one stream's stored position: check the target against the server, refuse a stream
    that has no checkpoint unless --create, print the old and the new position."""
    from flowwarden.errors import UnreadableCheckpointError
    from flowwarden.positions import ahead_of_server, cluster_time_of

    stream = args.stream
    try:
        before = store.load(stream)
        old = _position(before) if before is not None else None
    except UnreadableCheckpointError as error:
        before, old = True, f"unreadable ({error})"
    if before is None and not args.create:
        known = sorted(str(doc["_id"]) for doc in store.collection.find({}, projection={"_id": 1}))
        raise _CommandError(
            ExitCode.USAGE,
            f"no checkpoint for stream {stream!r} in {store.collection.full_name} (streams with one: "
            f"{', '.join(known) or 'none'}). Check the name and --database, or give --create to store "
            "a position for a stream that has none yet",
        )
    server_time = cluster_time_of(client.admin.command("ping"))
    if at is not None:
        token = _token_at(client[args.database], at, server_time)
    if token is not None:
        reason = ahead_of_server(token, server_time)
        if reason is not None:
            raise _CommandError(ExitCode.USAGE, f"--to-token {json_util.dumps(token)} is refused: {reason}")
    store.rewind(stream, token)
    print(f"stream {stream!r}")
    print(f"  before: {old or 'no checkpoint'}")
    if token is None:
        print("  now:    no position; the stream's start_position applies at its next start")
    else:
        print(f"  now:    {_position(store.load(stream))}")
    print("  Stop every instance running this stream before it starts again: a running one keeps saving.")
    return ExitCode.CLEAN_STOP


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
        raise _CommandError(
            ExitCode.USAGE,
            f"--to-time {text!r} is not an ISO-8601 date-time with a time zone; give one such as "
            "2026-11-20T08:00:00Z or 2026-11-20T09:00:00+01:00",
        )
    return Timestamp(int(moment.timestamp() // 1), 0)


def _token_at(database: Any, at: Any, server_time: Any) -> Any:
    """The resume token of cluster time ``at``: the post-batch token of a change stream opened
    there with batchSize 0 (a position, not an event; resuming after it delivers what happened
    from ``at`` on)."""
    from pymongo.errors import OperationFailure

    from flowwarden.events import timestamp_datetime
    from flowwarden.positions import FUTURE_TOLERANCE_SECONDS

    when = timestamp_datetime(at).isoformat()
    if server_time is not None and at.time > server_time.time + FUTURE_TOLERANCE_SECONDS:
        raise _CommandError(
            ExitCode.USAGE,
            f"--to-time {when} is after the server's cluster time "
            f"({timestamp_datetime(server_time).isoformat()}); give a time that has passed",
        )
    try:
        with database.watch(start_at_operation_time=at, batch_size=0) as stream:
            token = stream.resume_token
    except OperationFailure as error:
        if error.code == 286:  # ChangeStreamHistoryLost
            raise _CommandError(
                ExitCode.USAGE,
                f"--to-time {when} is older than the oplog's oldest entry; what happened then can no "
                "longer be read. Give a later time, or --to-start",
            ) from None
        raise
    if token is None:
        raise _CommandError(ExitCode.USAGE, "the server returned no position for --to-time")
    return dict(token)


def _parse_token(text: str) -> Any:
    from flowwarden.events import InvalidTokenError, check_resume_token

    try:
        token = json_util.loads(text)
    except (ValueError, TypeError, BSONError) as error:
        raise _CommandError(
            ExitCode.USAGE,
            f"--to-token is not valid JSON ({type(error).__name__}: {error}); give a resume token such "
            'as \'{"_data": "8263..."}\', in single quotes so the shell passes it unchanged',
        ) from None
    if not isinstance(token, dict) or set(token) != {"_data"}:
        raise _CommandError(
            ExitCode.USAGE, '--to-token takes a resume token such as \'{"_data": "8263..."}\''
        )
    try:
        check_resume_token(token)
    except InvalidTokenError as error:
        raise _CommandError(
            ExitCode.USAGE,
            f"--to-token is not a resume token the server could resume from: {error}. Copy the _id "
            "of a change event, or a lastProcessedToken from `flowwarden checkpoints list`",
        ) from None
    return token


def _list_checkpoints(store: Any) -> ExitCode:
    """Print one JSON line per checkpoint document, readable or not, in stream order.

    An unreadable document does not hide the others: it gets a line with its ``_id`` and the
    reason, and the exit status says that some were unreadable.
    """
    import bson
    from bson.codec_options import CodecOptions, DatetimeConversion
    from bson.errors import InvalidBSON
    from bson.raw_bson import RawBSONDocument

    from flowwarden.checkpoints import Checkpoint
    from flowwarden.errors import CheckpointError

    collection = store.collection
    strict = collection.codec_options
    # Only to name an undecodable document: read its _id however odd the rest of it is.
    lenient = strict.with_options(
        datetime_conversion=DatetimeConversion.DATETIME_AUTO, unicode_decode_error_handler="replace"
    )
    raw = collection.with_options(codec_options=CodecOptions(document_class=RawBSONDocument))
    unreadable = 0
    for document in raw.find({}, sort=[("_id", 1)]):
        try:
            checkpoint = Checkpoint.from_document(bson.decode(document.raw, strict))
        except InvalidBSON as error:
            reason = f"cannot be decoded: {error}"
        except CheckpointError as error:
            reason = str(error)
        else:
            print(json.dumps(_listing(checkpoint)))
            continue
        unreadable += 1
        try:
            stream_id = bson.decode(document.raw, lenient).get("_id")
        except InvalidBSON:
            stream_id = None
        print(json_util.dumps({"stream": stream_id, "unreadable": reason}))
    if unreadable:
        _say(
            f"{unreadable} checkpoint document(s) in {collection.full_name} cannot be read (the "
            '"unreadable" lines above); fix each, or delete it with `flowwarden checkpoints delete STREAM` '
            "and let that stream start from its start_position"
        )
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
    }


def _mongodb_unavailable(error: BaseException, uri: str) -> _CommandError | None:
    """The exit-3 report if ``error`` (or what caused it) means MongoDB was out of reach or refused
    the credentials; None for any other error."""
    from pymongo.errors import ConnectionFailure, OperationFailure

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionFailure):
            # A server selection timeout appends the whole topology description; the first part
            # (each host and why it could not be reached) is what the operator can act on.
            detail = str(cause).split(", Topology Description:")[0]
            return _CommandError(
                ExitCode.MONGODB_UNAVAILABLE,
                f"cannot reach MongoDB at {redact_uri(uri)}: {type(cause).__name__}: {detail}. Check "
                "that the deployment is running and reachable from here, and that --uri names it",
            )
        if isinstance(cause, OperationFailure) and cause.code in _CREDENTIALS_REFUSED:
            return _CommandError(
                ExitCode.MONGODB_UNAVAILABLE,
                f"MongoDB at {redact_uri(uri)} refused the credentials: {type(cause).__name__}: "
                f"{cause}. Check the user name, password and authSource in --uri, and that the user "
                "may read and write the checkpoint collection",
            )
        cause = cause.__cause__
    return None


# -- embedded-mongo, demo -----------------------------------------------------------------------


def _cmd_embedded(args: argparse.Namespace) -> ExitCode:
    from flowwarden.testing import EmbeddedReplicaSet

    try:
        rs = EmbeddedReplicaSet(port=args.port, oplog_max_events=args.oplog_max_events).start()
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            problem = f"port {args.port} on 127.0.0.1 is already in use; stop the process that holds it"
        else:
            problem = f"cannot listen on 127.0.0.1:{args.port} ({error.strerror or error})"
        raise _CommandError(ExitCode.USAGE, f"{problem} or choose another --port") from None
    print(f"EmbeddedReplicaSet (a test double, not a production database) at {rs.uri}", file=sys.stderr)
    rs.serve_forever()
    return ExitCode.CLEAN_STOP


def _cmd_demo(args: argparse.Namespace) -> int:
    from flowwarden.demo import run_demo

    return run_demo(events=args.events, output=args.output, use_spark=not args.no_spark)


# -- the command --------------------------------------------------------------------------------


def _exit_codes_epilog() -> str:
    lines = ["exit codes:"]
    lines += [f"  {int(code):<4} {meaning}" for code, meaning in EXIT_CODE_MEANINGS.items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="flowwarden",
        description=(__doc__ or "").split("\n\n")[0].replace("``", ""),
        epilog=_exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run handler classes until SIGINT/SIGTERM")
    run.add_argument("handlers", nargs="+", help="package.module:HandlerClass")
    run.add_argument("--uri", required=True, help="MongoDB URI of a replica set or sharded cluster")
    run.add_argument("--instance-id", default=None)
    run.add_argument("--checkpoint-database", default="flowwarden")
    run.set_defaults(func=_cmd_run)

    cps = sub.add_parser("checkpoints", help="list, rewind or delete stored checkpoints")
    cps.add_argument("action", choices=["list", "rewind", "delete"])
    cps.add_argument("stream", nargs="?")
    cps.add_argument("--uri", required=True)
    cps.add_argument("--database", required=True, help="database holding the checkpoint collection")
    cps.add_argument("--collection", default="_fw_checkpoints")
    cps.add_argument("--to-token", default=None, help="rewind: resume after this token (JSON)")
    cps.add_argument("--to-time", default=None, help="rewind: resume at this ISO-8601 time, with its zone")
    cps.add_argument(
        "--to-start", action="store_true", help="rewind: forget the position (start_position applies)"
    )
    cps.add_argument("--create", action="store_true", help="rewind: a stream with no checkpoint yet")
    cps.set_defaults(func=_cmd_checkpoints)

    emb = sub.add_parser("embedded-mongo", help="run the embedded test replica set in the foreground")
    emb.add_argument("--port", type=_port, default=27017, help="TCP port, 1 to 65535 (default 27017)")
    emb.add_argument("--oplog-max-events", type=_positive_int, default=None)
    emb.set_defaults(func=_cmd_embedded)

    demo = sub.add_parser("demo", help="orders -> change stream -> Spark, on the embedded replica set")
    demo.add_argument("--events", type=_positive_int, default=2000)
    demo.add_argument("--output", default="out/demo", help="folder for the parquet output")
    demo.add_argument("--no-spark", action="store_true", help="skip the Spark part")
    demo.set_defaults(func=_cmd_demo)
    for subparser in (run, cps, emb, demo):
        subparser.epilog = parser.epilog
        subparser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse has already reported
        return exit_.code if isinstance(exit_.code, int) else ExitCode.USAGE
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("flowwarden").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return int(args.func(args))
    except _CommandError as error:
        _say(error.message)
        return error.code
    except KeyboardInterrupt:
        _say("interrupted")
        return ExitCode.INTERRUPTED
    except Exception as error:
        return _report(error, getattr(args, "uri", None))


def _report(error: Exception, uri: str | None) -> ExitCode:
    """Report an error a command did not handle itself, or raise it again if it is not one we know."""
    from pymongo.errors import ConfigurationError, PyMongoError

    unavailable = _mongodb_unavailable(error, uri) if uri is not None else None
    if unavailable is not None:
        _say(unavailable.message)
        return unavailable.code
    if isinstance(error, ConfigurationError) and uri is not None:
        refused = _uri_refused(uri, error)
        _say(refused.message)
        return refused.code
    if isinstance(error, FlowWardenError):
        _say(str(error))
        return ExitCode.USAGE
    if isinstance(error, PyMongoError) and uri is not None:
        _say(f"MongoDB at {redact_uri(uri)} refused the command: {type(error).__name__}: {error}")
        return ExitCode.USAGE
    raise error


if __name__ == "__main__":
    raise SystemExit(main())
