"""The agent's model-gateway forwarder (orchard/sandbox/agent/forward.py) in-process, against real
sockets: bytes both ways, many connections at once, streamed data relayed as it comes, half-close, and a
502 that says why when the gateway cannot be reached. The sandbox end to end is tests/test_model_network.py."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchard.sandbox.agent.forward import Forwarder, parse_target


class UnixServer:
    """A Unix socket server running `handle(conn)` per connection, in threads."""

    def __init__(self, path: Path, handle) -> None:
        self.path, self.handle = path, handle
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(256)
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            self.handle(conn)

    def close(self) -> None:
        self.sock.close()


def echo_until_eof(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@pytest.fixture
def forwarder_to(tmp_path):
    made: list = []

    def make(handle) -> Forwarder:
        server = UnixServer(tmp_path / "gw.sock", handle)
        forwarder = Forwarder(f"unix:{server.path}", port=0)
        forwarder.start()
        made.append((server, forwarder))
        return forwarder

    yield make
    for server, forwarder in made:
        forwarder.close()
        server.close()


def exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)  # half-close: the answer still comes back
        received = bytearray()
        while chunk := conn.recv(65536):
            received += chunk
    return bytes(received)


def test_relays_bytes_both_ways_for_many_connections_at_once(forwarder_to):
    forwarder = forwarder_to(echo_until_eof)
    payloads = [bytes([i]) * (1 + i * 40_000) for i in range(64)]  # up to ~2.5 MB each
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda p: exchange(forwarder.port, p), payloads))
    assert answers == payloads


def test_streamed_events_arrive_as_they_are_sent(forwarder_to):
    next_event = threading.Event()

    def stream(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: one\n\n")
        next_event.wait(30)  # the second event only after the client has read the first
        conn.sendall(b"data: two\n\n")

    forwarder = forwarder_to(stream)
    with socket.create_connection(("127.0.0.1", forwarder.port)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
        received = b""
        while not received.endswith(b"data: one\n\n"):
            received += conn.recv(65536)
        next_event.set()
        while chunk := conn.recv(65536):
            received += chunk
    assert received.endswith(b"data: one\n\ndata: two\n\n")


def test_an_unreachable_gateway_is_a_502_that_says_why(tmp_path):
    forwarder = Forwarder(f"unix:{tmp_path}/absent.sock", port=0)
    forwarder.start()
    try:
        answer = exchange(forwarder.port, b"GET /v1/models HTTP/1.1\r\n\r\n")
    finally:
        forwarder.close()
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert b"the model gateway (unix:" in answer and b"is unreachable from the sandbox" in answer


def test_a_client_that_goes_away_ends_its_pair_and_the_forwarder_goes_on(forwarder_to):
    closed = threading.Event()

    def wait_for_close(conn: socket.socket) -> None:
        while conn.recv(65536):
            pass
        closed.set()

    forwarder = forwarder_to(wait_for_close)
    conn = socket.create_connection(("127.0.0.1", forwarder.port))
    conn.sendall(b"partial request")
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset on close
    conn.close()
    assert closed.wait(30)


@pytest.mark.parametrize("text", ["tcp:10.0.0.1", "http://10.0.0.1:4000", "unix:", "tcp:host:99999", ""])
def test_targets_other_than_unix_or_tcp_are_refused(text):
    with pytest.raises(ValueError, match="unix:PATH or tcp:HOST:PORT"):
        parse_target(text)


def test_tcp_targets():
    assert parse_target("tcp:10.239.255.1:4000") == (socket.AF_INET, ("10.239.255.1", 4000))
    assert parse_target("tcp:[::1]:4000") == (socket.AF_INET6, ("::1", 4000))


def test_the_agent_ends_when_it_cannot_take_the_gateway_port(tmp_path):
    """`--gateway` listens before READY: a port already taken (here, in this machine's namespace) is a start
    failure that says why, not an agent without its forwarder."""
    import os
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", 4000))
            taken.listen()
        except OSError:
            pass  # something else on this machine holds it already: taken all the same
        started = subprocess.run([sys.executable, "-m", "orchard.sandbox.agent", "--listen", "tcp:127.0.0.1:0",
                                  "--workdir", str(tmp_path), "--gateway", f"unix:{tmp_path}/gw.sock"],
                                 env={**os.environ, "ORCHARD_AGENT_TOKEN": "t"}, capture_output=True, text=True,
                                 timeout=60)
    assert started.returncode == 2 and "READY" not in started.stdout
    assert "cannot relay the model gateway at 127.0.0.1:4000" in started.stderr
