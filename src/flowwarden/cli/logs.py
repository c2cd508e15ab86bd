"""How flowwarden's log lines look when a command writes them: text for people, JSON for machines.

Logger names are the module paths (``flowwarden.runtime.opening``,
``flowwarden.checkpoints.committer``...). Every record about a stream carries the stream's name as
``stream`` (each module logs through an adapter over its own logger:
:func:`~flowwarden.runtime.context.stream_logger`), and records about one change event carry its
resume token as ``token``; the JSON format turns both into fields of their own.

Nothing here may print a secret: the runtime redacts URIs before they reach a log call
(:mod:`flowwarden.mongo.redaction`), and this module adds only what the record already holds.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Literal

from bson import json_util

LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp (UTC, ISO 8601), level, logger, message, and stream,
    token and exception where the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        stream = getattr(record, "stream", None)
        if stream is not None:
            line["stream"] = stream
        token = getattr(record, "token", None)
        if isinstance(token, Mapping):
            line["token"] = token.get("_data", json.loads(json_util.dumps(token)))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes, so that a stderr replaced later
    (by a test runner, by a live terminal display) is followed rather than written past."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(level: LogLevel = "INFO", fmt: LogFormat = "text") -> None:
    """Send log records to stderr in ``fmt``: flowwarden's from ``level`` up, other libraries'
    from WARNING up (the root logger's default). Replaces the handler an earlier call installed
    and leaves any other handler alone."""
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(old)
    root.addHandler(handler)
    logging.getLogger("flowwarden").setLevel(level)


__all__ = ["JsonFormatter", "LogFormat", "LogLevel", "configure"]
