"""Raw wire-protocol access for contract tests: speak OP_MSG / OP_QUERY to a server directly.

Written independently of the server's own wire module so the tests check the bytes, not the
server's reading of its own encoding. Works against EmbeddedReplicaSet and a real mongod alike.
"""

from __future__ import annotations

import itertools
import socket
import struct
import uuid
import zlib
from typing import Any

import bson
from bson import Binary
from bson.binary import UuidRepresentation
from pymongo.uri_parser import parse_uri

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013
ZLIB = 2
CHECKSUM_PRESENT = 1
MORE_TO_COME = 2

_ids = itertools.count(1000)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def address(uri: str) -> tuple[str, int]:
    host, port = parse_uri(uri)["nodelist"][0]
    return host, port


def connect(uri: str, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(address(uri), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def new_lsid() -> dict[str, Any]:
    return {"id": Binary.from_uuid(uuid.uuid4(), UuidRepresentation.STANDARD)}


def op_msg(
    command: dict[str, Any],
    *,
    sequences: dict[str, list[dict[str, Any]]] | None = None,
    flags: int = 0,
    checksum: bool = False,
    request_id: int | None = None,
) -> tuple[int, bytes]:
    """``(request_id, message)`` for an OP_MSG with a body section and optional document sequences."""
    rid = next(_ids) if request_id is None else request_id
    body = b"\x00" + bson.encode(command)
    for identifier, docs in (sequences or {}).items():
        payload = identifier.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        body += b"\x01" + struct.pack("<i", 4 + len(payload)) + payload
    if checksum:
        flags |= CHECKSUM_PRESENT
    length = 16 + 4 + len(body) + (4 if checksum else 0)
    message = struct.pack("<iiii", length, rid, 0, OP_MSG) + struct.pack("<I", flags) + body
    if checksum:
        message += struct.pack("<I", crc32c(message))
    return rid, message


def op_query(full_collection_name: str, query: dict[str, Any]) -> tuple[int, bytes]:
    rid = next(_ids)
    body = (
        struct.pack("<i", 0)
        + full_collection_name.encode()
        + b"\x00"
        + struct.pack("<ii", 0, -1)
        + bson.encode(query)
    )
    return rid, struct.pack("<iiii", 16 + len(body), rid, 0, OP_QUERY) + body


def op_compressed(message: bytes) -> bytes:
    """``message`` (a whole OP_MSG or OP_QUERY) wrapped in an OP_COMPRESSED with zlib."""
    _, rid, response_to, op_code = struct.unpack_from("<iiii", message)
    original = message[16:]
    payload = struct.pack("<iiB", op_code, len(original), ZLIB) + zlib.compress(original)
    return struct.pack("<iiii", 16 + len(payload), rid, response_to, OP_COMPRESSED) + payload


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("server closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class Reply:
    def __init__(self, response_to: int, op_code: int, flags: int, doc: dict[str, Any], raw: bytes) -> None:
        self.response_to = response_to
        self.op_code = op_code
        self.flags = flags
        self.doc = doc
        self.raw = raw


def receive(sock: socket.socket) -> Reply:
    header = _recv_exactly(sock, 16)
    length, _, response_to, op_code = struct.unpack("<iiii", header)
    rest = _recv_exactly(sock, length - 16)
    raw = header + rest
    if op_code == OP_COMPRESSED:
        # mongod answers a compressed request in kind; ``raw`` stays what was on the wire.
        op_code, size, compressor = struct.unpack_from("<iiB", rest, 0)
        assert compressor == ZLIB, compressor
        rest = zlib.decompress(rest[9:])
        assert len(rest) == size
    if op_code == OP_REPLY:
        doc = bson.decode(rest[20:])
        return Reply(response_to, op_code, 0, doc, raw)
    assert op_code == OP_MSG, op_code
    (flags,) = struct.unpack_from("<I", rest, 0)
    assert rest[4] == 0, "reply must start with a body section"
    (size,) = struct.unpack_from("<i", rest, 5)
    doc = bson.decode(rest[5 : 5 + size])
    return Reply(response_to, op_code, flags, doc, raw)


def command(sock: socket.socket, cmd: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Send one OP_MSG command and return the reply document (checks responseTo)."""
    rid, message = op_msg(cmd, **kwargs)
    sock.sendall(message)
    reply = receive(sock)
    assert reply.response_to == rid
    return reply.doc


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True once the server has closed ``sock`` (EOF or reset) within ``timeout`` seconds."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
