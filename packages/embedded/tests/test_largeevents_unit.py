"""Splitting and refusing change events over 16 MB, byte by byte (no cursor, no server).

The stream-level rules (when an event is refused or split, resuming from fragments) are pinned in
test_changestream_unit.py and, through PyMongo, in tests/contract/test_large_events.py.
"""

from __future__ import annotations

import datetime as dt
import struct

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.largeevents import split_event, too_large
from flowwarden_embedded.tokens import decode_token, event_token_data, fragment_token_data

TOKEN = event_token_data(1 << 32 | 7, 0, b"\x01" * 16, "update", {"_id": 1}, None)
LIMIT = 16 * 1024 * 1024 + 8 * 1024 - len(bson.encode({"_data": TOKEN}))


def element(name: str, value: object) -> bytes:
    return bson.encode({name: value})[4:-1]


def sized(name: str, size: int) -> bytes:
    """A string element of exactly ``size`` bytes."""
    return element(name, "x" * (size - len(element(name, ""))))


def document(*elements: bytes) -> bytes:
    body = b"".join(elements)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def head_size(fragment: int) -> int:
    """What mongod counts for a fragment before its fields: ``_id``, ``splitEvent``, ``$sortKey``."""
    token = {"_data": fragment_token_data(TOKEN, fragment - 1)}
    head = {"_id": token, "splitEvent": {"fragment": fragment, "of": 0}, "$sortKey": [token]}
    return len(bson.encode(head))


def test_every_bson_type_is_carried_over_byte_for_byte() -> None:
    fields = [
        element("double", 1.5),
        element("string", "héllo"),
        element("document", {"a": [1, {"b": None}]}),
        element("array", [1, "two"]),
        element("binary", Binary(b"\x00\x01", 5)),
        b"\x06undefined\x00",
        element("oid", ObjectId("6692b4a31ede014d28852865")),
        element("bool", True),
        element("date", dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)),
        element("null", None),
        element("regex", Regex("^a.*", "i")),
        b"\x0cpointer\x00" + struct.pack("<i", 2) + b"c\x00" + bytes(12),
        element("code", Code("f()")),
        b"\x0esymbol\x00" + struct.pack("<i", 2) + b"s\x00",
        element("scoped", Code("g()", {"x": 1})),
        element("int", 7),
        element("timestamp", Timestamp(5, 6)),
        element("long", Int64(8)),
        element("decimal", Decimal128("1.25")),
        element("min", MinKey()),
        element("max", MaxKey()),
    ]
    event = document(element("_id", {"_data": TOKEN}), *fields)
    ((fragment, token),) = split_event(event, TOKEN)
    by_size = sorted(fields, key=lambda e: (len(e), e[1 : e.index(0, 1)]))
    expected_head = element("_id", token) + element("splitEvent", {"fragment": 1, "of": 1})
    assert bytes(fragment.raw) == document(expected_head, *by_size)
    assert decode_token(token).fragment_num == 0


def test_fields_go_smallest_first_as_many_as_fit_each_fragment() -> None:
    id_element = element("_id", {"_data": TOKEN})
    small = [element("zz", 1), element("aa", 2), element("m", "x" * 10)]
    # Two fields that fill the first fragment exactly, with its head and the small fields...
    room = LIMIT - head_size(1) - sum(len(e) for e in small)
    first_big = sized("big1", room // 2)
    second_big = sized("big2", room - room // 2)
    # ...and one that fills a second fragment exactly.
    third_big = sized("big3", LIMIT - head_size(2))
    event = document(id_element, third_big, second_big, small[0], first_big, small[1], small[2])
    fragments = split_event(event, TOKEN)
    assert [list(bson.decode(f.raw)) for f, _ in fragments] == [
        # Equal sizes go by name: "aa" before "zz".
        ["_id", "splitEvent", "aa", "zz", "m", "big1", "big2"],
        ["_id", "splitEvent", "big3"],
    ]
    assert [bson.decode(f.raw)["splitEvent"] for f, _ in fragments] == [
        {"fragment": 1, "of": 2},
        {"fragment": 2, "of": 2},
    ]
    assert [decode_token(token).fragment_num for _, token in fragments] == [0, 1]
    assert [bson.decode(f.raw)["_id"] for f, _ in fragments] == [token for _, token in fragments]


def test_one_byte_over_the_limit_starts_another_fragment() -> None:
    id_element = element("_id", {"_data": TOKEN})
    filler = sized("f", LIMIT - head_size(1) - 1000)
    assert len(split_event(document(id_element, filler, sized("g", 1000)), TOKEN)) == 1
    assert len(split_event(document(id_element, filler, sized("g", 1001)), TOKEN)) == 2


def test_an_event_with_nothing_but_its_id_cannot_be_split() -> None:
    with pytest.raises(CommandError) as info:
        split_event(document(element("_id", {"_data": TOKEN})), TOKEN)
    assert info.value.code == 7182502
    assert info.value.errmsg == "Cannot split an empty event or an event containing solely '_id' field"


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        ("A" * 159, '"' + "A" * 159 + '"'),
        ("A" * 160, '"' + "A" * 150 + '..."'),
    ],
    ids=["159 characters, whole", "160 characters, cut"],
)
def test_too_large_prints_the_first_element_as_mongod_does(data: str, shown: str) -> None:
    event = document(element("_id", {"_data": data}), element("v", 1))
    error = too_large(event)
    assert error.code == 10334 and error.code_name == "BSONObjectTooLarge"
    assert error.errmsg == (
        f"BSONObj size: {len(event)} (0x{len(event):X}) is invalid. Size must be between 0 and "
        f"16793600(16MB) First element: _id: {{ _data: {shown} }}"
    )
