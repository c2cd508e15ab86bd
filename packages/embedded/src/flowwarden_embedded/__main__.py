"""``embedded-mongo`` (or ``python -m flowwarden_embedded``): the test double in the foreground.

Prints the URI to connect to on standard output (``--port 0`` picks a free port) and serves until
Ctrl-C or SIGTERM; exits 0 then, 2 on bad arguments or a port it cannot listen on.
"""

from __future__ import annotations

import argparse
import errno
import sys

from flowwarden_embedded.server import EmbeddedReplicaSet


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a TCP port; give a number from 0 (any free one) to 65535"
        )
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="embedded-mongo",
        description="Run EmbeddedReplicaSet, a MongoDB test double, on 127.0.0.1 until Ctrl-C or SIGTERM "
        "(then exit 0). Data lives in memory only. It is not a database for production data.",
    )
    parser.add_argument(
        "--port", type=_port, default=27017, help="TCP port; 0 picks a free one (default 27017)"
    )
    parser.add_argument(
        "--oplog-max-events", type=_positive, default=None, help="keep at most this many oplog entries"
    )
    args = parser.parse_args(argv)
    try:
        rs = EmbeddedReplicaSet(port=args.port, oplog_max_events=args.oplog_max_events).start()
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            problem = f"port {args.port} on 127.0.0.1 is already in use"
        else:
            problem = f"cannot listen on 127.0.0.1:{args.port} ({error.strerror or error})"
        print(f"embedded-mongo: {problem}; choose another --port (0 picks a free one)", file=sys.stderr)
        return 2
    print(rs.uri, flush=True)
    rs.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
