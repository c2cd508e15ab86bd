"""MongoDB's ``failCommand`` and ``failGetMoreAfterCursorCheckout`` fail points, configured with
the ``configureFailPoint`` test command.

The same fault-injection calls then work against the embedded server and against a real mongod
started with ``enableTestCommands``. What a triggered ``failCommand`` does, in MongoDB's order:
block the connection for ``blockTimeMS`` if asked, then close the connection without a reply, or
answer ``errorCode`` with exactly the ``errorLabels`` it names (the server adds none of its own),
or run the command and attach ``writeConcernError`` to its reply.

``failGetMoreAfterCursorCheckout`` fails a ``getMore`` with ``data.errorCode`` after its cursor
was checked out, inside the getMore itself, so the error goes through the server's own labelling:
on a change stream's cursor an error mongod deems resumable (:data:`RESUMABLE_CODES`) carries the
``ResumableChangeStreamError`` label, as from a real outage, and drivers resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowwarden_embedded.errors import CODE_NAMES, CommandError

FAIL_COMMAND = "failCommand"
FAIL_GET_MORE = "failGetMoreAfterCursorCheckout"
FAIL_POINT_ERRMSG = "Failing command via 'failCommand' failpoint"
RESUMABLE_CODES = frozenset(
    {
        6,  # HostUnreachable
        7,  # HostNotFound
        63,  # StaleShardVersion
        89,  # NetworkTimeout
        91,  # ShutdownInProgress
        133,  # FailedToSatisfyReadPreference
        134,  # ReadConcernMajorityNotAvailableYet
        150,  # StaleEpoch
        189,  # PrimarySteppedDown
        202,  # NetworkInterfaceExceededTimeLimit
        234,  # RetryChangeStream
        249,  # StaleDbVersion
        262,  # ExceededTimeLimit
        9001,  # SocketException
        10107,  # NotWritablePrimary
        11600,  # InterruptedAtShutdown
        11602,  # InterruptedDueToReplStateChange
        13388,  # StaleConfig
        13435,  # NotPrimaryNoSecondaryOk
        13436,  # NotPrimaryOrSecondary
    }
)
"""The codes mongod labels ``ResumableChangeStreamError`` on a change stream's aggregate or getMore:
its retriable and network errors, those that need retargeting, RetryChangeStream and
FailedToSatisfyReadPreference."""
# The names MongoDB treats as one command when matching failCommands.
_ALIASES = {"ismaster": "isMaster", "buildinfo": "buildInfo"}


@dataclass(slots=True)
class FailAction:
    """What a triggered fail point does to one command."""

    block_ms: int = 0
    close_connection: bool = False
    error: CommandError | None = None
    write_concern_error: dict[str, Any] | None = None


@dataclass(slots=True)
class _FailCommand:
    commands: frozenset[str]
    remaining: int | None  # None = alwaysOn
    skip: int = 0
    app_name: str | None = None
    namespace: str | None = None
    block_ms: int = 0
    close_connection: bool = False
    error_code: int | None = None
    error_labels: list[str] | None = None
    error_extra: dict[str, Any] = field(default_factory=dict)
    write_concern_error: dict[str, Any] | None = None
    times_entered: int = 0


@dataclass(slots=True)
class _GetMoreFault:
    error_code: int
    remaining: int | None  # None = alwaysOn
    skip: int = 0


class FailPoints:
    """The server's fail points: ``failCommand`` and ``failGetMoreAfterCursorCheckout``; others are
    refused by name."""

    def __init__(self) -> None:
        self._fail_command: _FailCommand | None = None
        self._get_more: _GetMoreFault | None = None
        self._times_entered = 0
        self._get_more_entered = 0

    def configure(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Run ``configureFailPoint``; returns the reply fields (``count``: times it fired so far)."""
        name = cmd.get("configureFailPoint")
        if name not in (FAIL_COMMAND, FAIL_GET_MORE):
            raise CommandError(
                2,
                f"Could not find fail point with name: {name}; "
                f"the embedded replica set has '{FAIL_COMMAND}' and '{FAIL_GET_MORE}'",
            )
        data = cmd.get("data") or {}
        if not isinstance(data, dict):
            raise CommandError(14, "the 'data' option of configureFailPoint must be an object")
        mode = _mode(cmd.get("mode"))
        if name == FAIL_GET_MORE:
            return self._configure_get_more(mode, data)
        previous = self._times_entered
        if mode is None:
            self._fail_command = None
            return {"count": previous}
        remaining, skip = mode
        commands = data.get("failCommands")
        if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
            raise CommandError(2, "'failCommands' must be an array of command names")
        labels = data.get("errorLabels")
        if labels is not None and (
            not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
        ):
            raise CommandError(2, "'errorLabels' must be an array of strings")
        error_code = data.get("errorCode")
        if error_code is not None and not isinstance(error_code, int):
            raise CommandError(2, "'errorCode' must be a number")
        block = bool(data.get("blockConnection", False))
        block_ms = _non_negative_int(data.get("blockTimeMS", 0), "blockTimeMS") if block else 0
        if block and "blockTimeMS" not in data:
            raise CommandError(2, "'blockTimeMS' must be set when 'blockConnection' is true")
        wce = data.get("writeConcernError")
        if wce is not None and not isinstance(wce, dict):
            raise CommandError(2, "'writeConcernError' must be an object")
        self._fail_command = _FailCommand(
            commands=frozenset(_ALIASES.get(c) or c for c in commands),
            remaining=remaining,
            skip=skip,
            app_name=data.get("appName"),
            namespace=data.get("namespace"),
            block_ms=block_ms,
            close_connection=bool(data.get("closeConnection", False)),
            error_code=error_code,
            error_labels=list(labels) if labels is not None else None,
            error_extra={k: v for k, v in data.items() if k == "errmsg"},
            write_concern_error=dict(wce) if wce is not None else None,
        )
        return {"count": previous}

    def check(self, command_name: str, app_name: str | None, namespace: str | None) -> FailAction | None:
        """The action for this command if the fail point fires on it now; counts the firing."""
        point = self._fail_command
        if point is None:
            return None
        if (_ALIASES.get(command_name) or command_name) not in point.commands:
            return None
        if point.app_name is not None and point.app_name != app_name:
            return None
        if point.namespace is not None and point.namespace != namespace:
            return None
        if not _fires(point):
            return None
        if point.remaining == 0:
            self._fail_command = None
        self._times_entered += 1
        error = None
        if point.error_code is not None:
            errmsg = point.error_extra.get("errmsg", FAIL_POINT_ERRMSG)
            error = CommandError(
                point.error_code,
                errmsg,
                labels=point.error_labels or (),
                code_name=CODE_NAMES.get(point.error_code, _code_name(point.error_code)),
            )
        return FailAction(
            block_ms=point.block_ms,
            close_connection=point.close_connection,
            error=error,
            write_concern_error=point.write_concern_error,
        )

    def _configure_get_more(
        self, mode: tuple[int | None, int] | None, data: dict[str, Any]
    ) -> dict[str, Any]:
        previous = self._get_more_entered
        if mode is None:
            self._get_more = None
            return {"count": previous}
        error_code = data.get("errorCode")
        if isinstance(error_code, bool) or not isinstance(error_code, int):
            raise CommandError(2, f"'{FAIL_GET_MORE}' needs data.errorCode, a number")
        remaining, skip = mode
        self._get_more = _GetMoreFault(error_code=error_code, remaining=remaining, skip=skip)
        return {"count": previous}

    def get_more_fault(self, change_stream: bool) -> CommandError | None:
        """The error ``failGetMoreAfterCursorCheckout`` makes a getMore fail with, if it fires now
        (counting the firing); labelled resumable on a change stream's cursor as mongod labels it."""
        point = self._get_more
        if point is None or not _fires(point):
            return None
        if point.remaining == 0:
            self._get_more = None
        self._get_more_entered += 1
        code = point.error_code
        labels = ("ResumableChangeStreamError",) if change_stream and code in RESUMABLE_CODES else ()
        return CommandError(
            code,
            f"Failing getMore via '{FAIL_GET_MORE}' failpoint",
            labels=labels,
            code_name=CODE_NAMES.get(code, _code_name(code)),
        )

    def clear(self) -> None:
        self._fail_command = None
        self._get_more = None


def _fires(point: _FailCommand | _GetMoreFault) -> bool:
    """Whether a command the fail point applies to triggers it now: the first ``skip`` do not,
    then each one counts ``times`` down."""
    if point.skip:
        point.skip -= 1
        return False
    if point.remaining is not None:
        point.remaining -= 1
    return True


def _mode(mode: Any) -> tuple[int | None, int] | None:
    """A fail point mode as (times remaining or None for always, commands to skip first); None
    for off."""
    if mode == "off":
        return None
    if mode == "alwaysOn":
        return None, 0
    if isinstance(mode, dict) and "times" in mode:
        remaining = _non_negative_int(mode["times"], "times")
        return None if remaining == 0 else (remaining, 0)
    if isinstance(mode, dict) and "skip" in mode:
        return None, _non_negative_int(mode["skip"], "skip")
    raise CommandError(
        2, f"Unsupported fail point mode {mode!r}: use 'alwaysOn', 'off', {{times: n}} or {{skip: n}}"
    )


def _code_name(code: int) -> str:
    return _EXTRA_CODE_NAMES.get(code, f"Location{code}")


# Codes tests commonly inject that the shared table does not name.
_EXTRA_CODE_NAMES = {
    6: "HostUnreachable",
    7: "HostNotFound",
    13: "Unauthorized",
    89: "NetworkTimeout",
    9001: "SocketException",
    10107: "NotWritablePrimary",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
    64: "WriteConcernFailed",
    100: "UnsatisfiableWriteConcern",
    136: "CappedPositionLost",
    133: "FailedToSatisfyReadPreference",
    134: "ReadConcernMajorityNotAvailableYet",
    175: "QueryPlanKilled",
    234: "RetryChangeStream",
    237: "CursorKilled",
    262: "ExceededTimeLimit",
    150: "StaleEpoch",
    13388: "StaleConfig",
    63: "StaleShardVersion",
}


def _non_negative_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CommandError(2, f"'{name}' must be a non-negative number, got {value!r}")
    return int(value)
