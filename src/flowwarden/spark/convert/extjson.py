"""MongoDB Extended JSON text for BSON values, fast enough for the event-to-Arrow hot path.

flowwarden stores the schemaless parts of a change event (``document_key``, ``updated_fields``,
an untyped ``full_document``) as Extended JSON strings. The text is exactly what
``bson.json_util.dumps(value, json_options=JSON_OPTIONS[mode], separators=(",", ":"),
ensure_ascii=False)`` returns (compact separators, UTF-8 text rather than ``\\uXXXX`` escapes),
written in one recursive pass instead of first building a converted copy of the document.
Types without a fast path here (Code, DBRef, DatetimeMS, user mapping types with non-string
keys) are handed to ``bson.json_util`` itself, so the text never depends on which path wrote it.

Canonical mode is the default because it is the only lossless one: relaxed mode writes Int32 and
Int64 both as bare JSON numbers, so ``json_util.loads`` gives back an Int32 for a small Int64.
Relaxed mode is offered for readers that query the text with plain JSON tools
(``get_json_object(full_document, '$.qty')`` returns ``5`` rather than ``{"$numberInt":"5"}``).

This module never imports pyspark or pyarrow.
"""

from __future__ import annotations

import base64
import enum
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from json import encoder as _json_encoder
from typing import Any

from bson import json_util
from bson.binary import Binary, UuidRepresentation
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from flowwarden.spark.convert.decimal128 import (
    COEFFICIENT_HIGH,
    COMBINATION,
    EXPONENT_BIAS,
    EXPONENT_MASK,
    EXPONENT_SHIFT,
    MAX_COEFFICIENT,
    MAX_PLAIN_EXPONENT,
)

__all__ = [
    "JSON_OPTIONS",
    "JsonMode",
    "decimal128_text",
    "decimal128_value",
    "dumps",
    "encoder_for",
]


class JsonMode(str, enum.Enum):
    """Which Extended JSON flavour to write."""

    CANONICAL = "canonical"
    """Type-preserving and lossless (the default)."""

    RELAXED = "relaxed"
    """Numbers as plain JSON numbers, dates as ISO-8601 text; an Int64 reads back as Int32."""


JSON_OPTIONS: dict[JsonMode, json_util.JSONOptions] = {
    # UUIDs are written as subtype-4 binaries (the standard representation); json_util's own
    # default (UNSPECIFIED) refuses to encode a uuid.UUID at all.
    JsonMode.CANONICAL: json_util.JSONOptions(
        json_mode=json_util.JSONMode.CANONICAL, uuid_representation=UuidRepresentation.STANDARD
    ),
    JsonMode.RELAXED: json_util.JSONOptions(
        json_mode=json_util.JSONMode.RELAXED, uuid_representation=UuidRepresentation.STANDARD
    ),
}
"""The ``bson.json_util`` options whose output :func:`dumps` reproduces, per mode."""

Encoder = Callable[[Any], str]

_quote: Callable[[str], str] = _json_encoder.encode_basestring  # the C escaper json.dumps uses
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_AWARE = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
_ZERO = timedelta(0)
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31
_INF = float("inf")
_MAX_CACHED_KEYS = 4096
_REGEX_FLAGS = (
    (re.IGNORECASE, "i"),
    (re.LOCALE, "l"),
    (re.MULTILINE, "m"),
    (re.DOTALL, "s"),
    (re.UNICODE, "u"),
    (re.VERBOSE, "x"),
)


def decimal128_text(value: Decimal128) -> str:
    """``str(value)`` (what json_util writes), without bson's slow digit-by-digit decoding.

    The decimal string is built with the same rule as ``str(decimal.Decimal)``: plain notation
    when the exponent is <= 0 and the adjusted exponent is >= -6, scientific otherwise. NaN,
    infinities and the rare non-canonical or clamped encodings go through bson itself.
    """
    high, low = value.__getstate__()
    if high & COMBINATION == COMBINATION:
        return str(value)
    exponent = ((high >> EXPONENT_SHIFT) & EXPONENT_MASK) - EXPONENT_BIAS
    coefficient = ((high & COEFFICIENT_HIGH) << 64) | low
    if coefficient > MAX_COEFFICIENT or exponent > MAX_PLAIN_EXPONENT:
        return str(value)
    sign = "-" if high >> 63 else ""
    digits = str(coefficient)
    adjusted = exponent + len(digits) - 1
    if exponent <= 0 and adjusted >= -6:
        if exponent == 0:
            return sign + digits
        point = len(digits) + exponent
        if point > 0:
            return f"{sign}{digits[:point]}.{digits[point:]}"
        return f"{sign}0.{'0' * -point}{digits}"
    mantissa = digits if len(digits) == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{sign}{mantissa}E{'+' if adjusted >= 0 else ''}{adjusted}"


def decimal128_value(value: Decimal128) -> Decimal:
    """``value.to_decimal()``, exact and several times faster (a Decimal keeps the triple it is
    parsed from, so parsing the canonical text gives the same coefficient and exponent)."""
    high, _ = value.__getstate__()
    if high & COMBINATION == COMBINATION:
        return value.to_decimal()
    return Decimal(decimal128_text(value))


def _millis(value: datetime) -> int:
    # Floor division equals json_util's timegm(seconds) * 1000 + microseconds // 1000, also for
    # dates before the epoch; subtracting from an aware epoch moves an aware value to UTC.
    if value.tzinfo is None or value.utcoffset() is None:
        return (value - _EPOCH_NAIVE) // _MS
    return (value - _EPOCH_AWARE) // _MS


def _binary(data: bytes, subtype: int) -> str:
    return f'{{"$binary":{{"base64":"{base64.b64encode(data).decode()}","subType":"{subtype:02x}"}}}}'


def _regex(value: Regex[Any] | re.Pattern[Any]) -> str:
    pattern = value.pattern if isinstance(value.pattern, str) else value.pattern.decode("utf-8")
    options = "".join(letter for flag, letter in _REGEX_FLAGS if value.flags & flag)
    return f'{{"$regularExpression":{{"pattern":{_quote(pattern)},"options":"{options}"}}}}'


def _float_special(value: float) -> str:
    if value != value:
        return '{"$numberDouble":"NaN"}'
    return '{"$numberDouble":"Infinity"}' if value > 0 else '{"$numberDouble":"-Infinity"}'


def _float_canonical(value: float) -> str:
    if value != value or value == _INF or value == -_INF:
        return _float_special(value)
    return f'{{"$numberDouble":"{float.__repr__(value)}"}}'


def _float_relaxed(value: float) -> str:
    if value != value or value == _INF or value == -_INF:
        return _float_special(value)
    return float.__repr__(value)


def _int_canonical(value: int) -> str:
    if _INT32_MIN <= value < _INT32_MAX:
        return f'{{"$numberInt":"{value}"}}'
    return f'{{"$numberLong":"{value}"}}'


def _datetime_canonical(value: datetime) -> str:
    return f'{{"$date":{{"$numberLong":"{_millis(value)}"}}}}'


def _datetime_relaxed(value: datetime) -> str:
    offset = value.utcoffset()
    if offset is None or offset == _ZERO:
        # UTC (naive values are UTC in BSON): isoformat is several times faster than strftime.
        wall = value.replace(tzinfo=None) if offset is not None else value
        if wall < _EPOCH_NAIVE:
            return _datetime_canonical(value)
        millis = wall.microsecond // 1000
        text = wall.replace(microsecond=0).isoformat()
        return f'{{"$date":"{text}.{millis:03d}Z"}}' if millis else f'{{"$date":"{text}Z"}}'
    if value < _EPOCH_AWARE:
        return _datetime_canonical(value)
    # json_util writes the local wall time with its offset rather than converting to UTC.
    millis = value.microsecond // 1000
    fraction = f".{millis:03d}" if millis else ""
    return f'{{"$date":"{value.strftime("%Y-%m-%dT%H:%M:%S")}{fraction}{value.strftime("%z")}"}}'


class _Writer:
    """One mode's encoder: dispatch on the exact type, with the common scalars inlined.

    Subclasses of handled types (``Int64`` is an ``int``, ``Binary`` is ``bytes``, ``SON`` is a
    ``dict``, ``Code`` is a ``str``) are looked up by their own exact type first, so they never
    take a base type's branch; that is why no ``isinstance`` runs before the table lookup.
    """

    def __init__(self, mode: JsonMode) -> None:
        self.options = JSON_OPTIONS[mode]
        # Document keys repeat across a stream's documents: their quoted text is kept.
        self.prefixes: dict[str, str] = {}
        canonical = mode is JsonMode.CANONICAL
        self.canonical = canonical
        self.table: dict[type, Encoder] = {
            str: _quote,
            bool: lambda v: "true" if v else "false",
            type(None): lambda v: "null",
            int: _int_canonical if canonical else int.__repr__,
            Int64: (lambda v: f'{{"$numberLong":"{int(v)}"}}') if canonical else lambda v: repr(int(v)),
            float: _float_canonical if canonical else _float_relaxed,
            dict: self.document,
            list: self.array,
            tuple: self.array,
            datetime: _datetime_canonical if canonical else _datetime_relaxed,
            ObjectId: lambda v: f'{{"$oid":"{v.binary.hex()}"}}',
            Decimal128: lambda v: f'{{"$numberDecimal":"{decimal128_text(v)}"}}',
            Timestamp: lambda v: f'{{"$timestamp":{{"t":{v.time},"i":{v.inc}}}}}',
            Binary: lambda v: _binary(v, v.subtype),
            bytes: lambda v: _binary(v, 0),
            Regex: _regex,
            re.Pattern: _regex,
            MinKey: lambda v: '{"$minKey":1}',
            MaxKey: lambda v: '{"$maxKey":1}',
            uuid.UUID: lambda v: _binary(v.bytes, 4),
        }

    def encode(self, value: Any) -> str:
        encode = self.table.get(type(value))
        return encode(value) if encode is not None else self.other(value)

    def document(self, doc: Mapping[str, Any]) -> str:
        table = self.table
        canonical = self.canonical
        prefixes = self.prefixes
        parts: list[str] = []
        append = parts.append
        for key, value in doc.items():
            prefix = prefixes.get(key)
            if prefix is None:
                if type(key) is not str:
                    # BSON keys are always strings; a hand-built mapping with other keys gets
                    # json.dumps's own key rules (True -> "true", 1 -> "1") through json_util.
                    return self.delegate(doc)
                prefix = _quote(key) + ":"
                if len(prefixes) < _MAX_CACHED_KEYS:
                    prefixes[key] = prefix
            # The commonest types inline: a function call per value is most of the cost.
            kind = type(value)
            if kind is str:
                append(prefix + _quote(value))
            elif kind is int:
                if not canonical:
                    append(prefix + int.__repr__(value))
                elif _INT32_MIN <= value < _INT32_MAX:
                    append(f'{prefix}{{"$numberInt":"{value}"}}')
                else:
                    append(f'{prefix}{{"$numberLong":"{value}"}}')
            elif kind is dict:
                append(prefix + self.document(value))
            elif kind is list:
                append(prefix + self.array(value))
            elif kind is ObjectId:
                append(f'{prefix}{{"$oid":"{value.binary.hex()}"}}')
            elif kind is float and canonical and value - value == 0.0:  # finite
                append(f'{prefix}{{"$numberDouble":"{float.__repr__(value)}"}}')
            else:
                encode = table.get(kind)
                append(prefix + (encode(value) if encode is not None else self.other(value)))
        return "{" + ",".join(parts) + "}"

    def array(self, values: list[Any] | tuple[Any, ...]) -> str:
        table = self.table
        parts: list[str] = []
        append = parts.append
        for value in values:
            kind = type(value)
            if kind is str:
                append(_quote(value))
            elif kind is dict:
                append(self.document(value))
            else:
                encode = table.get(kind)
                append(encode(value) if encode is not None else self.other(value))
        return "[" + ",".join(parts) + "]"

    def other(self, value: Any) -> str:
        """Subclasses of mappings and sequences, and every rarer BSON type."""
        if isinstance(value, Mapping):
            return self.document(value)
        if isinstance(value, (list, tuple)):
            return self.array(value)
        return self.delegate(value)

    def delegate(self, value: Any) -> str:
        return json_util.dumps(value, json_options=self.options, separators=(",", ":"), ensure_ascii=False)


_WRITERS = {mode: _Writer(mode) for mode in JsonMode}


def encoder_for(mode: JsonMode | str = JsonMode.CANONICAL) -> Encoder:
    """The encoding function of one mode, for loops that encode many values."""
    return _WRITERS[JsonMode(mode)].encode


def dumps(value: Any, mode: JsonMode | str = JsonMode.CANONICAL) -> str:
    """Extended JSON text of one BSON value (a document, an array or a scalar)."""
    return _WRITERS[JsonMode(mode)].encode(value)
