"""Hashable forms of BSON values, and MongoDB's way of printing them in error messages.

Two values get the same key exactly when MongoDB's index would treat them as the same key:
numbers compare by value across int/long/double/decimal, but ``true`` is not ``1`` and embedded
documents compare field by field in order. The storage uses these keys for ``_id`` and unique
indexes, so a wrong key here is a wrong duplicate-key verdict.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Hashable
from decimal import Decimal
from typing import Any

from bson import Binary, Decimal128, Int64, ObjectId, Timestamp

_PASS_THROUGH: frozenset[type] = frozenset({str, ObjectId, int, float, Int64, datetime.datetime})


def value_key(value: Any) -> Hashable:
    """The hashable index key of one BSON value (``_id`` or an indexed field)."""
    kind = type(value)
    if kind in _PASS_THROUGH:
        return value  # type: ignore[no-any-return]
    if value is None:
        return None
    if kind is bool:
        # True == 1 in Python but not in MongoDB.
        return ("bool", value)
    if isinstance(value, dict):
        return ("doc", tuple((k, value_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(value_key(v) for v in value))
    if isinstance(value, Decimal128):
        number = value.to_decimal()
        return int(number) if number == number.to_integral_value() else number
    if isinstance(value, Binary):
        return ("binary", value.subtype, bytes(value))
    if isinstance(value, bytes):
        return ("binary", 0, value)
    if isinstance(value, Decimal):
        return value
    try:
        hash(value)
    except TypeError:
        return (kind.__name__, repr(value))
    return (kind.__name__, value)


def format_value(value: Any) -> str:
    """A value as MongoDB prints it in ``dup key: { ... }`` messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, Int64)):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value) if value != int(value) or abs(value) >= 1e16 else f"{int(value)}.0"
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return f"new Date({int(value.timestamp() * 1000)})"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, Decimal128):
        return f'NumberDecimal("{value}")'
    if isinstance(value, dict):
        return format_document(value)
    if isinstance(value, (list, tuple)):
        return "[ " + ", ".join(format_value(v) for v in value) + " ]" if value else "[]"
    if isinstance(value, (bytes, Binary)):
        subtype = value.subtype if isinstance(value, Binary) else 0
        return f"BinData({subtype}, {bytes(value).hex().upper()})"
    return str(value)


def format_document(doc: dict[str, Any]) -> str:
    """``{ a: 1, b: "x" }``, the shape MongoDB uses for key values in error messages."""
    if not doc:
        return "{}"
    return "{ " + ", ".join(f"{k}: {format_value(v)}" for k, v in doc.items()) + " }"
