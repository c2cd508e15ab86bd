"""The ``$changeStream`` stage of an ``aggregate``, checked as MongoDB checks it.

:func:`parse_spec` reads the stage's options (types and enumerations); :func:`check_namespace`
says whether the stream may be opened where it was asked for, and whether it is a cluster stream;
:func:`resume_token_of` picks the resume token and refuses the combinations MongoDB refuses.
Every refusal carries MongoDB's code and message. Nothing here reads the oplog: whether the
token's event is still there is the cursor's question, asked when it opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import Int64, Timestamp

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.tokens import ResumeTokenData, decode_token

_FULL_DOCUMENT_MODES = ("default", "updateLookup", "whenAvailable", "required")
_BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")
_SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "resumeAfter": (Mapping,),
    "startAfter": (Mapping,),
    "startAtOperationTime": (Timestamp,),
    "fullDocument": (str,),
    "fullDocumentBeforeChange": (str,),
    "allChangesForCluster": (bool,),
    "showExpandedEvents": (bool,),
    "showSystemEvents": (bool,),
    "showMigrationEvents": (bool,),
    "showRawUpdateDescription": (bool,),
    "allowToRunOnConfigDB": (bool,),
    "allowToRunOnSystemNS": (bool,),
}
_BSON_TYPE_NAMES = {
    bool: "bool",
    int: "int",
    Int64: "long",
    float: "double",
    str: "string",
    dict: "object",
    list: "array",
    Timestamp: "timestamp",
}


def _spec_type_name(value: Any) -> str:
    for kind, name in _BSON_TYPE_NAMES.items():
        if type(value) is kind:
            return name
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def parse_spec(spec: Any) -> dict[str, Any]:
    """The options of a ``$changeStream`` stage, type-checked; the ``$_`` internal ones dropped."""
    if not isinstance(spec, Mapping):
        raise CommandError(50808, "$changeStream stage expects a document as argument")
    parsed: dict[str, Any] = {}
    for name, value in spec.items():
        expected = _SPEC_FIELDS.get(name)
        if expected is None:
            if name.startswith("$_"):
                continue  # internal fields MongoDB accepts from routers; nothing to do here
            raise CommandError(40415, f"BSON field '$changeStream.{name}' is an unknown field.")
        if value is None and name in ("resumeAfter", "startAfter", "startAtOperationTime"):
            continue
        if not isinstance(value, expected) or (expected == (bool,) and type(value) is not bool):
            wanted = {Mapping: "object", Timestamp: "timestamp", str: "string", bool: "bool"}[expected[0]]
            raise CommandError(
                14,
                f"BSON field '$changeStream.{name}' is the wrong type '{_spec_type_name(value)}', "
                f"expected type '{wanted}'",
            )
        parsed[name] = value
    for name, modes in (
        ("fullDocument", _FULL_DOCUMENT_MODES),
        ("fullDocumentBeforeChange", _BEFORE_CHANGE_MODES),
    ):
        if name in parsed and parsed[name] not in modes:
            raise CommandError(
                2,
                f"Enumeration value '{parsed[name]}' for field '$changeStream.{name}' is not a valid value.",
            )
    return parsed


def check_namespace(db: str, coll: str | None, spec: Mapping[str, Any]) -> bool:
    """Refuse a stream on a namespace MongoDB does not watch; True when it is a cluster stream.

    ``coll`` None is a database stream; ``db`` "admin" with ``allChangesForCluster`` a cluster one.
    """
    cluster = bool(spec.get("allChangesForCluster"))
    if cluster and not (db == "admin" and coll is None):
        found = f"{db}.{coll}" if coll is not None else f"{db}.$cmd.aggregate"
        raise CommandError(
            72,
            "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' "
            f"database, and with no collection name; found {found}",
        )
    if db == "admin" and not cluster:
        raise CommandError(
            73, "$changeStream may not be opened on the internal admin database", code_name="InvalidNamespace"
        )
    if db == "local" or (db == "config" and not spec.get("allowToRunOnConfigDB")):
        raise CommandError(
            73, f"$changeStream may not be opened on the internal {db} database", code_name="InvalidNamespace"
        )
    if coll is not None and coll.startswith("system.") and not spec.get("allowToRunOnSystemNS"):
        raise CommandError(
            73,
            f"$changeStream may not be opened on the internal {db}.{coll} collection",
            code_name="InvalidNamespace",
        )
    return cluster


def resume_token_of(spec: Mapping[str, Any], coll: str | None) -> ResumeTokenData | None:
    """The token of ``resumeAfter`` or ``startAfter`` (None for neither), refusing what MongoDB does:
    both at once, a token with ``startAtOperationTime``, ``resumeAfter`` an invalidate, and a token
    without a collection UUID for a collection stream."""
    if spec.get("resumeAfter") is not None and spec.get("startAfter") is not None:
        raise CommandError(
            50865, "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage"
        )
    token_spec = spec.get("resumeAfter") if spec.get("resumeAfter") is not None else spec.get("startAfter")
    token = decode_token(token_spec) if token_spec is not None else None
    if token is not None and spec.get("startAtOperationTime") is not None:
        raise CommandError(40674, "Only one type of resume option is allowed, but multiple were found")
    if token is not None and spec.get("resumeAfter") is not None and token.from_invalidate:
        raise CommandError(
            260,
            "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
            "invalidate notification",
        )
    if token is not None and coll is not None and token.uuid is None and not token.is_high_water_mark:
        raise CommandError(
            260,
            "Attempted to resume a single-collection stream, but the resume token does not include a UUID",
        )
    return token
