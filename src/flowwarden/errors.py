"""The one error tree of flowwarden.

Every error flowwarden raises on purpose is a :class:`FlowWardenError`, and every public one is
defined here. Each carries the data an operator needs (token, cluster time, attempts) as
attributes, the stream it is about always as :attr:`FlowWardenError.stream`, and its message says
what happened and what to do next. Nothing here retries or logs: callers decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any


class FlowWardenError(Exception):
    """Base of every error flowwarden raises on purpose."""

    stream: str | None = None
    """The name of the stream the error is about; None when it is about no single stream."""


class ConfigurationError(FlowWardenError, ValueError):
    """A decorator, connector or store was configured with a value it cannot accept.

    Raised at decoration or construction time, or when a stream starts with a setting that its
    deployment or store cannot serve (then ``stream`` names it); never while events flow.
    """

    def __init__(
        self,
        message: str,
        *,
        owner: str | None = None,
        option: str | None = None,
        value: Any = None,
        allowed: Sequence[Any] | str | None = None,
        stream: str | None = None,
    ) -> None:
        self.stream = stream
        self.problem = message
        """What is wrong, without the owner, the option and what is allowed."""
        self.owner = owner
        self.option = option
        self.value = value
        self.allowed = allowed
        parts = []
        if owner:
            parts.append(owner)
        if option:
            parts.append(f"option {option!r}")
        prefix = ": ".join([", ".join(parts), message]) if parts else message
        if allowed is not None:
            allowed_text = allowed if isinstance(allowed, str) else ", ".join(map(repr, allowed))
            prefix = f"{prefix} (allowed: {allowed_text})"
        super().__init__(prefix)


class MissingDependencyError(FlowWardenError, ImportError):
    """An optional extra is needed for what was asked; the message holds the pip line to run."""

    def __init__(self, feature: str, extra: str, package: str) -> None:
        self.feature = feature
        self.extra = extra
        self.package = package
        super().__init__(
            f"{feature} needs {package}, which is not installed. "
            f'Install it with: pip install "flowwarden[{extra}]"'
        )


class JavaNotFoundError(FlowWardenError):
    """Spark's JVM cannot start: no Java was found, or the one found did not start Spark.

    The message says what was looked for and how to install Java 17; ``without`` (when given)
    says how to go on without Spark.
    """

    def __init__(self, problem: str, without: str | None = None) -> None:
        self.problem = problem
        how = (
            "Install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew install "
            "openjdk@17) and point JAVA_HOME at it"
        )
        super().__init__(f"{problem}. {how}" + (f", or {without}" if without else ""))


class CheckpointError(FlowWardenError):
    """A checkpoint could not be read or written."""

    def __init__(self, message: str, *, stream: str | None = None) -> None:
        self.stream = stream
        super().__init__(message)


class UnreadableCheckpointError(CheckpointError):
    """A stored checkpoint cannot be read: a damaged document or file, or one another program wrote.

    A retry cannot fix it, so the stream fails at once; flowwarden never guesses a position and
    never overwrites the damaged record, so an operator can inspect it, then fix, rewind or delete it.
    """


class FencedError(CheckpointError):
    """A checkpoint write carried an epoch lower than the stored one.

    A newer owner holds the stream (it acquired the lease after this instance lost it). The
    fenced instance must stop processing the stream; nothing was written.
    """

    def __init__(self, stream: str, *, epoch: int, stored_epoch: int) -> None:
        self.epoch = epoch
        self.stored_epoch = stored_epoch
        super().__init__(
            f"stream {stream!r}: checkpoint write with epoch {epoch} refused, the store holds "
            f"epoch {stored_epoch}: another instance owns this stream now. Stop processing it; "
            "the owner continues from its own checkpoint.",
            stream=stream,
        )


class CommitterClosedError(CheckpointError):
    """A commit arrived after the committer was closed."""


class CheckpointSaveFailedError(CheckpointError):
    """Consecutive checkpoint saves failed; the stream stops rather than run unprotected."""

    def __init__(self, stream: str, *, failures: int, last_error: BaseException) -> None:
        self.failures = failures
        self.last_error = last_error
        super().__init__(
            f"stream {stream!r}: {failures} consecutive checkpoint saves failed "
            f"(last: {type(last_error).__name__}: {last_error}). The stream stops so it does not run "
            "without a durable position; fix the checkpoint store and restart.",
            stream=stream,
        )


class StreamError(FlowWardenError):
    """A change stream could not go on."""

    def __init__(self, message: str, *, stream: str | None = None) -> None:
        self.stream = stream
        super().__init__(message)


class ResumePositionError(StreamError):
    """A stored position cannot be resumed from: the server refused it, or it lies ahead of the
    server's cluster time (a token from another deployment, or written by hand).

    The stream fails at once and the checkpoint is left as it is; the message names the position
    and the ``flowwarden checkpoints rewind`` command that sets a good one.
    """

    def __init__(self, stream: str, *, token: Any, reason: str, hint: str | None = None) -> None:
        self.token = token
        self.reason = reason
        if hint is None:
            hint = (
                f"Set a position with `flowwarden checkpoints rewind {stream} --to-token ...|--to-time "
                "...|--to-start`, or delete the checkpoint to start from the stream's start_position."
            )
        super().__init__(
            f"stream {stream!r} cannot resume from its stored position {token!r}: {reason}. "
            f"The checkpoint was left untouched. {hint}",
            stream=stream,
        )


class RestartsExhaustedError(StreamError):
    """A stream kept failing with an error that is not known to be transient, ``max_restarts``
    times in a row without reading anything in between."""

    def __init__(self, stream: str, *, restarts: int, last_error: BaseException) -> None:
        self.restarts = restarts
        self.last_error = last_error
        super().__init__(
            f"stream {stream!r}: {type(last_error).__name__}: {last_error} (the same kind of error "
            f"ended {restarts} re-open(s) in a row, so a re-open does not fix it). Fix the cause and "
            "restart; @change_stream(max_restarts=...) sets how many re-opens are tried first.",
            stream=stream,
        )


class HistoryLostError(StreamError):
    """The resume position fell out of the oplog (server code 286, ChangeStreamHistoryLost)."""

    def __init__(
        self,
        stream: str,
        *,
        checkpoint_time: datetime | None,
        oplog_start: datetime | None,
        oplog_end: datetime | None,
        server_message: str = "",
    ) -> None:
        self.checkpoint_time = checkpoint_time
        self.oplog_start = oplog_start
        self.oplog_end = oplog_end
        self.server_message = server_message
        window = (
            f"{oplog_start.isoformat()} .. {oplog_end.isoformat()}"
            if oplog_start and oplog_end
            else "unknown (the oplog could not be read)"
        )
        at = checkpoint_time.isoformat() if checkpoint_time else "none"
        super().__init__(
            f"stream {stream!r}: the resume position is no longer in the oplog (history lost). "
            f"Last checkpoint time: {at}; current oplog window: {window}. The checkpoint was left "
            "untouched. To go on, choose a strategy with "
            "@checkpoint(on_history_lost=OnHistoryLost.RESUME_FROM_OPLOG_START) (replay what is left "
            "of the oplog) or OnHistoryLost.RESUME_FROM_NOW (skip the gap), or rewind the checkpoint "
            "with `flowwarden checkpoints rewind`.",
            stream=stream,
        )


class StreamInvalidatedError(StreamError):
    """The watched collection or database was dropped or renamed."""

    def __init__(self, stream: str, *, operation: str, token: dict[str, Any] | None) -> None:
        self.operation = operation
        self.token = token
        super().__init__(
            f"stream {stream!r} was invalidated by a {operation!r} of the watched namespace. "
            "It stopped; set @change_stream(..., on_invalidate='restart') to start again after it.",
            stream=stream,
        )


class HandlerError(StreamError):
    """A handler kept failing and the retry policy said STOP."""

    def __init__(
        self,
        stream: str,
        *,
        token: dict[str, Any] | None,
        attempts: int,
        cause: BaseException,
    ) -> None:
        self.token = token
        self.attempts = attempts
        self.cause = cause
        super().__init__(
            f"stream {stream!r}: handler failed {attempts} time(s) on event {token!r}: "
            f"{type(cause).__name__}: {cause}. The checkpoint stays before this event; fix the handler "
            "(or choose on_exhausted=OnError.SKIP / DEAD_LETTER) and restart.",
            stream=stream,
        )


class SchemaMismatchError(FlowWardenError, ValueError):
    """A change event's document does not fit the declared DataFrame schema (mode FAILFAST)."""

    def __init__(self, *, field: str, token: Any, index: int, reason: str) -> None:
        self.field = field
        self.token = token
        self.index = index
        self.reason = reason
        data = token.get("_data") if isinstance(token, dict) else token
        super().__init__(
            f"event {index} of the batch (token {data!r}): field {field!r} does not fit the schema: "
            f"{reason}. Fix the schema (or the document), or choose mode=PERMISSIVE (nulls plus "
            "_corrupt_record) or DROPMALFORMED (drop and dead-letter the event)."
        )


class UnreadableOffsetError(StreamError):
    """An offset Spark handed the streaming source back from a query's checkpointLocation cannot
    be read: another release's format version, an unknown kind, a missing or malformed field.

    The query fails at once; the offsets log is left as it is. ``offset`` is the offset as found,
    ``version`` its format version (None: none, or not a JSON object).
    """

    def __init__(self, message: str, *, stream: str | None, offset: Any, version: Any) -> None:
        self.offset = offset
        self.version = version
        super().__init__(message, stream=stream)


class InvalidTokenError(FlowWardenError, ValueError):
    """A value is not a resume token flowwarden can read."""


class UndecodableEventError(FlowWardenError, ValueError):
    """A raw event of the batch is not BSON that PyMongo can decode."""

    def __init__(self, index: int, reason: str) -> None:
        self.index = index
        self.reason = reason
        super().__init__(
            f"event {index} of the batch is not valid BSON ({reason}); the bytes were damaged "
            "between the server and here. Dead-letter that event's raw bytes or read the stream "
            "with PyMongo's decoding to see which field is affected"
        )


__all__ = [
    "CheckpointError",
    "CheckpointSaveFailedError",
    "CommitterClosedError",
    "ConfigurationError",
    "FencedError",
    "FlowWardenError",
    "HandlerError",
    "HistoryLostError",
    "InvalidTokenError",
    "JavaNotFoundError",
    "MissingDependencyError",
    "RestartsExhaustedError",
    "ResumePositionError",
    "SchemaMismatchError",
    "StreamError",
    "StreamInvalidatedError",
    "UndecodableEventError",
    "UnreadableCheckpointError",
    "UnreadableOffsetError",
]
