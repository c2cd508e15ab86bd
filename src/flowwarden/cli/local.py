"""``flowwarden embedded-mongo`` and ``flowwarden demo``: the test double, and the demo on it."""

from __future__ import annotations

import argparse
import errno
import sys

from flowwarden.cli.common import CommandError, ExitCode, Parser, port, positive_int


def embedded(args: argparse.Namespace) -> ExitCode:
    from flowwarden.testing import EmbeddedReplicaSet

    try:
        rs = EmbeddedReplicaSet(port=args.port, oplog_max_events=args.oplog_max_events).start()
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            problem = f"port {args.port} on 127.0.0.1 is already in use; stop the process that holds it"
        else:
            problem = f"cannot listen on 127.0.0.1:{args.port} ({error.strerror or error})"
        raise CommandError(ExitCode.USAGE, f"{problem} or choose another --port") from None
    print(f"EmbeddedReplicaSet (a test double, not a production database) at {rs.uri}", file=sys.stderr)
    print(rs.uri, flush=True)  # stdout: for a script to read, also with --port 0
    rs.serve_forever()
    return ExitCode.CLEAN_STOP


def demo(args: argparse.Namespace) -> int:
    from flowwarden.cli.demo import run_demo

    return run_demo(events=args.events, output=args.output, use_spark=not args.no_spark)


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> list[argparse.ArgumentParser]:
    emb = sub.add_parser(
        "embedded-mongo",
        help="run the embedded test replica set in the foreground",
        description="Run EmbeddedReplicaSet, the MongoDB test double flowwarden's tests and demo use, on "
        "127.0.0.1 until Ctrl-C or SIGTERM, then exit 0. Its URI goes to standard output. Data lives in "
        "memory only: it is not a database for production data.",
    )
    emb.add_argument(
        "--port", type=port, default=27017, help="TCP port, 1 to 65535, or 0 for a free one (default 27017)"
    )
    emb.add_argument(
        "--oplog-max-events",
        type=positive_int,
        default=None,
        help="keep at most this many oplog entries (to try lost history)",
    )
    emb.set_defaults(func=embedded, needs_settings=False)

    dem = sub.add_parser(
        "demo",
        help="orders -> change stream -> Spark, on the embedded replica set",
        description="Write orders to an embedded replica set, run the connector until every change is in "
        "parquet, stop, write more, and restart it: the second run resumes where the first stopped, "
        "and every change is checked to arrive exactly once.",
    )
    dem.add_argument("--events", type=positive_int, default=2000, help="orders per run (default 2000)")
    dem.add_argument("--output", default="out/demo", help="folder for the parquet output and Spark's log")
    dem.add_argument("--no-spark", action="store_true", help="skip Spark: count the changes instead")
    dem.set_defaults(func=demo, needs_settings=False)
    return [emb, dem]
