"""Strings that are not valid UTF-8: mongod checks the structure of the BSON it receives, not the
UTF-8 of its text, so such a string is stored as the client sent it, found by equality on the same
bytes, and returned byte for byte, in documents and in change events.

PyMongo refuses to encode such a ``str``, so the documents here are BSON built by hand and sent as
``RawBSONDocument``; a client decodes them with ``surrogateescape`` or keeps them raw.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from typing import Any

import pymongo
import pytest
from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument
from pymongo import monitoring
from pymongo.change_stream import ChangeStream
from pymongo.collection import Collection

pytestmark = pytest.mark.through_mongos

AWAIT_MS = 100
_INT32 = struct.Struct("<i")
# The bytes that are not UTF-8: a stray continuation byte, a byte no UTF-8 has, a cut sequence.
NOT_UTF8 = b"caf\xe9 \xff \xc3"
SURROGATE_ESCAPE: CodecOptions[dict[str, Any]] = CodecOptions(unicode_decode_error_handler="surrogateescape")
RAW: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument, unicode_decode_error_handler="surrogateescape"
)


# -- BSON by hand ---------------------------------------------------------------------------------


def document(*elements: bytes) -> bytes:
    body = b"".join(elements)
    return _INT32.pack(len(body) + 5) + body + b"\x00"


def string(name: str, data: bytes) -> bytes:
    return b"\x02" + name.encode() + b"\x00" + _INT32.pack(len(data) + 1) + data + b"\x00"


def int32(name: str, value: int) -> bytes:
    return b"\x10" + name.encode() + b"\x00" + _INT32.pack(value)


def embedded(name: str, doc: bytes) -> bytes:
    return b"\x03" + name.encode() + b"\x00" + doc


def array(name: str, *elements: bytes) -> bytes:
    return b"\x04" + name.encode() + b"\x00" + document(*elements)


def raw(data: bytes) -> RawBSONDocument:
    """A document to send as it is. PyMongo inflates a filter to see whether it is empty; with
    ``surrogateescape`` that inflation accepts what the document holds."""
    return RawBSONDocument(data, codec_options=RAW)


def text(data: bytes) -> str:
    """The ``str`` a ``surrogateescape`` client decodes ``data`` to."""
    return data.decode("utf-8", "surrogateescape")


ORDER = document(
    int32("_id", 1),
    string("name", NOT_UTF8),
    embedded("notes", document(string("by", b"\x80\x81"))),
    array("tags", string("0", b"ok"), string("1", b"\xfe")),
)


class Connections(monitoring.ConnectionPoolListener):
    """How many connections a client's pool opened: one, unless the server dropped one."""

    def __init__(self) -> None:
        self.created = 0

    def connection_created(self, event: monitoring.ConnectionCreatedEvent) -> None:
        self.created += 1

    def pool_created(self, event: monitoring.PoolCreatedEvent) -> None: ...
    def pool_ready(self, event: monitoring.PoolReadyEvent) -> None: ...
    def pool_cleared(self, event: monitoring.PoolClearedEvent) -> None: ...
    def pool_closed(self, event: monitoring.PoolClosedEvent) -> None: ...
    def connection_ready(self, event: monitoring.ConnectionReadyEvent) -> None: ...
    def connection_closed(self, event: monitoring.ConnectionClosedEvent) -> None: ...
    def connection_check_out_started(self, event: monitoring.ConnectionCheckOutStartedEvent) -> None: ...
    def connection_check_out_failed(self, event: monitoring.ConnectionCheckOutFailedEvent) -> None: ...
    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None: ...
    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None: ...


def next_change(stream: ChangeStream[Any], attempts: int = 100) -> Any:
    """The next event, polling with short awaits (an event already written arrives at once)."""
    for _ in range(attempts):
        change = stream.try_next()
        if change is not None:
            return change
        if not stream.alive:
            break
    raise AssertionError("no change arrived")


def raw_orders(client: pymongo.MongoClient[Any], db_name: str) -> Collection[RawBSONDocument]:
    return client[db_name].get_collection("orders", codec_options=RAW)


# -- documents ------------------------------------------------------------------------------------


def test_a_string_that_is_not_utf8_is_stored_and_returned_byte_for_byte(
    mongodb_uri: str, db_name: str
) -> None:
    pool = Connections()
    with pymongo.MongoClient(
        mongodb_uri, maxPoolSize=1, event_listeners=[pool], serverSelectionTimeoutMS=10_000
    ) as client:
        orders = raw_orders(client, db_name)
        orders.insert_one(raw(ORDER))
        stored = orders.find_one({"_id": 1})
        assert stored is not None and stored.raw == ORDER
        decoded = client[db_name].get_collection("orders", codec_options=SURROGATE_ESCAPE).find_one()
        assert decoded == {
            "_id": 1,
            "name": text(NOT_UTF8),
            "notes": {"by": text(b"\x80\x81")},
            "tags": ["ok", text(b"\xfe")],
        }
        # A client decoding strictly gets the bytes too, and refuses them itself.
        with pytest.raises(InvalidBSON):
            client[db_name].orders.find_one({"_id": 1})
        client[db_name].orders.insert_one({"_id": 2, "name": "plain"})
        assert client[db_name].orders.find_one({"_id": 2}) == {"_id": 2, "name": "plain"}
        assert client.admin.command("ping")["ok"] == 1.0
    assert pool.created == 1  # the server never dropped the connection


def test_equality_finds_the_same_bytes_and_only_them(client: pymongo.MongoClient, db_name: str) -> None:
    orders = raw_orders(client, db_name)
    orders.insert_one(raw(ORDER))
    orders.insert_one(raw(document(int32("_id", 2), string("name", b"caf\xe9 \xfe \xc3"))))
    orders.insert_one(raw(document(int32("_id", 3), string("name", "café".encode()))))
    found = orders.find(raw(document(string("name", NOT_UTF8))))
    assert [doc.raw for doc in found] == [ORDER]
    assert orders.count_documents(raw(document(string("notes.by", b"\x80\x81")))) == 1
    assert orders.count_documents(raw(document(string("tags", b"\xfe")))) == 1
    assert orders.count_documents(raw(document(string("name", b"caf\xe9")))) == 0
    assert orders.delete_one(raw(document(string("name", b"caf\xe9 \xfe \xc3")))).deleted_count == 1
    assert sorted(doc["_id"] for doc in client[db_name].orders.find({}, {"_id": 1})) == [1, 3]


def test_updates_keep_the_bytes_and_set_new_ones(client: pymongo.MongoClient, db_name: str) -> None:
    orders = raw_orders(client, db_name)
    orders.insert_one(raw(ORDER))
    orders.update_one({"_id": 1}, {"$set": {"qty": 5}})
    stored = orders.find_one({"_id": 1})
    assert stored is not None and stored.raw == document(ORDER[4:-1], int32("qty", 5))
    orders.update_one({"_id": 1}, raw(document(embedded("$set", document(string("qty", b"\xf0\x9f"))))))
    stored = orders.find_one({"_id": 1})
    assert stored is not None and stored.raw == document(ORDER[4:-1], string("qty", b"\xf0\x9f"))
    replacement = document(int32("_id", 1), string("name", b"\xc0\xaf"))
    orders.replace_one({"_id": 1}, raw(replacement))
    stored = orders.find_one({"_id": 1})
    assert stored is not None and stored.raw == replacement


def test_a_string_id_that_is_not_utf8_round_trips(client: pymongo.MongoClient, db_name: str) -> None:
    orders = raw_orders(client, db_name)
    key = document(string("_id", b"key-\xff"))
    doc = document(string("_id", b"key-\xff"), int32("qty", 1))
    orders.insert_one(raw(doc))
    stored = orders.find_one(raw(key))
    assert stored is not None and stored.raw == doc
    updated = orders.find_one_and_update(raw(key), {"$inc": {"qty": 1}}, return_document=True)
    assert updated is not None and updated.raw == document(string("_id", b"key-\xff"), int32("qty", 2))
    assert orders.delete_one(raw(key)).deleted_count == 1
    assert orders.count_documents({}) == 0


def test_field_names_that_are_not_utf8_are_stored_as_sent(client: pymongo.MongoClient, db_name: str) -> None:
    orders = raw_orders(client, db_name)
    doc = document(
        int32("_id", 1), b"\x10qty-\xff\x00" + _INT32.pack(3), embedded("n", document(string("\xe9", b"x")))
    )
    orders.insert_one(raw(doc))
    stored = orders.find_one({"_id": 1})
    assert stored is not None and stored.raw == doc


def _hashed_key(string_bytes: bytes) -> int:
    """mongod's hashed index key of a string: MD5 of the seed 0, the string's canonical type (15)
    and its BSON value, the first 8 bytes read as a little-endian int64."""
    value = _INT32.pack(len(string_bytes) + 1) + string_bytes + b"\x00"
    digest = hashlib.md5(_INT32.pack(0) + _INT32.pack(15) + value, usedforsecurity=False).digest()
    return int(struct.unpack("<q", digest[:8])[0])


def test_the_hashed_key_of_such_a_string_hashes_its_bytes(
    client: pymongo.MongoClient, db_name: str, requires_mongodb: Callable[[int, str], None]
) -> None:
    requires_mongodb(7, "$toHashedIndexKey")
    assert _hashed_key(b"string to hash") == 763543691661428748  # MongoDB's documented example
    orders = raw_orders(client, db_name)
    orders.insert_one(raw(ORDER))
    (row,) = client[db_name].orders.aggregate([{"$project": {"_id": 0, "h": {"$toHashedIndexKey": "$name"}}}])
    assert row == {"h": _hashed_key(NOT_UTF8)}


# -- change events --------------------------------------------------------------------------------


def test_change_events_carry_the_bytes_as_stored(client: pymongo.MongoClient, db_name: str) -> None:
    orders = raw_orders(client, db_name)
    with orders.watch(max_await_time_ms=AWAIT_MS) as stream:
        orders.insert_one(raw(ORDER))
        orders.update_one({"_id": 1}, raw(document(embedded("$set", document(string("qty", b"\xf0\x9f"))))))
        orders.replace_one({"_id": 1}, raw(document(int32("_id", 1), string("name", b"\xc0\xaf"))))
        orders.delete_one({"_id": 1})
        insert, update, replace, delete = (next_change(stream) for _ in range(4))
    assert insert["fullDocument"].raw == ORDER
    assert insert["documentKey"].raw == document(int32("_id", 1))
    assert update["updateDescription"]["updatedFields"].raw == document(string("qty", b"\xf0\x9f"))
    assert replace["fullDocument"].raw == document(int32("_id", 1), string("name", b"\xc0\xaf"))
    assert delete["operationType"] == "delete"


def test_a_stream_decoding_with_surrogateescape_sees_the_text(
    client: pymongo.MongoClient, db_name: str
) -> None:
    orders = client[db_name].get_collection("orders", codec_options=SURROGATE_ESCAPE)
    with orders.watch(max_await_time_ms=AWAIT_MS, full_document="updateLookup") as stream:
        orders.insert_one(raw(ORDER))
        orders.update_one({"_id": 1}, {"$set": {"qty": 1}})
        insert, update = next_change(stream), next_change(stream)
    assert insert["fullDocument"]["name"] == text(NOT_UTF8)
    assert update["fullDocument"] == {
        "_id": 1,
        "name": text(NOT_UTF8),
        "notes": {"by": text(b"\x80\x81")},
        "tags": ["ok", text(b"\xfe")],
        "qty": 1,
    }


def test_events_of_a_string_id_that_is_not_utf8_resume(client: pymongo.MongoClient, db_name: str) -> None:
    orders = raw_orders(client, db_name)
    with orders.watch(max_await_time_ms=AWAIT_MS) as stream:
        orders.insert_one(raw(document(string("_id", b"a-\xff"))))
        orders.insert_one(raw(document(string("_id", b"b-\xfe"))))
        first, second = next_change(stream), next_change(stream)
    assert first["documentKey"].raw == document(string("_id", b"a-\xff"))
    assert second["documentKey"].raw == document(string("_id", b"b-\xfe"))
    assert first["_id"]["_data"] != second["_id"]["_data"]
    with orders.watch(max_await_time_ms=AWAIT_MS, resume_after=first["_id"]) as resumed:
        assert next_change(resumed)["documentKey"].raw == document(string("_id", b"b-\xfe"))
    with orders.watch(max_await_time_ms=AWAIT_MS, start_after=second["_id"]) as after:
        orders.insert_one({"_id": "c"})
        assert next_change(after)["documentKey"].raw == document(string("_id", b"c"))
