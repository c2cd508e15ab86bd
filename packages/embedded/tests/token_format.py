"""What MongoDB documents of a resume token, read independently of the double's own decoder.

A token's ``_data`` is the hex of a KeyString whose first value is the event's cluster time (byte
0x82, then 4 big-endian bytes of seconds and 4 of increment), and tokens sort in stream order as
strings. Tests check the double's tokens against this reading, not against its own code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import Timestamp


def token_cluster_time(token: Mapping[str, Any]) -> Timestamp:
    raw = bytes.fromhex(token["_data"][:18])
    assert len(raw) == 9 and raw[0] == 0x82, f"not a KeyString cluster time: {token['_data'][:40]!r}"
    return Timestamp(int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big"))


def compare_tokens(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    """-1, 0 or 1 as ``a`` comes before, with or after ``b`` in the stream."""
    return (a["_data"] > b["_data"]) - (a["_data"] < b["_data"])
