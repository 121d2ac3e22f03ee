"""The remote control plane's errors when the connection to the server breaks: always a typed error whose
message says what happened. A real TCP server stands in for an orchestrator that dies mid-request (found
by the chaos test: an orchestrator SIGKILLed while answering resets the connection, and httpx's ReadError
for a reset has an empty message)."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Iterator

import pytest

from orchard.core.errors import OrchardError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.control import RemoteControlPlane


@pytest.fixture
def resetting_server() -> Iterator[str]:
    """Reads each request, then resets the connection (SO_LINGER 0: RST, no answer)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        listener.close()
        thread.join(timeout=5)


async def test_a_reset_connection_is_an_error_that_says_so(resetting_server, monkeypatch):
    monkeypatch.setattr("orchard.sandbox.control.CREATE_RETRY_BACKOFF_S", 0.0)
    control = RemoteControlPlane(resetting_server, "key")
    try:
        for call in (control.delete("sb-1"), control.create(SandboxSpec())):  # plain, and retried with a key
            with pytest.raises(OrchardError) as caught:
                await call
            message = str(caught.value)
            assert message.startswith(f"talking to the Orchard server at {resetting_server} failed during ")
            assert message.endswith("the connection broke (ReadError, e.g. reset by the server)"), message
    finally:
        await control.close()
