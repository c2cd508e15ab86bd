"""The bit layout of a BSON Decimal128 (IEEE 754-2008 decimal128, binary integer decimal).

Owns the constants every Python reader of ``Decimal128.__getstate__()``'s two 64-bit words
uses: the Extended JSON writer (:func:`flowwarden.spark.convert.extjson.decimal128_text`) and the
decimal column builder of the Python conversion path. Defined here once so the two readers
cannot disagree. The compiled converter (``_native.c``) spells the same numbers in C, where
they cannot be imported from here; a change to the layout is a change to both.

The high word: sign bit 63; when the two "combination" bits 62-61 are not both set, a 14-bit
biased exponent in bits 62-49 and the top 49 bits of the 113-bit coefficient below it (the
low word holds the other 64). Combination bits 11 mark NaN, the infinities and the
non-canonical large-coefficient form. A coefficient above :data:`MAX_COEFFICIENT` is
non-canonical and reads as zero.

This module holds numbers only: it never imports another module and never converts a value.
"""

from __future__ import annotations

__all__ = [
    "COEFFICIENT_HIGH",
    "COMBINATION",
    "EXPONENT_BIAS",
    "EXPONENT_MASK",
    "EXPONENT_SHIFT",
    "MAX_COEFFICIENT",
    "MAX_PLAIN_EXPONENT",
]

COMBINATION = 0x6000000000000000
"""The combination bits of the high word; both set: NaN, an infinity or a non-canonical form."""

EXPONENT_SHIFT = 49
"""Where the biased exponent starts in the high word."""

EXPONENT_MASK = 0x3FFF
"""The 14 bits of the biased exponent, after shifting by :data:`EXPONENT_SHIFT`."""

EXPONENT_BIAS = 6176
"""Subtracted from the stored exponent to get the power of ten."""

COEFFICIENT_HIGH = (1 << EXPONENT_SHIFT) - 1
"""The coefficient's bits in the high word (its top 49 bits)."""

MAX_COEFFICIENT = 10**34 - 1
"""The largest canonical coefficient (34 decimal digits)."""

MAX_PLAIN_EXPONENT = 6111
"""The largest exponent the decimal128 context takes without clamping (padding the coefficient)."""
