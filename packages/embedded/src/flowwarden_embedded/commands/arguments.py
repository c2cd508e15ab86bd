"""Reading a command's fields the way MongoDB checks them, with its codes and messages.

A field of the wrong BSON type fails with TypeMismatch (14) naming the field and both types;
a negative count or batch size fails with 51024. Handlers read their options through these
helpers so every command words the same mistake the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson import Int64

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.storage import Document

if TYPE_CHECKING:
    from flowwarden_embedded.commands.registry import Context

# Fields of a command that are protocol envelope, never options of the command itself.
GENERIC_FIELDS = frozenset(
    {
        "$db",
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "$clusterTime",
        "$readPreference",
        "readConcern",
        "writeConcern",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
        "comment",
        "maxTimeMS",
        "$audit",
        "$client",
        "mayBypassWriteBlocking",
        "recoveryToken",
    }
)


def bson_type_name(value: Any) -> str:
    """The BSON type name MongoDB prints for ``value`` in its error messages."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, Int64)):
        return "int" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return type(value).__name__


def typed_field(ctx: Context, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """The command's field ``name`` if it is of ``kind`` (a bool never counts as a number), else 14."""
    value = ctx.cmd.get(name, default)
    if value is None or value is default:
        return value
    expected = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in expected:
        ok = False
    else:
        ok = isinstance(value, expected)
    if not ok:
        wanted = {dict: "object", list: "array", str: "string", int: "int", bool: "bool", float: "double"}
        names = "', '".join(wanted.get(k, k.__name__) for k in expected)
        raise CommandError(
            14,
            f"BSON field '{ctx.name}.{name}' is the wrong type '{bson_type_name(value)}', "
            f"expected type '{names}'",
        )
    return value


def non_negative(ctx: Context, name: str, value: Any) -> int:
    """A count such as ``skip`` or ``limit``: a number >= 0 (0 when absent), else 14 or 51024."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(
            14,
            f"BSON field '{ctx.name}.{name}' is the wrong type '{bson_type_name(value)}', expected types "
            "'[long, int, decimal, double]'",
        )
    if value < 0:
        raise CommandError(51024, f"BSON field '{name}' value must be >= 0, actual value '{value}'")
    return int(value)


def batch_size_of(source: Document | None) -> int | None:
    """``batchSize`` of a command or its ``cursor`` option; None when absent, 51024 when negative."""
    if not source or "batchSize" not in source:
        return None
    value = source["batchSize"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CommandError(51024, f"BSON field 'batchSize' value must be >= 0, actual value '{value}'")
    return int(value)


def max_time_ms(ctx: Context) -> int | None:
    """The command's ``maxTimeMS`` (None when absent); 2 when it is negative or not a number."""
    value = ctx.cmd.get("maxTimeMS")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CommandError(2, f"{value!r} value for maxTimeMS is out of range")
    return int(value)
