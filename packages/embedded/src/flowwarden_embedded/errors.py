"""Server-side command errors of the embedded replica set, shaped as MongoDB replies them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The codes the embedded server answers with, named as MongoDB's error_codes.yml names them.
CODE_NAMES: dict[int, str] = {
    1: "InternalError",
    2: "BadValue",
    8: "UnknownError",
    9: "FailedToParse",
    11: "UserNotFound",
    14: "TypeMismatch",
    20: "IllegalOperation",
    26: "NamespaceNotFound",
    40: "ConflictingUpdateOperators",
    43: "CursorNotFound",
    48: "NamespaceExists",
    50: "MaxTimeMSExpired",
    59: "CommandNotFound",
    72: "InvalidOptions",
    91: "ShutdownInProgress",
    112: "WriteConflict",
    189: "PrimarySteppedDown",
    244: "TransactionTooLarge",
    251: "NoSuchTransaction",
    256: "TransactionCommitted",
    260: "InvalidResumeToken",
    263: "OperationNotSupportedInTransaction",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    10334: "BSONObjectTooLarge",
    11000: "DuplicateKey",
    11600: "InterruptedAtShutdown",
    11602: "InterruptedDueToReplStateChange",
    40324: "Location40324",
    40573: "Location40573",
    50911: "Location50911",
}


class CommandError(Exception):
    """An error reply: ``{ok: 0, errmsg, code, codeName, errorLabels?}`` plus any extra fields."""

    def __init__(
        self,
        code: int,
        errmsg: str,
        *,
        labels: Iterable[str] = (),
        code_name: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.labels = list(labels)
        self.code_name = code_name or CODE_NAMES.get(code, f"Location{code}")
        self.extra = dict(extra or {})

    def to_reply(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "ok": 0.0,
            "errmsg": self.errmsg,
            "code": self.code,
            "codeName": self.code_name,
        }
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        reply.update(self.extra)
        return reply
