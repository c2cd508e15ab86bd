"""The streaming source's offsets: one versioned JSON form per kind, read back exactly or refused.

No JVM: the offsets module is plain Python (Spark only stores the JSON it is handed).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from bson import Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from hypothesis import given
from hypothesis import strategies as st

from flowwarden.errors import StreamError, UnreadableOffsetError
from flowwarden.spark.source.offsets import (
    FORMAT_VERSION,
    BucketOffset,
    Offset,
    PartitionedOffset,
    ReadFromOffset,
    RequestedOffset,
    SkippedOffset,
    SnapshotOffset,
    TimeOffset,
    TokenOffset,
    dump_filter,
    dump_id,
    load_id,
    parse_offset,
)

# ----------------------------------------------------------------------------------------------
# Every kind reads back from its JSON as the same value

def to_milliseconds(moment: dt.datetime) -> dt.datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)  # what a BSON date holds


tokens = st.binary(min_size=1, max_size=64).map(lambda raw: raw.hex().upper())
times = st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
ids = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=20),
    st.builds(ObjectId),
    st.floats(allow_nan=False),
    st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
    st.decimals(min_value=-(10**20), max_value=10**20, places=3).map(Decimal128),
    st.datetimes(timezones=st.just(dt.timezone.utc)).map(to_milliseconds),
    st.dictionaries(st.text(max_size=5).filter(lambda key: not key.startswith("$")), st.integers(-5, 5)),
    st.just(MinKey()),
    st.just(MaxKey()),
)
names = st.text(min_size=1, max_size=12)
namespaces = st.lists(st.tuples(names, names).map(".".join), max_size=4).map(tuple)


@st.composite
def snapshots(draw: st.DrawFn) -> SnapshotOffset:
    copied = draw(namespaces)
    return SnapshotOffset(
        token=draw(tokens),
        namespaces=copied,
        at=draw(st.integers(0, len(copied))),
        end_id=dump_id(draw(ids)),
        last_id=dump_id(draw(ids)),
        copied=draw(st.integers(0, 2**63 - 1)),
        done=draw(st.booleans()),
    )


@st.composite
def requested(draw: st.DrawFn) -> RequestedOffset:
    copied = draw(namespaces.filter(bool))
    query = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b.c"]), ids, max_size=2)))
    return RequestedOffset(
        token=draw(tokens),
        request=str(draw(st.builds(ObjectId))),
        filter=dump_filter(query),
        namespaces=copied,
        at=draw(st.integers(0, len(copied) - 1)),
        end_id=dump_id(draw(ids)),
        last_id=dump_id(draw(ids)),
        copied=draw(st.integers(0, 2**63 - 1)),
        low=draw(times),
        high=draw(times),
    )


bucket_kinds: dict[str, st.SearchStrategy[BucketOffset]] = {
    "token": st.builds(TokenOffset, tokens),
    "time": st.builds(TimeOffset, times),
    "read_from": st.builds(ReadFromOffset, tokens, times),
    "skipped": st.builds(SkippedOffset, tokens),
}
KINDS: dict[str, st.SearchStrategy[Offset]] = {
    **bucket_kinds,
    "partitions": st.lists(st.one_of(*bucket_kinds.values()), min_size=1, max_size=8).map(
        lambda buckets: PartitionedOffset(tuple(buckets))
    ),
    "snapshot": snapshots(),
    "requested": requested(),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@given(data=st.data())
def test_every_offset_reads_back_from_its_json_as_the_same_value(kind: str, data: st.DataObject) -> None:
    offset = data.draw(KINDS[kind])
    text = offset.to_json()
    document = json.loads(text)
    assert document["v"] == FORMAT_VERSION and document["kind"] == kind
    assert parse_offset(text) == offset
    assert parse_offset(document) == offset  # the dict Spark hands latestOffset/partitions/commit
    assert parse_offset(json.dumps(offset.to_dict())) == offset  # what Spark writes to the offsets log


@given(ids)
def test_an_id_in_a_snapshot_offset_reads_back_as_the_same_bson_value(value: Any) -> None:
    back = load_id(dump_id(value))
    assert back == value and dump_id(back) == dump_id(value)


# The format of version 1, pinned: a change here that keeps FORMAT_VERSION would have an older
# release misread what a newer one wrote.
EXAMPLES: list[tuple[Offset, dict[str, Any]]] = [
    (TokenOffset("82AB01"), {"v": 1, "kind": "token", "token": "82AB01"}),
    (TimeOffset(Timestamp(1700000000, 3)), {"v": 1, "kind": "time", "at": {"t": 1700000000, "i": 3}}),
    (
        ReadFromOffset("82AB01", Timestamp(5, 1)),
        {"v": 1, "kind": "read_from", "token": "82AB01", "read_from": {"t": 5, "i": 1}},
    ),
    (SkippedOffset("82AB01"), {"v": 1, "kind": "skipped", "token": "82AB01"}),
    (
        PartitionedOffset((TokenOffset("82AB01"), TimeOffset(Timestamp(5, 1)))),
        {
            "v": 1,
            "kind": "partitions",
            "buckets": [{"kind": "token", "token": "82AB01"}, {"kind": "time", "at": {"t": 5, "i": 1}}],
        },
    ),
    (
        SnapshotOffset("82AB01", ("shop.orders", "shop.users"), 1, dump_id(7), dump_id(MinKey()), 12),
        {
            "v": 1,
            "kind": "snapshot",
            "token": "82AB01",
            "namespaces": ["shop.orders", "shop.users"],
            "at": 1,
            "end_id": '{"v": {"$numberInt": "7"}}',
            "last_id": '{"v": {"$minKey": 1}}',
            "copied": 12,
            "done": False,
        },
    ),
    (
        RequestedOffset(
            "82AB01",
            "65a1b2c3d4e5f60718293a4b",
            dump_filter({"region": "eu"}),
            ("shop.orders",),
            0,
            dump_id(9),
            dump_id(4),
            5,
            Timestamp(5, 1),
            Timestamp(5, 3),
        ),
        {
            "v": 1,
            "kind": "requested",
            "token": "82AB01",
            "request": "65a1b2c3d4e5f60718293a4b",
            "filter": '{"region": "eu"}',
            "namespaces": ["shop.orders"],
            "at": 0,
            "end_id": '{"v": {"$numberInt": "9"}}',
            "last_id": '{"v": {"$numberInt": "4"}}',
            "copied": 5,
            "low": {"t": 5, "i": 1},
            "high": {"t": 5, "i": 3},
        },
    ),
]


@pytest.mark.parametrize(("offset", "document"), EXAMPLES, ids=[o.kind for o, _ in EXAMPLES])
def test_the_json_of_each_kind(offset: Offset, document: dict[str, Any]) -> None:
    assert offset.to_dict() == document
    assert json.loads(offset.to_json()) == document
    assert parse_offset(document) == offset


# The unversioned offsets of releases before format versions (version 0).
VERSION_0: list[tuple[dict[str, Any], Offset]] = [
    ({"_data": "82AB01"}, TokenOffset("82AB01")),
    ({"startAtOperationTime": {"t": 5, "i": 1}}, TimeOffset(Timestamp(5, 1))),
    ({"_data": "82AB01", "readFrom": {"t": 5, "i": 1}}, ReadFromOffset("82AB01", Timestamp(5, 1))),
    ({"_data": "82AB01", "skipped": True}, SkippedOffset("82AB01")),
    (
        {"partitions": [{"_data": "82AB01"}, {"_data": "82AB02", "skipped": True}]},
        PartitionedOffset((TokenOffset("82AB01"), SkippedOffset("82AB02"))),
    ),
    (
        {
            "snapshot": {
                "token": "82AB01",
                "namespaces": ["shop.orders"],
                "at": 0,
                "endId": dump_id(7),
                "lastId": dump_id(3),
                "copied": 4,
            }
        },
        SnapshotOffset("82AB01", ("shop.orders",), 0, dump_id(7), dump_id(3), 4),
    ),
    (
        {
            "snapshot": {
                "token": "82AB01",
                "namespaces": ["shop.orders"],
                "at": 0,
                "endId": dump_id(7),
                "lastId": dump_id(7),
                "copied": 8,
                "done": True,
            }
        },
        SnapshotOffset("82AB01", ("shop.orders",), 0, dump_id(7), dump_id(7), 8, done=True),
    ),
]


@pytest.mark.parametrize(("document", "offset"), VERSION_0, ids=[o.kind for _, o in VERSION_0])
def test_an_offset_without_a_format_version_is_refused(document: dict[str, Any], offset: Offset) -> None:
    # The shapes offsets had before they carried a version: nothing of the kind was released, and
    # an offset is never read by its keys alone.
    assert "it has no format version, and this release reads version 1" in str(refused(document))
    assert parse_offset(offset.to_dict()) == offset


# ----------------------------------------------------------------------------------------------
# Anything else is refused, saying what to do


def refused(value: Any, *, stream: str | None = None) -> UnreadableOffsetError:
    with pytest.raises(UnreadableOffsetError) as caught:
        parse_offset(value, stream=stream)
    message = str(caught.value)
    assert isinstance(caught.value, StreamError)
    assert "the query's checkpointLocation (its offsets log, <checkpointLocation>/offsets)" in message
    assert "Start the query with a new checkpointLocation" in message
    assert "the flowwarden version that wrote this checkpointLocation" in message
    assert "\n" not in message
    return caught.value


TOKEN = {"kind": "token", "token": "82AB01"}
TIME = {"v": 1, "kind": "time"}
PARTITIONS = {"v": 1, "kind": "partitions"}


@pytest.mark.parametrize("version", [2, 99, 0, -1, "1", 1.0, True, None, [1]])
def test_an_offset_of_another_format_version_is_refused_naming_the_version(version: Any) -> None:
    error = refused({"v": version, **TOKEN})
    assert f"its format version is {version!r}, and this release reads version 1" in str(error)
    assert error.version == version


def test_the_message_names_the_source_and_shows_the_offset() -> None:
    text = json.dumps({"v": 7, **TOKEN})
    error = refused(text, stream="shop.orders")
    assert str(error).startswith("flowwarden streaming source shop.orders: ")
    assert f"the offset: {text}. " in str(error) and error.stream == "shop.orders" and error.offset == text
    assert f"the offset: {text}. " in str(refused(json.loads(text)))  # as Spark hands it to the reader


def missing_fields() -> list[tuple[dict[str, Any], str]]:
    cases = []
    for offset, document in EXAMPLES:
        for key in document:
            if key in ("v", "kind"):
                continue
            rest = {k: v for k, v in document.items() if k != key}
            cases.append((rest, f"'{key}' of a {offset.kind} offset"))
    return cases


@pytest.mark.parametrize(("document", "reason"), missing_fields(), ids=lambda value: str(value)[:40])
def test_an_offset_missing_a_field_is_refused_naming_the_field(document: dict[str, Any], reason: str) -> None:
    assert f"the field(s) {reason} are missing" in str(refused(document))


SNAPSHOT = EXAMPLES[-2][1]
REQUESTED = EXAMPLES[-1][1]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{\"v\": 1, \"kind\": \"token\"", "it is not JSON"),
        ("not json", "it is not JSON"),
        ("[1, 2]", "it is not a JSON object"),
        ([1, 2], "it is not a JSON object"),
        ({"v": 1, "kind": "tokens", "token": "82AB01"}, "an offset of kind 'tokens' is not known (known: "),
        ({"v": 1, "token": "82AB01"}, "an offset of kind None is not known"),
        ({"v": 1, **TOKEN, "at": {"t": 5, "i": 1}}, "a token offset has no field(s) 'at'"),
        ({"v": 1, "kind": "token", "token": "xyz"}, "a resume token's _data is a hex string, not 'xyz'"),
        ({"v": 1, "kind": "token", "token": ""}, "a resume token's _data is a hex string"),
        ({"v": 1, "kind": "token", "token": 5}, "the field 'token' of a token offset is 5, not a string"),
        ({**TIME, "at": {"t": "5", "i": 1}}, "'at' of a time offset is {'t': '5', 'i': 1}, not"),
        ({**TIME, "at": {"t": 2**32, "i": 1}}, "not a cluster time"),
        ({**TIME, "at": {"t": True, "i": 1}}, "not a cluster time"),
        ({**TIME, "at": {"t": 5}}, "not a cluster time"),
        ({**TIME, "at": "2024-01-01T00:00:00Z"}, "not a cluster time"),
        ({**PARTITIONS, "buckets": []}, "a non-empty tuple of offsets"),
        ({**PARTITIONS, "buckets": TOKEN}, "'buckets' of a partitions offset is"),
        ({**PARTITIONS, "buckets": ["82AB01"]}, "a bucket of a partitions offset is '82AB01'"),
        ({**PARTITIONS, "buckets": [SNAPSHOT]}, "a bucket's offset of kind 'snapshot' is not known"),
        ({**PARTITIONS, "buckets": [{"v": 1, **TOKEN}]}, "a token offset has no field(s) 'v'"),
        ({**SNAPSHOT, "at": 3}, "at 3 is not an index of the 2 namespaces"),
        ({**SNAPSHOT, "at": -1}, "at -1 is not an index"),
        ({**SNAPSHOT, "at": True}, "the field 'at' of a snapshot offset is True, not an integer"),
        ({**SNAPSHOT, "copied": -1}, "copied -1 is negative"),
        ({**SNAPSHOT, "copied": 1.5}, "'copied' of a snapshot offset is 1.5, not an integer"),
        ({**SNAPSHOT, "end_id": "7"}, "is not an _id as Extended JSON"),
        ({**SNAPSHOT, "last_id": '{"_id": 7}'}, "is not an _id as Extended JSON"),
        ({**SNAPSHOT, "last_id": '{"v": {"$oid": "zz"}}'}, "'zz' is not a valid ObjectId"),
        ({**SNAPSHOT, "end_id": '{"v": {"$numberDecimal": "x"}}'}, "is not an _id as Extended JSON"),
        ({**SNAPSHOT, "namespaces": ["orders"]}, "namespaces are 'database.collection' names"),
        ({**SNAPSHOT, "namespaces": "shop.orders"}, "'namespaces' of a snapshot offset is 'shop.orders'"),
        ({**SNAPSHOT, "done": "yes"}, "'done' of a snapshot offset is 'yes', not true or false"),
        ({**PARTITIONS, "buckets": [REQUESTED]}, "a bucket's offset of kind 'requested' is not known"),
        ({**REQUESTED, "at": 1}, "at 1 is not an index of the 1 namespaces"),
        ({**REQUESTED, "namespaces": []}, "namespaces are 'database.collection' names"),
        ({**REQUESTED, "request": "not-an-id"}, "a request id is hex, not 'not-an-id'"),
        ({**REQUESTED, "filter": "[1]"}, "is not a filter (a JSON object)"),
        ({**REQUESTED, "high": 5}, "'high' of a requested offset is 5, not a cluster time"),
        ({"_data": "82AB01", "skipped": False}, "it has no format version"),
        ({"data": "82AB01"}, "it has no format version"),
        ({}, "it has no format version"),
        ({"snapshot": {**SNAPSHOT, "kind": "snapshot"}}, "it has no format version"),
    ],
    ids=lambda value: str(value)[:50],
)
def test_an_offset_that_does_not_parse_is_refused_saying_why(value: Any, reason: str) -> None:
    assert reason in str(refused(value))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def damaged(draw: st.DrawFn) -> dict[str, Any]:
    """An offset of each kind, current or unversioned, with one field holding any JSON value."""
    document = dict(draw(st.sampled_from([document for _, document in EXAMPLES] + [d for d, _ in VERSION_0])))
    document[draw(st.sampled_from(sorted(document)))] = draw(json_values)
    return document


@given(st.one_of(json_values, damaged()))
def test_any_json_reads_as_an_offset_or_is_refused_with_the_message(value: Any) -> None:
    try:
        offset = parse_offset(value)
    except UnreadableOffsetError as error:
        assert "Start the query with a new checkpointLocation" in str(error)
    else:
        assert parse_offset(offset.to_json()) == offset
