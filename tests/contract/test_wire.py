"""Wire protocol: OP_MSG sections and flags, the legacy OP_QUERY handshake, reply envelopes.

Raw-socket tests speak bytes to the server; client tests check that PyMongo (sync and async)
gets what it needs from the handshake.
"""

from __future__ import annotations

import struct

import pymongo
import pytest
from bson import Binary, Int64, Timestamp
from wire_helpers import (
    CHECKSUM_PRESENT,
    MORE_TO_COME,
    OP_REPLY,
    command,
    connect,
    crc32c,
    op_compressed,
    op_msg,
    op_query,
    receive,
)


def _check_cluster_time(reply: dict) -> None:
    cluster = reply["$clusterTime"]
    assert isinstance(cluster["clusterTime"], Timestamp)
    signature = cluster["signature"]
    assert isinstance(signature["hash"], (bytes, Binary)) and len(bytes(signature["hash"])) == 20
    assert int(signature["keyId"]) >= 0
    assert isinstance(reply["operationTime"], Timestamp)


def test_op_msg_ping_reply_carries_cluster_time(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        reply = command(sock, {"ping": 1, "$db": "admin"})
    assert reply["ok"] == 1.0
    _check_cluster_time(reply)


def test_error_replies_carry_cluster_time_too(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        reply = command(sock, {"noSuchCommandHere": 1, "$db": "admin"})
    assert reply["ok"] == 0
    assert reply["code"] == 59
    assert reply["codeName"] == "CommandNotFound"
    assert reply["errmsg"] == "no such command: 'noSuchCommandHere'"
    _check_cluster_time(reply)


def test_document_sequence_section_feeds_the_command(mongodb_uri: str, db_name: str, client) -> None:
    docs = [{"_id": 1, "kind": "seq"}, {"_id": 2, "kind": "seq"}]
    with connect(mongodb_uri) as sock:
        reply = command(sock, {"insert": "c", "$db": db_name}, sequences={"documents": docs})
    assert reply["ok"] == 1.0 and reply["n"] == 2
    assert sorted(d["_id"] for d in client[db_name].c.find()) == [1, 2]


# mongod answers a checksummed OP_MSG with a checksummed reply on a connection without TLS (its
# session workflow appends the CRC-32C exactly when the request carried one and the connection
# is not TLS, where TLS already protects the bytes); these raw sockets never use TLS.
def test_checksummed_request_gets_a_checksummed_reply(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        rid, message = op_msg({"ping": 1, "$db": "admin"}, checksum=True)
        sock.sendall(message)
        reply = receive(sock)
    assert reply.response_to == rid and reply.doc["ok"] == 1.0
    assert reply.flags & CHECKSUM_PRESENT, "the reply to a checksummed request carries no checksum"
    (sent,) = struct.unpack("<I", reply.raw[-4:])
    assert sent == crc32c(reply.raw[:-4])


def test_request_without_checksum_gets_a_reply_without_one(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        rid, message = op_msg({"ping": 1, "$db": "admin"})
        sock.sendall(message)
        reply = receive(sock)
    assert reply.response_to == rid and reply.doc["ok"] == 1.0
    assert not reply.flags & CHECKSUM_PRESENT


def test_more_to_come_request_gets_no_reply(mongodb_uri: str, db_name: str, client) -> None:
    with connect(mongodb_uri) as sock:
        _, fire_and_forget = op_msg(
            {"insert": "c", "documents": [{"_id": "quiet"}], "writeConcern": {"w": 0}, "$db": db_name},
            flags=MORE_TO_COME,
        )
        sock.sendall(fire_and_forget)
        # The next reply on this connection must answer the ping, not the insert.
        reply = command(sock, {"ping": 1, "$db": "admin"})
        assert reply["ok"] == 1.0
    assert client[db_name].c.find_one({"_id": "quiet"}) == {"_id": "quiet"}


@pytest.mark.usefixtures("replica_set_member")
def test_legacy_op_query_handshake_gets_op_reply(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        rid, message = op_query("admin.$cmd", {"isMaster": 1, "helloOk": True})
        sock.sendall(message)
        reply = receive(sock)
    assert reply.op_code == OP_REPLY and reply.response_to == rid
    doc = reply.doc
    assert doc["ok"] == 1.0
    assert doc["ismaster"] is True
    assert doc["helloOk"] is True
    assert doc["setName"]
    assert doc["maxWireVersion"] >= 21
    assert "compression" not in doc


def test_awaitable_hello_answers_after_waiting(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        first = command(sock, {"hello": 1, "$db": "admin"})
        awaited = command(
            sock,
            {"hello": 1, "topologyVersion": first["topologyVersion"], "maxAwaitTimeMS": 50, "$db": "admin"},
        )
    assert awaited["ok"] == 1.0
    assert awaited["topologyVersion"]["processId"] == first["topologyVersion"]["processId"]


def _check_hello(hello: dict, *, legacy: bool = False) -> None:
    assert hello["ok"] == 1.0
    assert hello["ismaster" if legacy else "isWritablePrimary"] is True
    assert hello["secondary"] is False
    assert hello["me"] in hello["hosts"]
    assert hello["primary"] == hello["me"]
    assert hello["setVersion"] >= 1
    assert hello["logicalSessionTimeoutMinutes"] == 30
    assert hello["minWireVersion"] == 0
    assert hello["maxWireVersion"] >= 21
    for field in (
        "maxBsonObjectSize",
        "maxMessageSizeBytes",
        "maxWriteBatchSize",
        "localTime",
        "connectionId",
    ):
        assert field in hello
    assert isinstance(hello["topologyVersion"]["counter"], (int, Int64))
    assert isinstance(hello["lastWrite"]["opTime"]["ts"], Timestamp)
    assert hello["electionId"] is not None


def _major_for_wire(wire_version: int) -> int:
    # MongoDB 7.0 speaks wire 21, 7.1-7.3 speak 22-24, 8.0 speaks 25.
    return 7 if wire_version < 25 else 8


@pytest.mark.usefixtures("replica_set_member")
def test_hello_and_build_info_agree_sync(client: pymongo.MongoClient) -> None:
    hello = client.admin.command("hello")
    _check_hello(hello)
    legacy = client.admin.command("isMaster")
    _check_hello(legacy, legacy=True)
    lower = client.admin.command("ismaster")
    _check_hello(lower, legacy=True)
    info = client.admin.command("buildInfo")
    assert info["versionArray"][0] == _major_for_wire(hello["maxWireVersion"])
    assert info["version"].split(".")[:2] == [str(v) for v in info["versionArray"][:2]]
    assert client.admin.command("buildinfo")["version"] == info["version"]


@pytest.mark.usefixtures("replica_set_member")
async def test_hello_and_build_info_agree_async(async_client: pymongo.AsyncMongoClient) -> None:
    hello = await async_client.admin.command("hello")
    _check_hello(hello)
    info = await async_client.admin.command("buildInfo")
    assert info["versionArray"][0] == _major_for_wire(hello["maxWireVersion"])


@pytest.mark.usefixtures("replica_set_member")
def test_clients_find_the_replica_set_primary(mongodb_uri: str) -> None:
    with pymongo.MongoClient(mongodb_uri, serverSelectionTimeoutMS=10_000) as c:
        c.admin.command("ping")
        assert c.primary is not None
        hello = c.admin.command("hello")
        assert tuple(c.primary) == (
            hello["primary"].rsplit(":", 1)[0],
            int(hello["primary"].rsplit(":", 1)[1]),
        )


@pytest.mark.usefixtures("replica_set_member")
async def test_async_client_finds_the_primary(mongodb_uri: str) -> None:
    c = pymongo.AsyncMongoClient(mongodb_uri, serverSelectionTimeoutMS=10_000)
    try:
        await c.admin.command("ping")
        assert await c.primary is not None
    finally:
        await c.close()


def test_zlib_compressing_client_round_trips(mongodb_uri: str, db_name: str) -> None:
    with pymongo.MongoClient(mongodb_uri, compressors="zlib", serverSelectionTimeoutMS=10_000) as c:
        c[db_name].c.insert_one({"_id": 1, "payload": "x" * 10_000})
        assert c[db_name].c.find_one()["payload"] == "x" * 10_000
        # A hello on a connection that negotiated compression reports what was agreed.
        assert c.admin.command("hello")["compression"] == ["zlib"]


def test_hello_negotiates_the_offered_compressors_it_knows(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        assert "compression" not in command(sock, {"hello": 1, "$db": "admin"})
        agreed = command(sock, {"hello": 1, "compression": ["no-such-compressor", "zlib"], "$db": "admin"})
        assert agreed["compression"] == ["zlib"]
        # A later hello without the field asks what was agreed; one with it negotiates afresh.
        assert command(sock, {"hello": 1, "$db": "admin"})["compression"] == ["zlib"]
        assert "compression" not in command(sock, {"hello": 1, "compression": [], "$db": "admin"})


def test_negotiated_zlib_request_is_answered(mongodb_uri: str) -> None:
    with connect(mongodb_uri) as sock:
        command(sock, {"hello": 1, "compression": ["zlib"], "$db": "admin"})
        rid, message = op_msg({"ping": 1, "$db": "admin"})
        sock.sendall(op_compressed(message))
        reply = receive(sock)
    assert reply.response_to == rid and reply.doc["ok"] == 1.0
