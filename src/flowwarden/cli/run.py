"""``flowwarden run``: import handler classes and run them until SIGINT/SIGTERM.

Its output is flowwarden's log on stderr, in the format asked for, and nothing else: Spark's JVM
(started for ``@on_dataframe`` handlers) writes to the ``spark_log`` file, or through the logger
``spark`` into that same log, never straight to stderr. While a stream copies its existing
documents, a terminal (stderr a TTY, text logs) also shows a progress bar per copying stream; a
pipe or a file, and JSON logs, never get one.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
from typing import Any

from flowwarden.cli.common import CommandError, ExitCode, Parser, mongo_client, say
from flowwarden.cli.settings import Settings

log = logging.getLogger(__name__)

SPARK_LOGGER = "spark"
"""The logger that gets the lines of Spark's JVM when no ``spark_log`` file is set."""
_BAR_REFRESH_SECONDS = 0.5


def load_handler(path: str) -> type:
    """The class ``package.module:ClassName`` names; a name that cannot be imported ends the
    command with what to fix."""
    module_name, _, attr = path.partition(":")
    if "." not in sys.path:
        sys.path.insert(0, ".")  # handler modules are found from the working folder, as with python -m
    if not module_name or not attr:
        raise CommandError(ExitCode.USAGE, f"handler {path!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as error:
        raise CommandError(
            ExitCode.USAGE,
            f"cannot import handler module {module_name!r}: {type(error).__name__} in "
            f"{error.filename}, line {error.lineno}: {error.msg}. Fix the module and run again",
        ) from None
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name + ".").startswith(error.name + "."):
            raise CommandError(
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
        raise CommandError(
            ExitCode.USAGE, f"module {module_name!r} has no attribute {attr!r}; name a class it defines"
        ) from None
    return handler


def _import_failed(module_name: str, error: Exception) -> CommandError:
    return CommandError(
        ExitCode.USAGE,
        f"cannot import handler module {module_name!r}: importing it raised {type(error).__name__}: "
        f"{error}. Fix the module; `python -c 'import {module_name}'` shows the traceback",
    )


def run(args: argparse.Namespace, settings: Settings) -> ExitCode:
    from flowwarden.runtime import Connector, ForcedStop

    uri = settings.mongodb_uri()
    # Before anything starts: a URI PyMongo cannot parse is refused with a message that cannot
    # quote the password, the handler classes are imported, and a deployment that does not answer
    # within server_selection_timeout ends the command (exit 3) instead of a connector retrying a
    # wrong URI forever. Once running, outages are waited out.
    mongo_client(uri, connect=False).close()
    handlers = [load_handler(h) for h in args.handlers]
    with settings.client() as client:
        client.admin.command("ping")
    try:
        connector = Connector(
            uri,
            handlers,
            instance_id=settings.instance_id,
            checkpoint_database=settings.checkpoint_database,
            metrics_port=settings.metrics_port,
            metrics_host=settings.metrics_host,
            progress_interval=settings.progress_interval,
            spark_master=settings.spark_master,
            spark_conf=settings.spark_conf,
            spark_log=settings.spark_log or logging.getLogger(SPARK_LOGGER),
        )
        log.info("flowwarden run with %s", settings.in_effect(connector.instance_id))
        bars = _CopyBars(connector) if settings.log_format == "text" and _terminal(sys.stderr) else None
        try:
            if bars is not None:
                bars.start()
            connector.run()
        finally:
            if bars is not None:
                bars.finish()
    except ForcedStop as stop:
        say(
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
        say(f"stream {name!r} failed: {type(error).__name__}: {error}")
    return ExitCode.FAILED if errors else ExitCode.CLEAN_STOP


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


class _CopyBars(threading.Thread):
    """While streams copy their existing documents (``snapshot``), one progress bar each on
    stderr: copied of the estimate, percent, rate, time left. Log lines print above the bars;
    the bars go once no stream copies."""

    def __init__(self, connector: Any) -> None:
        super().__init__(name="flowwarden-copy-bars", daemon=True)
        self._connector = connector
        self._done = threading.Event()

    def finish(self) -> None:
        self._done.set()
        self.join(5)

    def run(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            Task,
            TaskID,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class Rate(ProgressColumn):
            def render(self, task: Task) -> Text:
                return Text(f"{task.speed:,.0f}/s" if task.speed else "")

        bars: Progress | None = None
        tasks: dict[str, TaskID] = {}
        try:
            while not self._done.wait(_BAR_REFRESH_SECONDS):
                copying = {
                    name: status.snapshot
                    for name, status in self._connector.status().items()
                    if status.snapshot is not None and not status.snapshot.done
                }
                if copying and bars is None:
                    bars = Progress(
                        TextColumn("{task.description}"),
                        BarColumn(),
                        MofNCompleteColumn(),
                        TaskProgressColumn(),
                        Rate(),
                        TimeRemainingColumn(),
                        # Log lines print above the bars whole, as they would without them.
                        console=Console(stderr=True, soft_wrap=True),
                        transient=True,
                        redirect_stderr=True,
                    )
                    bars.start()
                if bars is None:
                    continue
                for name, snapshot in copying.items():
                    total = max(snapshot.total or 0, snapshot.copied) or None
                    if name not in tasks:
                        tasks[name] = bars.add_task(f"{name}: initial snapshot", total=total)
                    bars.update(tasks[name], completed=snapshot.copied, total=total)
                for name in [name for name in tasks if name not in copying]:
                    bars.remove_task(tasks.pop(name))
                if not tasks:
                    bars.stop()
                    bars = None
        finally:
            if bars is not None:
                bars.stop()


RUN_SETTINGS = (
    "instance_id",
    "checkpoint_database",
    "metrics_port",
    "metrics_host",
    "progress_interval",
    "spark_master",
    "spark_conf",
    "spark_log",
)
"""The settings only ``run`` has flags for."""


def add_parser(sub: argparse._SubParsersAction[Parser], connection: Parser) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "run",
        parents=[connection],
        help="run handler classes until SIGINT/SIGTERM",
        description="Run handler classes until SIGINT or SIGTERM asks for a graceful stop (handlers in "
        "flight finish, checkpoints are saved); a second signal stops at once. Settings come from "
        "the flags, then FLOWWARDEN_* environment variables, then the --config file, then defaults.",
    )
    parser.add_argument("handlers", nargs="+", metavar="module:Class", help="a handler class to run")
    parser.add_argument(
        "--instance-id",
        default=None,
        help="this process's name in checkpoints, leases and logs (default: generated); give each "
        "process its own",
    )
    parser.add_argument(
        "--checkpoint-database",
        default=None,
        help="where streams over a whole deployment keep their checkpoints (default: flowwarden)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics (Prometheus), /healthz and /readyz on this port; 0 picks a free one",
    )
    parser.add_argument(
        "--metrics-host",
        default=None,
        help="the address the metrics port listens on (default: 127.0.0.1, this machine only)",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=None,
        help="seconds between the INFO progress lines of each stream; 0 for none (default: 30)",
    )
    parser.add_argument(
        "--spark-master",
        default=None,
        help="the Spark master of the session started for @on_dataframe handlers (default: local[*])",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="a Spark setting of that session; give the flag once per setting",
    )
    parser.add_argument(
        "--spark-log",
        default=None,
        metavar="PATH",
        help="a file for the output of Spark's JVM and its Python workers, appended (default: "
        "flowwarden's log, as the logger 'spark', WARN and above)",
    )
    return parser
