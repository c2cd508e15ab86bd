"""A start_at the deployment has not reached yet is refused: the stream fails saying so, and
stores no position in the future."""

from __future__ import annotations

from datetime import datetime, timezone

from flowwarden import StartPosition, StreamState
from helpers import checkpoint_doc, running, wait_until

from .handlers import recording_handler


def test_a_start_at_in_the_future_fails_the_stream_and_stores_nothing(mongodb_uri, client, db_name):
    later = datetime(2099, 1, 1, tzinfo=timezone.utc)
    handler, seen = recording_handler(db_name, start_position=StartPosition.AT_TIME, start_at=later)
    with running(mongodb_uri, [handler]) as connector:
        status = wait_until(
            lambda: (s := connector.status()["orders"]).state == StreamState.FAILED and s,
            what="the stream to fail",
        )
    assert "start_at 2099-01-01T00:00:00+00:00 is after the deployment's current time" in status.last_error
    assert checkpoint_doc(client, db_name, "orders") is None
    assert seen == []
