"""Resume tokens of the embedded replica set: MongoDB's KeyString bytes, order and decoding."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import given
from hypothesis import strategies as st
from token_format import compare_tokens, token_cluster_time

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.tokens import (
    TOKEN_TYPE_EVENT,
    TOKEN_TYPE_HIGH_WATER_MARK,
    decode_token,
    encode_value,
    event_token_data,
    fragment_token_data,
    high_water_mark,
    key_timestamp,
    ts_key,
)

# Tokens printed by real MongoDB 7/8 servers (public examples), with what they encode.
REAL_INSERT = (
    "826692B4A3000000032B042C0100296E5A1004FC22C3AF7E40428CBD5D09FF3547FFF2463C6F7065726174696F6E"
    "54797065003C696E736572740046646F63756D656E744B65790046645F696400646692B4A31EDE014D28852865000004"
)
REAL_UPDATE_STRING_ID = (
    "8265580539000000012B042C0100296E5A1004A7F55A5B35BD4C7DB2CD56C6CFEA9C49463C6F7065726174696F6E"
    "54797065003C7570646174650046646F63756D656E744B657900463C5F6964003C6265657200000004"
)
REAL_HIGH_WATER_MARK = "826A8C8E64000000012B0429296E1404"


def test_event_tokens_are_byte_identical_to_mongodb() -> None:
    insert = event_token_data(
        ts_key(Timestamp(0x6692B4A3, 3)),
        0,
        bytes.fromhex("FC22C3AF7E40428CBD5D09FF3547FFF2"),
        "insert",
        {"_id": ObjectId("6692b4a31ede014d28852865")},
        None,
    )
    update = event_token_data(
        ts_key(Timestamp(0x65580539, 1)),
        0,
        bytes.fromhex("A7F55A5B35BD4C7DB2CD56C6CFEA9C49"),
        "update",
        {"_id": "beer"},
        None,
    )
    assert insert == REAL_INSERT
    assert update == REAL_UPDATE_STRING_ID


def test_high_water_mark_is_byte_identical_to_mongodb() -> None:
    assert high_water_mark(Timestamp(0x6A8C8E64, 1)) == {"_data": REAL_HIGH_WATER_MARK}


def test_decode_reads_what_orders_a_token() -> None:
    data = decode_token({"_data": REAL_INSERT})
    assert data.cluster_time == Timestamp(1720890531, 3)
    assert (data.version, data.token_type, data.txn_op_index, data.from_invalidate) == (2, 128, 0, False)
    assert data.uuid == bytes.fromhex("FC22C3AF7E40428CBD5D09FF3547FFF2")
    hwm = decode_token({"_data": REAL_HIGH_WATER_MARK.lower()})
    assert hwm.is_high_water_mark and hwm.uuid is None
    assert hwm.data == REAL_HIGH_WATER_MARK


def test_decode_accepts_version_1_tokens() -> None:
    # MongoDB 4.2-6.x wrote version 1 (0x2B02) tokens; they must still resume.
    data = decode_token({"_data": "8263515979000000022B022C0100296E5A1004" + "AB" * 16})
    assert (data.version, data.token_type, data.cluster_time) == (1, 128, Timestamp(1666275705, 2))


@pytest.mark.parametrize(
    ("token", "code"),
    [
        ({}, 40647),
        ({"_data": 5}, 40647),
        ("nope", 40647),
        ({"_data": "82ZZ"}, 9),
        ({"_data": "8"}, 9),
        ({"_data": "0100"}, 40649),
        ({"_data": "826A8C8E6400000001" + "2B0A"}, 50795),
        ({"_data": "826A8C8E64000000012B04" + "2B02"}, 51057),
        ({"_data": "826A8C8E64000000012B042C01002929"}, 50872),
    ],
)
def test_bad_tokens_fail_like_mongodb(token: object, code: int) -> None:
    with pytest.raises(CommandError) as info:
        decode_token(token)
    assert info.value.code == code


def test_token_order_is_oplog_order() -> None:
    uuid = b"\x01" * 16
    t = ts_key(Timestamp(1_700_000_000, 5))

    def event(key: int, index: int, *, invalidate: bool = False) -> dict[str, str]:
        return {"_data": event_token_data(key, index, uuid, "drop", None, None, from_invalidate=invalidate)}

    ordered = [
        event(t - 1, 7),
        high_water_mark(key_timestamp(t)),
        event(t, 0),
        event(t, 0, invalidate=True),
        event(t, 1),
        event(t, 300),
        high_water_mark(key_timestamp(t + 1)),
        event(t + 1, 0),
    ]
    for earlier, later in itertools.pairwise(ordered):
        assert compare_tokens(earlier, later) == -1


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.integers(0, 100_000),
            st.booleans(),
        ),
        min_size=2,
        max_size=20,
        unique=True,
    )
)
def test_hex_order_matches_position_order(positions: list[tuple[int, int, int, bool]]) -> None:
    tokens = [
        (
            (seconds, inc, index, invalidate),
            event_token_data(
                (seconds << 32) | inc,
                index,
                b"\x02" * 16,
                "insert",
                {"_id": 1},
                None,
                from_invalidate=invalidate,
            ),
        )
        for seconds, inc, index, invalidate in positions
    ]
    by_position = [data for _, data in sorted(tokens)]
    assert sorted(data for _, data in tokens) == by_position


@given(st.integers(-(2**63) + 1, 2**63 - 1), st.integers(-(2**63) + 1, 2**63 - 1))
def test_integers_encode_in_numeric_order(a: int, b: int) -> None:
    ea, eb = encode_value(a), encode_value(b)
    assert (ea < eb) == (a < b)
    assert (ea == eb) == (a == b)


@given(st.text(max_size=20), st.text(max_size=20))
def test_strings_encode_in_binary_order(a: str, b: str) -> None:
    ea, eb = encode_value(a), encode_value(b)
    assert (ea < eb) == (a.encode() < b.encode())


@given(st.binary(max_size=20), st.binary(max_size=20))
def test_strings_that_are_not_utf8_encode_their_bytes_in_binary_order(a: bytes, b: bytes) -> None:
    ea = encode_value(a.decode("utf-8", "surrogateescape"))
    eb = encode_value(b.decode("utf-8", "surrogateescape"))
    assert ea == b"\x3c" + a.replace(b"\x00", b"\x00\xff") + b"\x00"
    assert (ea < eb) == (a < b)


def test_integral_doubles_and_longs_encode_like_ints() -> None:
    assert encode_value(5.0) == encode_value(5) == encode_value(Int64(5))
    assert encode_value(0) == bytes((0x29,))
    assert (
        encode_value(float("nan"))
        < encode_value(-(2**40))
        < encode_value(-1)
        < encode_value(0)
        < encode_value(1)
    )


def test_document_keys_of_every_common_type_give_distinct_stable_tokens() -> None:
    keys = [
        {"_id": None},
        {"_id": True},
        {"_id": 1},
        {"_id": 1.5},
        {"_id": "a\x00b"},
        {"_id": ObjectId("6692b4a31ede014d28852865")},
        {"_id": dt.datetime(2024, 1, 1)},
        {"_id": Timestamp(1, 2)},
        {"_id": Binary(b"xy", 0)},
        {"_id": {"a": [1, "x"]}},
        {"_id": 1, "shard": "eu"},
    ]
    datas = [event_token_data(1 << 32, 0, b"\x03" * 16, "insert", key, None) for key in keys]
    assert len(set(datas)) == len(datas)
    assert datas == [event_token_data(1 << 32, 0, b"\x03" * 16, "insert", key, None) for key in keys]


def test_token_cluster_time_reads_embedded_tokens() -> None:
    ts = Timestamp(1_795_000_000, 42)
    token = {"_data": event_token_data(ts_key(ts), 3, b"\x04" * 16, "delete", {"_id": 9}, None)}
    assert token_cluster_time(token) == ts
    assert token_cluster_time(high_water_mark(ts)) == ts
    data = decode_token(token)
    assert (data.token_type, data.txn_op_index) == (TOKEN_TYPE_EVENT, 3)
    assert decode_token(high_water_mark(ts)).token_type == TOKEN_TYPE_HIGH_WATER_MARK


DOCUMENT_KEYS = [
    {"_id": None},
    {"_id": 1},
    {"_id": -300},
    {"_id": 1.5},
    {"_id": "a\x00b"},
    {"_id": ObjectId("6692b4a31ede014d28852865")},
    {"_id": dt.datetime(2024, 1, 1)},
    {"_id": Timestamp(1, 2)},
    {"_id": Binary(b"xy" * 200, 0)},
    {"_id": {"a": [1, "x", True]}},
    {"_id": 1, "shard": "eu"},
]


@pytest.mark.parametrize("key", DOCUMENT_KEYS, ids=[repr(k) for k in DOCUMENT_KEYS])
@pytest.mark.parametrize("fragment", [0, 1, 63, 64, 300, 2**31 - 1])
def test_fragment_tokens_decode_to_their_event_and_number(key: dict[str, object], fragment: int) -> None:
    event = event_token_data(ts_key(Timestamp(1_700_000_000, 2)), 4, b"\x05" * 16, "update", key, None)
    data = decode_token({"_data": fragment_token_data(event, fragment)})
    assert (data.fragment_num, data.event_data, data.txn_op_index) == (fragment, event, 4)
    whole = decode_token({"_data": event})
    assert (whole.fragment_num, whole.event_data) == (None, event)


def test_tokens_without_fragments_decode_without_one() -> None:
    for token in (REAL_INSERT, REAL_UPDATE_STRING_ID, REAL_HIGH_WATER_MARK):
        assert decode_token({"_data": token}).fragment_num is None
    command = event_token_data(1 << 32, 0, None, "dropDatabase", None, {"a": 1})
    assert decode_token({"_data": fragment_token_data(command, 2)}).fragment_num == 2


def test_fragments_sort_after_their_event_in_order_and_before_the_next_event() -> None:
    t = ts_key(Timestamp(1_700_000_000, 5))
    event = event_token_data(t, 0, b"\x01" * 16, "update", {"_id": 7}, None)
    ordered = [
        {"_data": event},
        *({"_data": fragment_token_data(event, n)} for n in (0, 1, 2, 127, 128, 1000)),
        {"_data": event_token_data(t, 1, b"\x01" * 16, "insert", {"_id": 1}, None)},
        {"_data": event_token_data(t + 1, 0, b"\x01" * 16, "insert", {"_id": 1}, None)},
    ]
    for earlier, later in itertools.pairwise(ordered):
        assert compare_tokens(earlier, later) == -1


def test_bad_fragment_numbers_fail_like_mongodb() -> None:
    event = event_token_data(1 << 32, 0, b"\x01" * 16, "update", {"_id": 7}, None)
    for value in (-1, "1", 2**31):
        with pytest.raises(CommandError) as info:
            decode_token({"_data": event[:-2] + encode_value(value).hex().upper() + "04"})
        assert info.value.code == 7182501
    with pytest.raises(CommandError) as oversized:
        decode_token({"_data": fragment_token_data(event, 1)[:-2] + "2904"})
    assert oversized.value.code == 40646
