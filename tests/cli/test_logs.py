"""The log formats: JSON lines carry stream and token as fields; a stream's logger keeps both."""

from __future__ import annotations

import io
import json
import logging

from flowwarden.cli.logs import JsonFormatter
from flowwarden.runtime.context import StreamLogger


def records_of(logger_name: str) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(logger_name)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def test_a_streams_lines_carry_its_name_and_the_events_token():
    logger, out = records_of("flowwarden.tests.logs")
    log = StreamLogger(logger, {"stream": "orders"})
    log.warning("skipping %d event(s)", 1, extra={"token": {"_data": "8263AB"}})
    log.info("plain")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {
        "timestamp": first["timestamp"],
        "level": "WARNING",
        "logger": "flowwarden.tests.logs",
        "message": "skipping 1 event(s)",
        "stream": "orders",
        "token": "8263AB",
    }
    assert first["timestamp"].endswith("+00:00") and "T" in first["timestamp"]
    assert second["stream"] == "orders" and "token" not in second


def test_an_exception_goes_into_its_own_field():
    logger, out = records_of("flowwarden.tests.logs.exc")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    (line,) = (json.loads(line) for line in out.getvalue().splitlines())
    assert line["message"] == "failed" and "ValueError: boom" in line["exception"]
    assert "stream" not in line
