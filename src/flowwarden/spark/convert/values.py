"""Which values fit: one BSON value converted to the Python value its column kind takes.

Owns the per-value rules of the Python conversion path, one converter per :class:`Kind`
(docs/spark.md, "Which values fit"): a converter returns the value pyarrow takes for the
column, or raises :class:`~flowwarden.spark.convert.misfits.Misfit` saying what was expected and what
was found. :data:`EXACT_TYPES` says which Python types pyarrow takes as they are, so a column
of only those skips the converters.

Hard rule: values map exactly or not at all. A value that would change in the conversion (1.5
into a bigint, a datetime with a time of day into a date, a Decimal with more places than the
column's scale) is a misfit, never rounded or truncated. The compiled converter
(``_native.c``) applies the same rules; the differential tests hold the two to the same
output. This module converts single values only: it never builds Arrow arrays, never walks
lists, maps or documents (:mod:`flowwarden.spark.convert.columns` does) and never imports pyarrow.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import date, datetime, timezone
from decimal import Context, Decimal
from types import NoneType
from typing import Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from flowwarden.spark.convert.decimal128 import (
    COEFFICIENT_HIGH,
    COMBINATION,
    EXPONENT_BIAS,
    EXPONENT_MASK,
    EXPONENT_SHIFT,
    MAX_COEFFICIENT,
)
from flowwarden.spark.convert.extjson import Encoder
from flowwarden.spark.convert.misfits import Misfit, describe_value
from flowwarden.spark.convert.valuespec import Kind, ValueSpec

__all__ = ["EXACT_TYPES", "decimal_unscaler", "scalar_converter"]

_INT_RANGES = {
    Kind.INT8: (-(2**7), 2**7),
    Kind.INT16: (-(2**15), 2**15),
    Kind.INT32: (-(2**31), 2**31),
    Kind.INT64: (-(2**63), 2**63),
}  # [low, high) of each integer kind

_WIDE = Context(prec=200, Emax=999_999, Emin=-999_999)


def _to_string(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, ObjectId):
        return str(value)
    # str subclasses (bson Code) carry more than their text, so they do not fit either.
    raise Misfit(f"expected string, got {describe_value(value)}")


def _to_uuid(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Binary) and value.subtype == 4 and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    if type(value) is str:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            pass
    raise Misfit(f"expected a UUID (uuid.UUID, binary subtype 4 or UUID text), got {describe_value(value)}")


def _integer(kind: Kind) -> Callable[[Any], int]:
    low, high = _INT_RANGES[kind]
    name = kind.value

    def convert(value: Any) -> int:
        if type(value) is bool:
            raise Misfit(f"expected {name}, got {describe_value(value)}")
        if isinstance(value, int):
            number = int(value)
        elif type(value) is float and value.is_integer():
            number = int(value)
        else:
            raise Misfit(f"expected {name}, got {describe_value(value)}")
        if not low <= number < high:
            raise Misfit(f"{number} is out of the {name} range")
        return number

    return convert


def _to_double(value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, int) and type(value) is not bool:
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if number != value:
            raise Misfit(f"{int(value)} has no exact double value")
        return number
    raise Misfit(f"expected double, got {describe_value(value)}")


def _to_float(value: Any) -> float:
    if type(value) is float or (isinstance(value, int) and type(value) is not bool):
        return float(value)
    raise Misfit(f"expected float, got {describe_value(value)}")


def _to_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise Misfit(f"expected boolean, got {describe_value(value)}")


def _to_timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    raise Misfit(f"expected a datetime, got {describe_value(value)}")


def _to_timestamp_ntz(value: Any) -> datetime:
    if isinstance(value, datetime):
        if value.utcoffset() is not None:
            return value.astimezone(timezone.utc).replace(tzinfo=None)
        return value
    raise Misfit(f"expected a datetime, got {describe_value(value)}")


def _to_date(value: Any) -> date:
    if isinstance(value, datetime):
        if (value.hour, value.minute, value.second, value.microsecond) != (0, 0, 0, 0):
            raise Misfit(f"expected a date, got a datetime with a time of day: {value.isoformat()}")
        return value.date()
    if isinstance(value, date):
        return value
    raise Misfit(f"expected a date, got {describe_value(value)}")


def _to_binary(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    raise Misfit(f"expected binary, got {describe_value(value)}")


# Types pyarrow converts exactly as they are into each kind's Arrow type: a column whose values
# all have one of them skips the per-value conversion. Out-of-range numbers and decimals that
# would lose digits make pyarrow raise, and the column falls back to per-value conversion, which
# finds and reports the culprits.
EXACT_TYPES: dict[Kind, frozenset[type]] = {
    Kind.STRING: frozenset({str, NoneType}),
    Kind.INT8: frozenset({int, NoneType}),
    Kind.INT16: frozenset({int, NoneType}),
    Kind.INT32: frozenset({int, NoneType}),
    Kind.INT64: frozenset({int, Int64, NoneType}),
    Kind.DOUBLE: frozenset({float, int, Int64, NoneType}),
    Kind.FLOAT: frozenset({float, int, Int64, NoneType}),
    Kind.BOOL: frozenset({bool, NoneType}),
    Kind.TIMESTAMP: frozenset({datetime, NoneType}),
    Kind.TIMESTAMP_NTZ: frozenset({NoneType}),
    Kind.DATE: frozenset({date, NoneType}),
    Kind.BINARY: frozenset({bytes, Binary, NoneType}),
    Kind.UUID: frozenset({NoneType}),
    Kind.JSON: frozenset({NoneType}),
}


def scalar_converter(spec: ValueSpec, json: Encoder) -> Callable[[Any], Any]:
    """The converter of a scalar kind (not DECIMAL, LIST, MAP or STRUCT); ``json`` is the
    Extended JSON encoder a JSON column writes with."""
    kind = spec.kind
    if kind in _INT_RANGES:
        return _integer(kind)
    if kind is Kind.JSON:
        return json
    simple: dict[Kind, Callable[[Any], Any]] = {
        Kind.STRING: _to_string,
        Kind.UUID: _to_uuid,
        Kind.DOUBLE: _to_double,
        Kind.FLOAT: _to_float,
        Kind.BOOL: _to_bool,
        Kind.TIMESTAMP: _to_timestamp,
        Kind.TIMESTAMP_NTZ: _to_timestamp_ntz,
        Kind.DATE: _to_date,
        Kind.BINARY: _to_binary,
    }
    return simple[kind]


def decimal_unscaler(spec: ValueSpec) -> Callable[[Any], int]:
    """The converter of a decimal(p,s) column: a value times 10**s as an exact integer (what
    Arrow's 128-bit decimal buffer holds), or :class:`Misfit`. Decimal128 values never become
    ``decimal.Decimal`` objects: their coefficient is rescaled as an integer."""
    scale = spec.scale
    limit = 10**spec.precision
    name = spec.describe()

    def checked(number: int, value: Any) -> int:
        if -limit < number < limit:
            return number
        raise Misfit(f"{value} has more than {spec.precision - scale} integer digits for {name}")

    def unscaled(value: Any) -> int:
        kind = type(value)
        if kind is Decimal128:
            high, low = value.__getstate__()
            if high & COMBINATION != COMBINATION:
                shift = ((high >> EXPONENT_SHIFT) & EXPONENT_MASK) - EXPONENT_BIAS + scale
                number = ((high & COEFFICIENT_HIGH) << 64) | low
                if number > MAX_COEFFICIENT:
                    number = 0  # a non-canonical coefficient is zero (IEEE 754-2008 BID)
                if shift >= 0:
                    number *= 10**shift
                else:
                    number, rest = divmod(number, 10**-shift)
                    if rest:
                        raise Misfit(f"{value} has more than {scale} decimal places for {name}")
                if high >> 63:
                    number = -number
                return checked(number, value)
            value = value.to_decimal()
        elif isinstance(value, int) and kind is not bool:
            return checked(int(value) * 10**scale, value)
        elif kind is float:
            # The shortest text that reads back as this double: what was written (0.1, not
            # 0.1000000000000000055511151231257827).
            value = Decimal(repr(value))
        elif not isinstance(value, Decimal):
            raise Misfit(f"expected {name}, got {describe_value(value)}")
        if not value.is_finite():
            raise Misfit(f"{value} has no {name} value")
        scaled = value.scaleb(scale, context=_WIDE)
        if scaled != scaled.to_integral_value(context=_WIDE):
            raise Misfit(f"{value} has more than {scale} decimal places for {name}")
        return checked(int(scaled), value)

    return unscaled
