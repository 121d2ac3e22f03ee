"""Sandbox ports: a client reaches a TCP port inside a sandbox through that sandbox's agent
(`open_port`: a stream; `forward_port`: a local address any library can use), only with the sandbox's
own token, only the sandbox's own ports, and never after the sandbox is gone.

The server inside is an echo server from whatever the image has: python3, else busybox's `nc -ll -e cat`
(it echoes until the client half-closes, then closes its side)."""

from __future__ import annotations

import socket
from typing import Iterator

import pytest

from orchard.core.errors import AuthError, InvalidRequest, OrchardError, PortClosed, SandboxLost
from orchard.core.sandbox import NetworkPolicy
from orchard.sandbox.ports import connect_port
from orchard.sandbox.sync import SyncSandbox
from orchard.testing.conformance._rig import ConformanceRig, tcp_server, wait_until

ECHO_PORT = 7007
# A thread per connection: echo until the client half-closes, then half-close back.
ECHO_PY = r"""
import socket, sys, threading
def serve(c):
    with c:
        while True:
            data = c.recv(65536)
            if not data:
                c.shutdown(socket.SHUT_WR)
                return
            c.sendall(data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""
START_ECHO = """
if command -v python3 >/dev/null 2>&1; then
  python3 /tmp/orchard-echo.py "$1" </dev/null >/dev/null 2>&1 &
elif command -v nc >/dev/null 2>&1; then
  nc -ll -p "$1" -e cat </dev/null >/dev/null 2>&1 &
else
  echo "NO-SERVER: the image has neither python3 nor nc to serve a port"; exit 99
fi
"""


def start_echo(sandbox: SyncSandbox, port: int = ECHO_PORT) -> None:
    """Start the echo server on `port` inside and wait until it accepts connections through the agent."""
    sandbox.write_file("/tmp/orchard-echo.py", ECHO_PY)
    r = sandbox.exec(["sh", "-c", START_ECHO, "start", str(port)], timeout=60)
    assert r.exit_code != 99, r.stdout
    assert r.exit_code == 0, r
    sandbox.wait_for_port(port, timeout=60)


def echo_through(sock: socket.socket, payload: bytes) -> bytes:
    """Send `payload`, half-close, and read what comes back until the other side closes."""
    with sock:
        sock.settimeout(60)
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
    return bytes(received)


class PortChecks(ConformanceRig):
    @pytest.fixture(scope="class")
    def echoing(self, orchestrator) -> Iterator[tuple[object, SyncSandbox]]:
        """A sandbox of its own serving the echo server on ECHO_PORT."""
        with orchestrator.sandbox(self._spec_for(orchestrator)) as (info, sandbox):
            start_echo(sandbox)
            yield info, sandbox

    def test_open_port_reaches_a_server_inside(self, echoing, orchestrator):
        _, sandbox = echoing
        payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
        assert echo_through(sandbox.open_port(ECHO_PORT), payload) == payload

        async def with_streams() -> bytes:
            reader, writer = await sandbox.async_sandbox.open_port(ECHO_PORT)
            writer.write(b"through asyncio streams")
            await writer.drain()
            writer.write_eof()
            data = await reader.read()
            writer.close()
            await writer.wait_closed()
            return data

        assert orchestrator.run(with_streams()) == b"through asyncio streams"

    def test_forward_port_gives_a_local_address_any_client_can_use(self, echoing):
        _, sandbox = echoing
        with sandbox.forward_port(ECHO_PORT) as forward:
            assert forward.host == "127.0.0.1" and forward.port > 0 and forward.remote_port == ECHO_PORT
            payloads = [b"first " * 1000, b"second " * 1000, b"third"]
            socks = [socket.create_connection((forward.host, forward.port), timeout=30) for _ in payloads]
            results = [echo_through(sock, payload) for sock, payload in zip(socks, payloads)]
            assert results == payloads
        with pytest.raises(OSError):  # closed: nothing listens on its address any more
            socket.create_connection((forward.host, forward.port), timeout=5).close()

    def test_listening_ports_are_the_sandbox_own(self, echoing, sandbox):
        _, serving = echoing
        assert ECHO_PORT in serving.listening_ports()
        assert ECHO_PORT not in sandbox.listening_ports()
        with pytest.raises(PortClosed, match="within 0.2 s"):
            sandbox.wait_for_port(ECHO_PORT, timeout=0.2)

    def test_a_port_nothing_listens_on_is_port_closed(self, sandbox):
        with pytest.raises(PortClosed, match="nothing listens on port 7999"):
            sandbox.open_port(7999)
        with pytest.raises(InvalidRequest, match="not a TCP port"):
            sandbox.open_port(70000)

    def test_only_the_sandbox_own_token_opens_its_ports(self, echoing):
        info, _ = echoing
        with pytest.raises(AuthError):
            connect_port(info.agent_url, "not-" + info.token, ECHO_PORT, info.id)

    def test_only_the_sandbox_own_ports(self, echoing, orchestrator):
        """A server of the host's (on every address) and one of another sandbox are out of reach."""
        _, other = echoing
        with orchestrator.sandbox(self._spec_for(orchestrator)) as (_, sandbox):
            with pytest.raises(PortClosed):
                sandbox.open_port(ECHO_PORT)  # the other sandbox serves it
            with tcp_server() as host_port:
                with pytest.raises(PortClosed):
                    sandbox.open_port(host_port)
        assert echo_through(other.open_port(ECHO_PORT), b"still there") == b"still there"

    def test_open_network_never_opens_the_host_ports(self, orchestrator):
        """With network 'open' a sandbox either has ports of its own or is refused; it never reaches the
        host's (a backend whose 'open' shares the host's network namespace refuses every port)."""
        if "open" not in orchestrator.backend.capabilities.network_modes:
            pytest.skip(f"the {orchestrator.backend.name} backend does not declare network mode 'open'")
        with tcp_server() as host_port:
            spec = self._spec_for(orchestrator, network=NetworkPolicy(mode="open"))
            with orchestrator.sandbox(spec) as (_, sandbox):
                try:
                    sandbox.open_port(host_port).close()
                except (InvalidRequest, PortClosed):
                    pass
                else:
                    pytest.fail(f"open_port({host_port}) reached the host's server from a sandbox")

    def test_ports_close_with_the_sandbox(self, orchestrator):
        spec = self._spec_for(orchestrator)
        info = orchestrator.create(spec)
        sandbox = orchestrator.attach(info)
        try:
            start_echo(sandbox)
            forward = sandbox.forward_port(ECHO_PORT)
            with sandbox.open_port(ECHO_PORT) as open_sock:
                orchestrator.run(orchestrator.service.delete(info.id))
                open_sock.settimeout(60)
                try:  # the sandbox is gone: its end of the connection is, too
                    assert open_sock.recv(1) == b""
                except OSError:
                    pass
            with pytest.raises((SandboxLost, PortClosed, AuthError)):
                sandbox.open_port(ECHO_PORT)
            with socket.create_connection((forward.host, forward.port), timeout=30) as local:
                local.settimeout(60)
                try:
                    assert local.recv(1) == b""  # the forward could not open the port: closed at once
                except OSError:
                    pass
            assert isinstance(wait_until(lambda: forward.last_error, "the forward's error"), OrchardError)
        finally:
            sandbox.close()
            if info.id in orchestrator.live_ids():
                orchestrator.run(orchestrator.service.delete(info.id))

