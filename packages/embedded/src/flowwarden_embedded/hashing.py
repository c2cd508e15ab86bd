"""MongoDB's hashed index key: the 64-bit hash of a value that hashed indexes and hashed sharding
use, and ``$toHashedIndexKey`` returns.

As mongod computes it: an MD5 digest over the seed (0, as a little-endian int32), then the value
as a BSON element without its field name: its canonical type (little-endian int32) and its value
bytes, where every number (int32, int64, double, Decimal128) is first squashed to a 64-bit
integer (so 1, 1.0 and 1.9 hash alike) and a document or an array is hashed element by element
with field names, ending with the end-of-object element. The first 8 bytes of the digest, read as
a little-endian signed integer, are the key. Checked against MongoDB's documented example
(``"string to hash"`` hashes to 763543691661428748).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from bson import Decimal128, Int64

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.rawstrings import encode

__all__ = ["hashed_index_key"]

_INT32 = struct.Struct("<i")
# The size of the value of each fixed-size BSON type.
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}
_FIXED.update({0x7F: 0, 0xFF: 0})


def value_size(kind: int, data: bytes, start: int) -> int | None:
    """The size of the value of BSON type ``kind`` starting at ``data[start]`` (the byte after the
    element's name); None for a type it does not know. (flowwarden has the same walker for its
    raw events; this distribution depends on nothing of flowwarden's, so it keeps its own.)"""
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return fixed
    if kind in (0x02, 0x0D, 0x0E):  # string, code, symbol: an int32 length, then the bytes
        return 4 + int(_INT32.unpack_from(data, start)[0])
    if kind in (0x03, 0x04, 0x0F):  # document, array, code with scope: an int32 of the whole
        return int(_INT32.unpack_from(data, start)[0])
    if kind == 0x05:  # binary: an int32 length, a subtype byte, the bytes
        return 5 + int(_INT32.unpack_from(data, start)[0])
    if kind == 0x0C:  # DBPointer: a string, then an ObjectId
        return 4 + int(_INT32.unpack_from(data, start)[0]) + 12
    if kind == 0x0B:  # regular expression: two C strings
        return data.index(0, data.index(0, start) + 1) + 1 - start
    return None
_INT64 = struct.Struct("<q")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

# BSON type byte -> MongoDB's canonical type (the order types compare in).
_CANONICAL = {
    0x01: 10,  # double
    0x02: 15,  # string
    0x03: 20,  # document
    0x04: 25,  # array
    0x05: 30,  # binary
    0x06: 0,  # undefined
    0x07: 35,  # ObjectId
    0x08: 40,  # bool
    0x09: 45,  # date
    0x0A: 5,  # null
    0x0B: 50,  # regular expression
    0x0C: 55,  # DBPointer
    0x0D: 60,  # JavaScript code
    0x0E: 15,  # symbol
    0x10: 10,  # int32
    0x11: 47,  # timestamp
    0x12: 10,  # int64
    0x13: 10,  # Decimal128
    0x7F: 100,  # MaxKey
    0xFF: -1,  # MinKey
}
_NUMBERS = {0x01, 0x10, 0x12, 0x13}
_CODE_WITH_SCOPE = 0x0F


def hashed_index_key(value: Any) -> Int64:
    """The hashed index key of ``value`` (None, and a missing value, hash as null)."""
    element = encode({"": value})[4:-1]  # one element: type byte, empty name, value
    digest = hashlib.md5(_INT32.pack(0), usedforsecurity=False)
    _hash_element(digest, element[0], None, element[2:])
    return Int64(_INT64.unpack(digest.digest()[:8])[0])


def _hash_element(digest: Any, kind: int, name: bytes | None, value: bytes) -> None:
    canonical = _CANONICAL.get(kind)
    if canonical is None:
        if kind == _CODE_WITH_SCOPE:
            raise CommandError(2, "$toHashedIndexKey of JavaScript code with scope is not supported here")
        raise CommandError(2, f"$toHashedIndexKey: unknown BSON type {kind:#04x}")
    digest.update(_INT32.pack(canonical))
    if name is not None:
        digest.update(name)
    if kind in _NUMBERS:
        digest.update(_INT64.pack(_squash(kind, value)))
    elif kind in (0x03, 0x04):
        _hash_document(digest, value)
    else:
        digest.update(value)


def _hash_document(digest: Any, data: bytes) -> None:
    """Each element of the embedded document ``data`` with its name, then the EOO element."""
    for kind, name, value in _elements(data):
        _hash_element(digest, kind, name + b"\x00", value)
    digest.update(_INT32.pack(0))  # EOO: canonical type 0, an empty name, no value
    digest.update(b"\x00")


def _elements(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """(type, name, value bytes) of each element of the BSON document ``data``, in order."""
    pos, end = 4, len(data) - 1
    while pos < end:
        kind = data[pos]
        name_end = data.index(0, pos + 1)
        start = name_end + 1
        size = value_size(kind, data, start)
        if size is None:
            raise CommandError(2, f"$toHashedIndexKey: unknown BSON type {kind:#04x}")
        yield kind, data[pos + 1 : name_end], data[start : start + size]
        pos = start + size


def _squash(kind: int, value: bytes) -> int:
    """A number as the 64-bit integer mongod hashes it (toward zero, clamped, NaN as 0)."""
    if kind == 0x10:
        return int(_INT32.unpack(value)[0])
    if kind == 0x12:
        return int(_INT64.unpack(value)[0])
    number: float | Decimal
    if kind == 0x01:
        number = struct.unpack("<d", value)[0]
        if math.isnan(number):
            return 0
    else:
        number = Decimal128.from_bid(bytes(value)).to_decimal()
        if number.is_nan():
            return 0
    if number >= 2**63:
        return _LONG_MAX
    if number <= -(2**63):
        return _LONG_MIN
    return int(number)
