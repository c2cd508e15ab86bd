"""The metrics server under many scrapers and idle connections: every request is answered, the
threads it uses stay few, and idle connections are closed."""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from flowwarden.runtime import metrics
from flowwarden.runtime.metrics import MetricsServer
from helpers import wait_until


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    served = MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=lambda: {"orders": "STARTING"})
    try:
        yield served
    finally:
        served.close()


def get(server: MetricsServer, path: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@contextlib.contextmanager
def idle_connections(server: MetricsServer, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that send nothing, closed by the client when the block ends."""
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(count)]
    try:
        yield connections
    finally:
        for connection in connections:
            connection.close()


def serving() -> contextlib.closing[MetricsServer]:
    """A server on an ephemeral port, always alive and ready, closed when the block ends."""
    return contextlib.closing(MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=dict))


def closed(connection: socket.socket) -> bool:
    """Whether the server closed ``connection`` (an idle one: no answer comes first)."""
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:  # the socket's deadline: still open
        return False


def test_each_path_answers(server):
    assert get(server, "/healthz") == (200, b"ok\n")
    status, body = get(server, "/readyz")
    assert status == 503 and b'"orders": "STARTING"' in body
    status, body = get(server, "/metrics")
    assert status == 200 and b"# TYPE" in body
    assert get(server, "/metrics", method="HEAD") == (200, b"")
    assert get(server, "/nothing")[0] == 404
    assert get(server, "/metrics", method="POST")[0] == 405


def test_idle_connections_take_no_thread_each_and_scrapers_are_answered(server):
    threads_before = threading.active_count()
    with idle_connections(server, 300):
        # Connections are accepted in order: once a later one is answered, the idle ones before it
        # have been accepted too (a server with a thread per connection has started 300 by now).
        assert get(server, "/healthz") == (200, b"ok\n")
        started = threading.active_count() - threads_before
        assert started <= metrics.ANSWER_THREADS + 1, f"{started} threads for 300 idle connections"
        with ThreadPoolExecutor(50) as scrapers:
            answers = list(scrapers.map(lambda _: get(server, "/metrics")[0], range(400)))
        assert answers.count(200) == 400, f"{answers.count(200)} of 400 scrapes answered"


def test_a_connection_that_sends_no_request_is_closed(monkeypatch):
    monkeypatch.setattr(metrics, "CONNECTION_TIMEOUT_SECONDS", 0.3)
    with serving() as server, idle_connections(server, 5) as idle:
        for connection in idle:
            assert closed(connection), "the server kept an idle connection open"
        assert get(server, "/healthz")[0] == 200


def test_beyond_the_connection_limit_the_oldest_idle_one_makes_room(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 10)
    with serving() as server, idle_connections(server, 10) as idle:
        assert get(server, "/healthz")[0] == 200  # the 11th connection, while 10 idle ones are open
        idle[0].settimeout(5)  # well before the server's own 10 s limit on a connection
        assert closed(idle[0]), "the oldest idle connection was not closed"


def test_close_ends_the_serving_thread_and_drops_the_connections_still_open():
    server = MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=dict)
    with idle_connections(server, 3) as idle:
        # Connections the server holds (one arriving at the very moment of close() may land on
        # either side of it).
        wait_until(lambda: len(server._open) == 3, what="the server to hold the three connections")
        (serving,) = [t for t in threading.enumerate() if t.name == "flowwarden-metrics"]
        assert serving.daemon, "the server's thread would hold the process's exit"
        server.close()
        server.close()  # a second close does nothing
        assert not [t for t in threading.enumerate() if t.name == "flowwarden-metrics" and t.is_alive()]
        for connection in idle:
            connection.settimeout(5)  # well before the server's own 10 s limit on a connection
            assert closed(connection), "close() left a connection open"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=5)


def test_close_ends_every_connection_before_its_loop_closes(monkeypatch, caplog):
    """A connection still open at close() ends on the server's loop, not later when collected
    on a closed loop ("Event loop is closed", "Task was destroyed but it is pending")."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def serve_then_close() -> None:  # the server goes with this frame, and whatever it still holds
        server = MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=dict)
        with idle_connections(server, 3):
            wait_until(lambda: len(server._open) == 3, what="the server to hold the three connections")
            server.close()

    serve_then_close()
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert [f"{u.exc_type.__name__}: {u.exc_value} ({u.object!r})" for u in unraisable] == []


def test_close_neither_waits_for_answers_being_made_nor_makes_the_queued_ones():
    entered = threading.Semaphore(0)
    release = threading.Event()
    answered = []

    def not_ready():  # a /readyz answer that takes until released
        answered.append(1)
        entered.release()
        release.wait(30)
        return {}

    def ask() -> None:
        with contextlib.suppress(OSError):  # dropped by close()
            get(server, "/readyz")

    server = MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=not_ready)
    clients = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
    try:
        for client in clients:
            client.start()
        for _ in range(metrics.ANSWER_THREADS):  # every answer thread busy, one request queued
            assert entered.acquire(timeout=30)
        answering = [t for t in threading.enumerate() if t.name.startswith("flowwarden-metrics-answer")]
        assert len(answering) == metrics.ANSWER_THREADS
        closing = threading.Thread(target=server.close, daemon=True)
        closing.start()
        closing.join(20)
        assert not closing.is_alive(), "close() waited for the answers being made"
        # The answers are still being made, and the server's loop has ended all the same.
        serving = [t for t in threading.enumerate() if t.name == "flowwarden-metrics" and t.is_alive()]
        assert serving == [], "the server's loop waits for the answers being made"
    finally:
        release.set()
    server._answers.shutdown(wait=True)  # what was left to run has run
    assert len(answered) == metrics.ANSWER_THREADS, "an answer queued before close() was made"


def test_a_request_head_over_the_limit_is_not_answered(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        padding = "a" * (metrics.MAX_REQUEST_BYTES + 1024)
        connection.sendall(f"GET /healthz HTTP/1.1\r\nX-Padding: {padding}\r\n\r\n".encode())
        assert closed(connection), "a request head over MAX_REQUEST_BYTES was answered"


def test_a_server_that_cannot_serve_raises_from_its_constructor(monkeypatch):
    async def refused(*args, **kwargs):
        raise OSError("no listening here")

    monkeypatch.setattr(metrics.asyncio, "start_server", refused)
    with pytest.raises(OSError, match="no listening here"):
        MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=dict)


def exchange(server: MetricsServer, request: bytes) -> bytes:
    """``request`` sent as it is, and everything the server sends back until it closes."""
    with socket.create_connection((server.host, server.port), timeout=30) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def test_the_answers_say_what_http_clients_read(server):
    ok = exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = ok.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 200 OK",
        b"Content-Type: text/plain; charset=utf-8",
        b"Content-Length: 3",
        b"Connection: close",
    ]
    assert body == b"ok\n"
    refused = exchange(server, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = refused.partition(b"\r\n\r\n")
    assert b"Allow: GET, HEAD" in head.split(b"\r\n") and head.startswith(b"HTTP/1.1 405 ")
    assert body == b"only GET and HEAD are served here\n"
    head_only = exchange(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head_only.endswith(b"Content-Length: 3\r\nConnection: close\r\n\r\n")  # no body


def test_the_path_is_read_without_its_query_and_without_a_version(server):
    assert exchange(server, b"GET /healthz?probe=1?again HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    assert exchange(server, b"GET /healthz\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_a_connection_being_answered_is_not_the_one_dropped_for_room(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 2)
    entered, release = threading.Event(), threading.Event()

    def not_ready():
        entered.set()
        release.wait(30)
        return {}

    server = MetricsServer("127.0.0.1", 0, alive=lambda: True, not_ready=not_ready)
    answered: list[bytes] = []
    asking = threading.Thread(
        target=lambda: answered.append(exchange(server, b"GET /readyz HTTP/1.1\r\n\r\n")), daemon=True
    )
    try:
        asking.start()
        assert entered.wait(30)
        with idle_connections(server, 2):  # the limit reached: room is made among these
            wait_until(lambda: len(server._open) == 2, what="room made for the second idle connection")
            release.set()
            asking.join(30)
            assert answered and answered[0].startswith(b"HTTP/1.1 200 "), (
                "the request being answered was dropped"
            )
    finally:
        release.set()
        server.close()


def test_connections_that_ended_leave_room_for_new_ones(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 3)
    with serving() as server:
        with idle_connections(server, 3):  # gone before they sent a request
            pass
        wait_until(lambda: not server._open, what="the server to see the three connections end")
        with idle_connections(server, 3) as idle:
            assert get(server, "/healthz")[0] == 200  # the fourth: the oldest idle one makes room
            idle[0].settimeout(5)
            assert closed(idle[0]), "room was looked for among connections that had already ended"


def test_a_process_with_a_metrics_server_still_open_exits():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from flowwarden.runtime.metrics import MetricsServer\n"
            "MetricsServer('127.0.0.1', 0, alive=lambda: True, not_ready=dict)\nprint('leaving')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "leaving\n", done.stderr


def test_the_server_prefers_ipv4_where_a_name_has_both_and_listens_on_ipv6_alone(monkeypatch):
    real = socket.getaddrinfo

    def ipv6_first(host, port, *args, **kwargs):
        found = real(host, port, *args, **kwargs)
        six = [info for info in found if info[0] == socket.AF_INET6]
        return six + [info for info in found if info[0] != socket.AF_INET6]

    def both(host, port, *args, **kwargs):
        return real("::1", port, *args, **kwargs) + real("127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(metrics.socket, "getaddrinfo", both)
    served = MetricsServer("localhost", 0, alive=lambda: True, not_ready=dict)
    try:
        assert served.host == "127.0.0.1"
    finally:
        served.close()
    monkeypatch.setattr(metrics.socket, "getaddrinfo", ipv6_first)
    only_six = MetricsServer("::1", 0, alive=lambda: True, not_ready=dict)
    try:
        assert only_six.host == "::1" and only_six.port > 0
        assert exchange(only_six, b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    finally:
        only_six.close()
