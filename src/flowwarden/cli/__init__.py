"""The ``flowwarden`` command: run handler classes, see where streams stand, inspect and move
checkpoints, work the dead-letter queue, request snapshots of running streams, start the
embedded replica set, run the demo.

This package owns what a shell sees. Every failure it knows of ends as one line on stderr that
starts with ``flowwarden:``, says what was wrong and what to do, and one of these exit codes
(:class:`ExitCode`):

- 0: clean stop.
- 1: a stream failed or ended with an error (``run``; one line per stream), or a document could not
  be read (``checkpoints list`` and ``status``, which still show every readable one; ``dlq replay``
  when an entry failed again).
- 2: usage or configuration error: bad arguments, settings or config file, a handler that cannot
  be imported, an invalid token, JSON or URI, a port that cannot be used, a FlowWardenError at
  start-up, or MongoDB refusing a command for a reason other than the credentials; and for
  ``status``, a stream whose position has left the oplog (its history is lost).
- 3: the MongoDB deployment could not be reached or refused the credentials, when the command
  needed it (``checkpoints``, ``status``, ``dlq``, ``snapshot``).
- 130: interrupted (Ctrl-C), or stopped at once by a second SIGINT/SIGTERM during ``run``'s
  graceful stop.

It never prints a traceback for those, and never prints a URI's password: URIs go through
:func:`flowwarden.mongo.redaction.redact_uri` first. Settings (the URI above all) come from flags,
``FLOWWARDEN_*`` environment variables or a TOML file: see :mod:`flowwarden.cli.settings`.

Modules: :mod:`~flowwarden.cli.common` (exit codes, errors, the client), :mod:`~.settings`,
:mod:`~.run`, :mod:`~.checkpoints`, :mod:`~.status`, :mod:`~.dlq`, :mod:`~.snapshot`,
:mod:`~.local` (the embedded replica set and the demo).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from flowwarden.cli import checkpoints, dlq, local, run, snapshot, status
from flowwarden.cli.common import EXIT_CODE_MEANINGS, CommandError, ExitCode, Parser, report, say
from flowwarden.cli.settings import load, unknown_variables

__all__ = ["EXIT_CODE_MEANINGS", "ExitCode", "build_parser", "main"]


def _exit_codes_epilog() -> str:
    lines = ["exit codes:"]
    lines += [f"  {int(code):<4} {meaning}" for code, meaning in EXIT_CODE_MEANINGS.items()]
    lines += [
        "",
        "settings: flags win over FLOWWARDEN_* environment variables, which win over the --config file",
        "(or FLOWWARDEN_CONFIG); FLOWWARDEN_URI_FILE reads the URI from a file.",
    ]
    return "\n".join(lines)


def _connection_options() -> Parser:
    """The options of every command that talks to MongoDB."""
    options = Parser(add_help=False)
    options.add_argument(
        "--uri",
        default=None,
        help="MongoDB URI of a replica set or sharded cluster; better kept out of the command line: "
        "FLOWWARDEN_URI or FLOWWARDEN_URI_FILE (a file holding it)",
    )
    options.add_argument(
        "--config", default=None, metavar="PATH", help="a TOML file of settings (or FLOWWARDEN_CONFIG)"
    )
    options.add_argument(
        "--server-selection-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to wait for the deployment before exiting with code 3 (default: 10; run: at "
        "start-up only)",
    )
    options.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default: INFO (any case)",
    )
    options.add_argument(
        "--log-format",
        default=None,
        choices=["text", "json"],
        help="json: one object per line (default: text)",
    )
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="flowwarden",
        description=(__doc__ or "").split("\n\n")[0].replace("``", ""),
        epilog=_exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at DEBUG level (as --log-level DEBUG)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    connection = _connection_options()
    commands = [
        run.add_parser(sub, connection),
        status.add_parser(sub, connection),
        checkpoints.add_parser(sub, connection),
        dlq.add_parser(sub, connection),
        snapshot.add_parser(sub, connection),
        *local.add_parsers(sub),
    ]
    commands[0].set_defaults(func=run.run, needs_settings=True)
    commands[1].set_defaults(func=status.status, needs_settings=True)
    commands[2].set_defaults(func=checkpoints.checkpoints, needs_settings=True)
    commands[3].set_defaults(func=dlq.dlq, needs_settings=True)
    commands[4].set_defaults(func=snapshot.snapshot, needs_settings=True)
    for command in commands:
        for each in (command, *_subcommands(command)):
            each.epilog = parser.epilog
            each.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of a command's own subcommands (``snapshot request``...)."""
    return [
        each
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for each in action.choices.values()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from flowwarden.cli import logs

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse has already reported
        return exit_.code if isinstance(exit_.code, int) else ExitCode.USAGE
    uri = None
    try:
        if not args.needs_settings:
            logs.configure("DEBUG" if args.verbose else "INFO", "text")
            return int(args.func(args))
        settings = load(
            {
                "uri": args.uri,
                "log_level": "DEBUG" if args.verbose else args.log_level,
                "log_format": args.log_format,
                "server_selection_timeout": args.server_selection_timeout,
                **{name: getattr(args, name, None) for name in run.RUN_SETTINGS},
            },
            args.config,
        )
        logs.configure(settings.log_level, settings.log_format)
        for warning in unknown_variables():
            logging.getLogger(__name__).warning("%s", warning)
        uri = settings.uri.get_secret_value() if settings.uri is not None else None
        return int(args.func(args, settings))
    except CommandError as error:
        say(error.message)
        return error.code
    except BrokenPipeError:
        # The reader went away (`flowwarden checkpoints list | head -1`): what it wanted it got.
        # Nothing more may reach the closed pipe, not even the interpreter's flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.CLEAN_STOP
    except KeyboardInterrupt:
        say("interrupted")
        return ExitCode.INTERRUPTED
    except Exception as error:
        return report(error, uri)
