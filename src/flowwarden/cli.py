"""The ``flowwarden`` command: run handler classes, inspect and rewind checkpoints, start the
embedded replica set, run the demo."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from bson import json_util

from flowwarden.errors import FlowWardenError


def _load_handler(path: str) -> type:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"flowwarden: handler {path!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"flowwarden: cannot import {module_name!r}: {error}") from None
    try:
        handler: type = getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"flowwarden: module {module_name!r} has no attribute {attr!r}") from None
    return handler


def _cmd_run(args: argparse.Namespace) -> int:
    from flowwarden.runtime import Connector, StreamState

    sys.path.insert(0, ".")
    handlers = [_load_handler(h) for h in args.handlers]
    connector = Connector(
        args.uri,
        handlers,
        instance_id=args.instance_id,
        checkpoint_database=args.checkpoint_database,
    )
    connector.run()
    failed = {n: s for n, s in connector.status().items() if s.state == StreamState.FAILED}
    for name, status in failed.items():
        print(f"stream {name} FAILED: {status.last_error}", file=sys.stderr)
    return 1 if failed else 0


def _store(args: argparse.Namespace) -> Any:
    import pymongo

    from flowwarden.checkpoint import MongoCheckpointStore

    client: pymongo.MongoClient[Any] = pymongo.MongoClient(args.uri, tz_aware=True)
    return MongoCheckpointStore(client[args.database], collection=args.collection)


def _cmd_checkpoints(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.action == "list":
        for cp in store.list():
            print(
                json.dumps(
                    {
                        "stream": cp.stream_id,
                        "lastProcessedTimestamp": cp.last_processed_at.isoformat()
                        if cp.last_processed_at
                        else None,
                        "lastSeenTimestamp": cp.last_seen_at.isoformat() if cp.last_seen_at else None,
                        "eventsProcessed": cp.events_processed,
                        "epoch": cp.epoch,
                        "instanceId": cp.instance_id,
                    }
                )
            )
        return 0
    if not args.stream:
        raise SystemExit(f"flowwarden checkpoints {args.action}: name the stream")
    if args.action == "delete":
        found = store.delete(args.stream)
        print("deleted" if found else f"no checkpoint for stream {args.stream!r}")
        return 0
    token = None
    if args.to_token:
        token = json_util.loads(args.to_token)
        if not isinstance(token, dict) or "_data" not in token:
            raise SystemExit('flowwarden: --to-token takes a resume token such as \'{"_data": "8263..."}\'')
    store.rewind(args.stream, token)
    print(f"stream {args.stream!r} rewound to {token if token else 'its start_position (no token)'}")
    return 0


def _cmd_embedded(args: argparse.Namespace) -> int:
    from flowwarden.testing import EmbeddedReplicaSet

    rs = EmbeddedReplicaSet(port=args.port, oplog_max_events=args.oplog_max_events).start()
    print(f"EmbeddedReplicaSet (a test double, not a production database) at {rs.uri}", file=sys.stderr)
    rs.serve_forever()
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from flowwarden.demo import run_demo

    return run_demo(events=args.events, output=args.output, use_spark=not args.no_spark)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowwarden", description=__doc__)
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
    cps.add_argument("--to-token", default=None, help="rewind: resume token JSON; omit to clear")
    cps.set_defaults(func=_cmd_checkpoints)

    emb = sub.add_parser("embedded-mongo", help="run the embedded test replica set in the foreground")
    emb.add_argument("--port", type=int, default=27017)
    emb.add_argument("--oplog-max-events", type=int, default=None)
    emb.set_defaults(func=_cmd_embedded)

    demo = sub.add_parser("demo", help="orders -> change stream -> Spark, on the embedded replica set")
    demo.add_argument("--events", type=int, default=2000)
    demo.add_argument("--output", default="out/demo", help="folder for the parquet output")
    demo.add_argument("--no-spark", action="store_true", help="skip the Spark part")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("flowwarden").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        code: int = args.func(args)
    except FlowWardenError as error:
        print(f"flowwarden: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
