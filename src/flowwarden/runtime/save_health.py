"""Whether a stream's checkpoint saves get through to the store: what its status, ``/readyz``, the
progress line and the metrics say about saving.

The rule it keeps: only a successful write clears a failure. Saves that failed in a row and a
save the store has not answered both count, across the committers of the stream's runs (a re-open
after the committer gave up does not mend the store). A stream is reported as unable to save once
that has lasted :data:`SAVE_GRACE_SECONDS`, so one failed save that its retry at the next trigger
mends never shows. The error kept is one line with every MongoDB URI redacted: it goes into a
probe's body and a log line.

Nothing here waits for the store or changes how saves are made: the committer decides that.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from flowwarden.mongo.redaction import redact_uris
from flowwarden.runtime.metrics import StreamMetrics

SAVE_GRACE_SECONDS = 10.0
"""How long saves may fail, or wait for the store, before the stream is reported unable to save:
twice the default save interval, so that a failed save retried by the next heartbeat never shows."""

_ERROR_CHARS = 500  # a probe's body and a log line stay short; the committer's warning has it all


class SaveHealth:
    """One stream's record of its failed and unanswered checkpoint writes; written on the
    stream's event loop, read from any thread (plain attributes, replaced whole)."""

    def __init__(self, metrics: StreamMetrics | None) -> None:
        self._metrics = metrics
        self.failures = 0
        """Writes that failed since the last one that succeeded."""
        self.error: str | None = None
        """The last failed write's error, one line (see :func:`one_line`); None after a success."""
        self._since: float | None = None  # time.monotonic() when the first of the failed writes began

    def saved(self, seconds: float) -> None:
        """A write succeeded and took ``seconds`` (the committer's ``on_saved``)."""
        if self._metrics is not None:
            self._metrics.saved(seconds)
        if self.failures:
            self.failures = 0
            self.error = None
            self._since = None

    def failed(self, error: BaseException, began: float | None) -> None:
        """A write that began at ``began`` (``time.monotonic()``; None: now) failed with ``error``."""
        if self._metrics is not None:
            self._metrics.save_failed()
        self.failures += 1
        self.error = one_line(error)
        if self._since is None:
            self._since = began if began is not None else time.monotonic()

    def cannot_save_since(self, unanswered_since: float | None) -> datetime | None:
        """When the stream stopped getting its writes through, or None while they get through.

        ``unanswered_since`` is the committer's ``unconfirmed_since``: a write in progress counts
        from when it began. The answer is None until the first failed or unanswered write began
        at least :data:`SAVE_GRACE_SECONDS` ago.
        """
        since = self._since
        if unanswered_since is not None and (since is None or unanswered_since < since):
            since = unanswered_since
        if since is None:
            return None
        waited = time.monotonic() - since
        if waited < SAVE_GRACE_SECONDS:
            return None
        return datetime.now(timezone.utc) - timedelta(seconds=waited)


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, MongoDB URIs redacted, at most 500 characters."""
    text = " ".join(redact_uris(f"{type(error).__name__}: {error}").split())
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


__all__ = ["SAVE_GRACE_SECONDS", "SaveHealth", "one_line"]
