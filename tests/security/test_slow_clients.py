"""Slow and unauthenticated clients against a real `orchard serve` (the real local backend). Connections
that send a chunked `POST /v1/sandboxes` without a key, or drip their headers, used to be held for as long
as the client liked: enough of them used up the server's file descriptors and `/healthz` and authenticated
creates timed out. Now a request without a valid key is refused (401) before its body is read, a request
that does not arrive whole in time is cut off, and connections are capped (the oldest idle one that never
authenticated makes way). The server runs with 256 descriptors, so a few hundred connections show it."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Iterator

import httpx
import pytest

from tests.security.serve_process import API_KEY, Serve, server_on_a_home_of_its_own, wait_for

NOFILE = 256
SLOW_CONNECTIONS = 320  # more than the server's descriptors
CHUNKED_CREATE = (b"POST /v1/sandboxes HTTP/1.1\r\nHost: orchard\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Serve]:
    with server_on_a_home_of_its_own(tmp_path_factory, "sec-slow", args=["--request-timeout-s", "3"],
                                     wrapper=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"]) as running:
        yield running


def connect(server: Serve) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout fails the test)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("authorization", [b"", b"Authorization: Bearer wrong-key\r\n"])
def test_an_unauthenticated_body_is_never_read(server, authorization):
    with contextlib.closing(connect(server)) as sock:
        # the head only: the server must answer without waiting for a single byte of the body
        sock.sendall(CHUNKED_CREATE.replace(b"\r\n\r\n", b"\r\n" + authorization + b"\r\n"))
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    assert b'"error":"unauthorized"' in answer.replace(b" ", b"")


def test_a_request_dripped_a_byte_at_a_time_is_cut_off(server):
    """Every byte resets uvicorn's own keep-alive timer; the request deadline still runs."""
    with contextlib.closing(connect(server)) as sock:
        sock.settimeout(0.5)
        head = b"GET /healthz HTTP/1.1\r\nHost: orchard\r\nX-Slow: " + b"a" * 200
        closed = False
        for byte in head:
            try:
                sock.send(bytes([byte]))
                if sock.recv(1) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:  # reset by the server
                closed = True
                break
        assert closed, "the server still waited for a header dripped over 100 s"


def test_many_slow_unauthenticated_connections_leave_the_server_serving(server):
    held: list[socket.socket] = []
    try:
        for i in range(SLOW_CONNECTIONS):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", server.port))
            held.append(sock)
            with contextlib.suppress(OSError):  # half a head, or a whole one with half a chunked body
                sock.send(CHUNKED_CREATE + b"10\r\n{" if i % 2 else b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n")
        # the server holds no more than its descriptors allow and still answers
        health = httpx.get(f"{server.url}/healthz", timeout=30)
        assert health.status_code == 200, health.text
        with server.client() as api:
            created = api.post("/v1/sandboxes", json={"image": "host", "timeout_s": 120})
            assert created.status_code == 201, created.text
            assert api.delete(f"/v1/sandboxes/{created.json()['id']}").status_code == 204
        assert len(os.listdir(f"/proc/{server.process.pid}/fd")) < NOFILE
    finally:
        for sock in held:
            sock.close()


def test_the_server_closes_idle_connections_that_never_send_a_request(server):
    with contextlib.closing(connect(server)) as sock:
        assert read_until_closed(sock) == b""  # closed by the server after --request-timeout-s
    # an authenticated client is unaffected
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}) as api:
        assert api.get("/v1/sandboxes").status_code == 200
