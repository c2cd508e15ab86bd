"""EmbeddedReplicaSet's own guarantees: bad clients hurt only themselves, connection helpers,
lifecycle. These exercise helpers MongoDB has no command for, so they run only on the embedded server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Iterator

import bson
import psutil
import pymongo
import pytest
from pymongo import monitoring
from pymongo.errors import AutoReconnect, ServerSelectionTimeoutError

from flowwarden_embedded import EmbeddedReplicaSet, wire


def _raw(rs_uri: str) -> socket.socket:
    host, port = pymongo.uri_parser.parse_uri(rs_uri)["nodelist"][0]
    return socket.create_connection((host, port), timeout=10)


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


CHECKSUM_PRESENT = 1


def _op_msg(doc: dict, request_id: int = 7, flags: int = 0) -> bytes:
    body = struct.pack("<I", flags) + b"\x00" + bson.encode(doc)
    return struct.pack("<iiii", 16 + len(body), request_id, 0, 2013) + body


def _with_wrong_checksum(message: bytes) -> bytes:
    """``message`` with a CRC-32C appended that is one bit off the right one (and its length fixed)."""
    signed = struct.pack("<i", len(message) + 4) + message[4:]
    return signed + struct.pack("<I", wire.crc32c(signed) ^ 1)


def _op_compressed(payload: bytes, declared: int, *, original_op: int = 2013, request_id: int = 8) -> bytes:
    """An OP_COMPRESSED message whose zlib ``payload`` claims to inflate to ``declared`` bytes."""
    body = struct.pack("<iiB", original_op, declared, 2) + payload
    return struct.pack("<iiii", 16 + len(body), request_id, 0, 2012) + body


def _zlib_ping() -> bytes:
    inner = _op_msg({"ping": 1, "$db": "admin"})
    return _op_compressed(zlib.compress(inner[16:]), len(inner) - 16)


MALFORMED = {
    "garbage": b"\xde\xad\xbe\xef" * 8,
    "length too small": struct.pack("<iiii", 8, 1, 0, 2013),
    "length too large": struct.pack("<iiii", 100_000_000, 1, 0, 2013),
    "unknown opcode": struct.pack("<iiii", 20, 1, 0, 9999) + b"\x00\x00\x00\x00",
    "invalid bson": struct.pack("<iiii", 16 + 4 + 1 + 8, 1, 0, 2013)
    + struct.pack("<I", 0)
    + b"\x00"
    + b"\x08\x00\x00\x00\xff\x00\x00\x00",
    "no $db": _op_msg({"ping": 1}),
    "unknown required flag": struct.pack("<iiii", 16 + 4 + 1 + 5, 1, 0, 2013)
    + struct.pack("<I", 1 << 4)
    + b"\x00"
    + bson.encode({}),
    "unknown section kind": struct.pack("<iiii", 16 + 4 + 1, 1, 0, 2013) + struct.pack("<I", 0) + b"\x07",
    "unknown compressor": struct.pack("<iiii", 16 + 9 + 3, 1, 0, 2012)
    + struct.pack("<iiB", 2013, 3, 99)
    + b"abc",
    # zlib is only for connections whose hello negotiated it; this one sent no hello. (MongoDB 7.0
    # decompresses any compressor it was started with; later releases, like this server, do not.)
    "compressor not negotiated": _zlib_ping(),
    "wrong checksum": _with_wrong_checksum(_op_msg({"ping": 1, "$db": "admin"}, flags=CHECKSUM_PRESENT)),
}


@pytest.mark.parametrize("payload", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_message_closes_only_that_connection(rs: EmbeddedReplicaSet, payload: bytes) -> None:
    with pymongo.MongoClient(rs.uri) as bystander, _raw(rs.uri) as bad:
        bystander.admin.command("ping")
        bad.sendall(payload)
        assert _closed(bad)
        assert bystander.admin.command("ping")["ok"] == 1.0


def _negotiate_zlib(sock: socket.socket) -> None:
    sock.sendall(_op_msg({"hello": 1, "compression": ["zlib"], "$db": "admin"}))
    header = sock.recv(16, socket.MSG_WAITALL)
    body = sock.recv(struct.unpack("<i", header[:4])[0] - 16, socket.MSG_WAITALL)
    assert bson.decode(body[5:])["compression"] == ["zlib"]


@functools.cache
def _zlib_bomb(mebibytes: int) -> bytes:
    """A zlib stream of ``mebibytes`` MiB of zeros in about a thousandth of that, built without ever
    holding the zeros: after a full flush the compressor starts afresh, so every further MiB
    compresses to the same bytes and the stream is its first MiB, that block repeated, and an end
    carrying the Adler-32 of the whole."""
    chunk = bytes(1 << 20)
    packer = zlib.compressobj(9)
    first = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    end = packer.flush()
    adler = 1
    for _ in range(mebibytes):
        adler = zlib.adler32(chunk, adler)
    return first + block * (mebibytes - 1) + end[:-4] + struct.pack(">I", adler)


@pytest.fixture
def server() -> Iterator[tuple[str, psutil.Process]]:
    """An EmbeddedReplicaSet in a process of its own (``python -m flowwarden_embedded``): its URI
    and its process. The test's clients, the hostile one included, do not share the server's
    interpreter (nor its GIL), and the process's memory is the server's alone."""
    process = subprocess.Popen(
        [sys.executable, "-m", "flowwarden_embedded", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        uri = process.stdout.readline().strip()
        assert uri.startswith("mongodb://"), f"the server printed {uri!r}, not its URI"
        yield uri, psutil.Process(process.pid)
    finally:
        process.terminate()
        process.wait(30)


# Pings a bystander times without the load, its baseline.
_BASELINE_PINGS = 300
# A bystander served as before has pings a few times slower at most while the server works for
# the hostile client (the two share the machine's cores); one kept waiting until the server is
# done has a ping as long as all that work, hundreds of baseline round trips.
_SLOWDOWN = 25
# A machine shared with other work may stall any process for a while, bystander or server: a
# test serves its hostile client up to this many times, and the bystander must fare well once.
# A server that keeps it waiting does so every time.
_ATTEMPTS = 3


class _Watch:
    """What a bystander saw: its ping round trips before a hostile client was served (the
    baseline) and while it was, and how far the server process's memory rose meanwhile."""

    def __init__(self) -> None:
        self.baseline: list[float] = []
        self.pings: list[tuple[float, float]] = []  # (when it was sent, how long it took)
        self.began = self.ended = 0.0
        self.peak_growth = 0

    def begin(self) -> None:
        """The hostile client is being served from now on (until the watch ends)."""
        self.began = time.perf_counter()

    def wait_pings(self, count: int) -> None:
        """Wait until the bystander has had ``count`` more pings answered: the server's loop has
        gone round as many times, reading from every connection with bytes waiting."""
        target = len(self.pings) + count
        deadline = time.monotonic() + 30
        while len(self.pings) < target:
            assert time.monotonic() < deadline, f"the bystander got fewer than {count} pings through in 30 s"
            time.sleep(0.001)

    def during(self) -> list[float]:
        """The round trips of the pings in flight at some moment while the hostile client was
        served (one sent before and answered after counts: it was kept waiting)."""
        return [took for sent, took in self.pings if sent <= self.ended and sent + took >= self.began]

    def slowdown(self) -> float:
        """How many times longer a ping took, on average, while the hostile client was served
        than without it: about 1 when the server went on as before, about the number of pings it
        would have answered meanwhile when it answered none until it was done."""
        during = self.during()
        assert during, "the bystander had no ping in flight while the hostile client was served"
        return statistics.fmean(during) / statistics.median(self.baseline)

    def span(self) -> float:
        """How long the hostile client was served, in baseline round trips."""
        return (self.ended - self.began) / statistics.median(self.baseline)


@contextlib.contextmanager
def _watched(uri: str, server: psutil.Process) -> Iterator[_Watch]:
    """Time a bystander's pings without load, then ping from it and sample the server's memory
    until the block, which serves the hostile client, ends."""
    watch = _Watch()
    done = threading.Event()
    start_rss = server.memory_info().rss

    def sample_memory() -> None:
        while not done.wait(0.005):
            watch.peak_growth = max(watch.peak_growth, server.memory_info().rss - start_rss)

    with pymongo.MongoClient(uri) as bystander:
        bystander.admin.command("ping")

        def ping() -> float:
            began = time.perf_counter()
            bystander.admin.command("ping")
            return time.perf_counter() - began

        watch.baseline = [ping() for _ in range(_BASELINE_PINGS)]

        def keep_pinging() -> None:
            while not done.is_set():
                sent = time.perf_counter()
                watch.pings.append((sent, ping()))

        threads = [threading.Thread(target=sample_memory), threading.Thread(target=keep_pinging)]
        for thread in threads:
            thread.start()
        try:
            watch.begin()
            yield watch
            watch.ended = time.perf_counter()
        finally:
            done.set()
            for thread in threads:
                thread.join()
        # One more round trip after the hostile message was dealt with: the server still answers.
        assert bystander.admin.command("ping")["ok"] == 1.0


def _served_well_once(watches: list[_Watch]) -> None:
    """The bystander fared as the server's work allows in one of the attempts at least, and that
    work was long enough to show a bystander kept waiting: tens of baseline round trips."""
    report = [(round(w.slowdown(), 1), round(w.span())) for w in watches]
    assert any(w.slowdown() < _SLOWDOWN and w.span() > 2 * _SLOWDOWN for w in watches), (
        f"(slowdown, span in baseline pings) of each attempt: {report}"
    )


def test_zlib_bomb_is_refused_without_inflating_it(server: tuple[str, psutil.Process]) -> None:
    uri, process = server
    bomb = _zlib_bomb(1024)  # 1 MB on the wire, 1 GiB inflated
    # It claims the largest size a message may have, and inflates to far more.
    declared = 48_000_000 - 16
    watches: list[_Watch] = []
    for _ in range(_ATTEMPTS):
        with _raw(uri) as hostile:
            _negotiate_zlib(hostile)
            with _watched(uri, process) as watch:
                hostile.sendall(_op_compressed(bomb, declared))
                assert _closed(hostile)
        watches.append(watch)
        # Inflating stops one byte past the declared size: tens of MB, not the whole GiB.
        assert watch.peak_growth < 256 * 1024 * 1024
    # Meanwhile the bystander was served as before, not after the server was done with the bomb.
    _served_well_once(watches)


@pytest.mark.parametrize(
    ("payload", "declared"),
    [
        (zlib.compress(b"x" * 1000), 999),  # inflates to more than it declared
        (zlib.compress(b"x" * 1000), 1001),  # inflates to less than it declared
        (zlib.compress(b"x" * 1000) + b"junk", 1000),  # bytes after the end of the stream
        (zlib.compress(b"x" * 1000), -1),
        (zlib.compress(b"x" * 1000), 48_000_000),  # with its header, more than a message may be
    ],
    ids=["more than declared", "less than declared", "trailing bytes", "negative size", "too large"],
)
def test_compressed_payload_must_match_its_declared_size(
    rs: EmbeddedReplicaSet, payload: bytes, declared: int
) -> None:
    with _raw(rs.uri) as sock:
        _negotiate_zlib(sock)
        sock.sendall(_op_compressed(payload, declared))
        assert _closed(sock)


def test_negotiated_zlib_request_is_answered(rs: EmbeddedReplicaSet) -> None:
    with _raw(rs.uri) as sock:
        _negotiate_zlib(sock)
        sock.sendall(_zlib_ping())
        header = sock.recv(16, socket.MSG_WAITALL)
        body = sock.recv(struct.unpack("<i", header[:4])[0] - 16, socket.MSG_WAITALL)
    assert struct.unpack("<i", header[12:])[0] == 2013
    assert bson.decode(body[5:])["ok"] == 1.0


def test_large_checksummed_message_does_not_stall_other_clients(server: tuple[str, psutil.Process]) -> None:
    uri, process = server
    # About 40 MB in three document-sequence documents under 16 MiB each, and a checksum that is
    # wrong: the server must read and check every byte before it may close the connection.
    pad = [bson.encode({"_id": i, "pad": "x" * 13_000_000}) for i in range(3)]
    sequence = b"pad\x00" + b"".join(pad)
    body = (
        struct.pack("<I", 1)  # checksumPresent
        + b"\x00"
        + bson.encode({"ping": 1, "$db": "admin"})
        + b"\x01"
        + struct.pack("<i", 4 + len(sequence))
        + sequence
        + struct.pack("<I", 0)
    )
    message = struct.pack("<iiii", 16 + len(body), 9, 0, 2013) + body
    assert len(message) > 39_000_000
    watches: list[_Watch] = []
    for _ in range(_ATTEMPTS):
        with _raw(uri) as hostile, _watched(uri, process) as watch:
            # All but its last byte first, read by the server while the bystander goes on; what is
            # watched is what the last byte sets off: the server checking the whole message.
            hostile.sendall(message[:-1])
            watch.wait_pings(2000)
            watch.begin()
            hostile.sendall(message[-1:])
            assert _closed(hostile)
        watches.append(watch)
    _served_well_once(watches)


def test_client_gone_mid_request_and_mid_reply(rs: EmbeddedReplicaSet, db_name: str) -> None:
    with pymongo.MongoClient(rs.uri) as c:
        c[db_name].big.insert_many([{"_id": i, "pad": "x" * 1000} for i in range(2000)])
        message = _op_msg({"insert": "c", "documents": [{"_id": 1}], "$db": db_name})
        with _raw(rs.uri) as half:
            half.sendall(message[: len(message) // 2])
        # The whole batch of a find is requested and the socket closed before reading the reply.
        with _raw(rs.uri) as impatient:
            impatient.sendall(_op_msg({"find": "big", "batchSize": 2000, "$db": db_name}))
        assert c[db_name].c.find_one() is None
        assert c[db_name].big.count_documents({}) == 2000


def test_killed_client_process_does_not_hurt_the_server(rs: EmbeddedReplicaSet, db_name: str) -> None:
    script = textwrap.dedent(
        f"""
        import pymongo, sys
        c = pymongo.MongoClient({rs.uri!r})
        coll = c[{db_name!r}].c
        coll.insert_one({{"_id": "started"}})
        print("ready", flush=True)
        i = 0
        while True:
            coll.insert_one({{"i": i}})
            list(coll.find().limit(50))
            i += 1
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    with pymongo.MongoClient(rs.uri) as c:
        assert c[db_name].c.find_one({"_id": "started"}) == {"_id": "started"}
        assert c.admin.command("ping")["ok"] == 1.0


def test_unsupported_op_query_command(rs: EmbeddedReplicaSet) -> None:
    query = b"".join(
        [struct.pack("<i", 0), b"admin.$cmd\x00", struct.pack("<ii", 0, -1), bson.encode({"ping": 1})]
    )
    with _raw(rs.uri) as sock:
        sock.sendall(struct.pack("<iiii", 16 + len(query), 3, 0, 2004) + query)
        header = sock.recv(16, socket.MSG_WAITALL)
        length = struct.unpack("<i", header[:4])[0]
        body = sock.recv(length - 16, socket.MSG_WAITALL)
    reply = bson.decode(body[20:])
    assert reply["ok"] == 0 and reply["code"] == 352


def test_drop_connections_clients_reconnect(rs: EmbeddedReplicaSet, db_name: str) -> None:
    with pymongo.MongoClient(rs.uri) as c:
        c[db_name].c.insert_one({"_id": 1})
        with _raw(rs.uri) as idle:
            rs.drop_connections()
            assert _closed(idle)
        # Retryable reads and writes ride over the dropped connection.
        assert c[db_name].c.find_one({"_id": 1}) == {"_id": 1}
        c[db_name].c.insert_one({"_id": 2})
        assert c[db_name].c.count_documents({}) == 2


async def test_drop_connections_async_clients_reconnect(rs: EmbeddedReplicaSet, db_name: str) -> None:
    c = pymongo.AsyncMongoClient(rs.uri)
    try:
        await c[db_name].c.insert_one({"_id": 1})
        rs.drop_connections()
        assert await c[db_name].c.find_one({"_id": 1}) == {"_id": 1}
    finally:
        await c.close()


class _HeartbeatFailures(monitoring.ServerHeartbeatListener):
    """Set when a client's monitor fails to reach the server: the client has seen the outage."""

    def __init__(self) -> None:
        self.seen = threading.Event()

    def started(self, event: monitoring.ServerHeartbeatStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.ServerHeartbeatSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.ServerHeartbeatFailedEvent) -> None:
        self.seen.set()


# The outages below last far longer than any test could take, so nothing races their end; each
# test ends its outage itself, with a short one that replaces it.
_LONGER_THAN_ANY_TEST = 3600.0


def test_outage_refuses_connections_then_recovers() -> None:
    with EmbeddedReplicaSet() as rs:
        with pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=20_000) as patient:
            patient.t.c.insert_one({"_id": "before"})
            rs.outage(_LONGER_THAN_ANY_TEST)
            with _raw(rs.uri) as refused:
                assert _closed(refused)
            with (
                pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=200) as hasty,
                pytest.raises((ServerSelectionTimeoutError, AutoReconnect)),
            ):
                hasty.t.c.find_one()
            # The outage now ends by running out: a client willing to wait gets through after it.
            rs.outage(0.2)
            assert patient.t.c.find_one({"_id": "before"}) == {"_id": "before"}


async def test_outage_async_client_waits_it_out() -> None:
    with EmbeddedReplicaSet() as rs:
        heartbeats = _HeartbeatFailures()
        c = pymongo.AsyncMongoClient(rs.uri, serverSelectionTimeoutMS=20_000, event_listeners=[heartbeats])
        try:
            await c.t.c.insert_one({"_id": 1})
            rs.outage(_LONGER_THAN_ANY_TEST)
            reading = asyncio.ensure_future(c.t.c.find_one({"_id": 1}))
            assert await asyncio.to_thread(heartbeats.seen.wait, 20), "the client never saw the outage"
            assert not reading.done(), "the read ended during the outage instead of waiting it out"
            rs.outage(0)
            assert await asyncio.wait_for(reading, 20) == {"_id": 1}
        finally:
            await c.close()


def test_start_stop_are_idempotent_and_restart_keeps_port_and_data() -> None:
    rs = EmbeddedReplicaSet()
    assert not rs.running
    rs.stop()
    rs.start()
    rs.start()
    uri = rs.uri
    assert uri == f"mongodb://127.0.0.1:{rs.port}/?replicaSet=rs0" and rs.port > 0
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20_000) as c:
        c.t.c.insert_one({"_id": "kept"})
        rs.stop()
        rs.stop()
        assert not rs.running
        rs.start()
        assert rs.uri == uri
        assert c.t.c.find_one() == {"_id": "kept"}
    rs.stop()


def test_stop_closes_connections_and_frees_the_port() -> None:
    rs = EmbeddedReplicaSet().start()
    port = rs.port
    sock = _raw(rs.uri)
    rs.stop()
    assert _closed(sock)
    sock.close()
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


def test_oplog_max_events_is_validated() -> None:
    with pytest.raises(ValueError):
        EmbeddedReplicaSet(oplog_max_events=0)
    with EmbeddedReplicaSet(oplog_max_events=5) as rs:
        assert rs.oplog.max_events == 5


def test_helpers_need_a_running_server() -> None:
    rs = EmbeddedReplicaSet()
    with pytest.raises(RuntimeError):
        rs.drop_connections()
    with pytest.raises(RuntimeError):
        rs.outage(1)


def test_serve_forever_stops_cleanly_on_sigterm() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = (
        f"from flowwarden_embedded import EmbeddedReplicaSet; EmbeddedReplicaSet(port={port}).serve_forever()"
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        with pymongo.MongoClient(
            f"mongodb://127.0.0.1:{port}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000
        ) as c:
            c.t.c.insert_one({"_id": 1})
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()


def test_many_concurrent_clients(rs: EmbeddedReplicaSet, db_name: str) -> None:
    clients = [pymongo.MongoClient(rs.uri) for _ in range(20)]
    try:
        for i, c in enumerate(clients):
            c[db_name].c.insert_one({"_id": i})
        status = clients[0].admin.command("serverStatus")
        assert status["connections"]["current"] >= 20
        assert clients[-1][db_name].c.count_documents({}) == 20
    finally:
        for c in clients:
            c.close()


def test_run_in_server_reaches_the_loop_thread(rs: EmbeddedReplicaSet) -> None:
    import threading

    names = rs.run_in_server(lambda: (threading.current_thread().name, rs.oplog.cluster_time))
    assert names[0].startswith("flowwarden-embedded-rs")
    assert names[1] is not None
    with pytest.raises(ZeroDivisionError):
        rs.run_in_server(lambda: 1 // 0)
