"""The agent's `GET /ports/<port>` (orchard/sandbox/agent/ports.py), on a real agent process and real
sockets: the relayed upgrade (what TCP clients such as Kubernetes' get) and the handed-over socket (Unix
clients), through the SDK's `connect_port` and raw requests; what it refuses and why. Across backends and
through the sandbox SDK: the conformance suite's port checks (orchard/testing/conformance/ports.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from orchard.core.errors import AuthError, InvalidRequest, PortClosed
from orchard.sandbox.ports import PortForward, connect_port
from orchard.testing.conformance.ports import echo_through
from tests.test_agent import RunningAgent


@pytest.fixture(scope="module")
def echo_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(scope="module")
def agent():
    with RunningAgent() as running:
        yield running


@pytest.fixture(scope="module")
def tcp_agent():
    with RunningAgent(listen="tcp:127.0.0.1:0") as running:
        yield running


def _raw(agent: RunningAgent, head: str) -> tuple[socket.socket, bytes]:
    """Send a raw request head on the agent's Unix socket; (the socket, what came back first)."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(agent.socket_path)
    sock.settimeout(30)
    sock.sendall(head.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return sock, data


def test_a_unix_client_is_handed_the_connected_socket(agent, echo_port):
    sock = connect_port("unix://" + agent.socket_path, agent.token, echo_port)
    assert sock.family == socket.AF_INET  # the port's own connection, no relay in between
    assert sock.getpeername() == ("127.0.0.1", echo_port)
    assert echo_through(sock, b"handed over") == b"handed over"


def test_a_tcp_client_is_relayed_with_half_close(tcp_agent, echo_port):
    payload = bytes(range(256)) * 8192  # 2 MiB
    sock = connect_port("http://" + tcp_agent.address[len("tcp:"):], tcp_agent.token, echo_port)
    assert echo_through(sock, payload) == payload


def test_the_relay_serves_a_unix_client_that_offers_only_it(agent, echo_port):
    """Bytes sent right behind the request head are relayed too (they sit in the agent's read buffer)."""
    sock, data = _raw(agent, f"GET /ports/{echo_port} HTTP/1.1\r\nAuthorization: Bearer {agent.token}\r\n"
                             "Connection: Upgrade\r\nUpgrade: orchard-tcp\r\n\r\nearly bytes")
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ") and b"Upgrade: orchard-tcp" in head
    assert rest + echo_through(sock, b" and late ones") == b"early bytes and late ones"


def test_forward_port_relays_many_connections_at_once(agent, echo_port):
    with PortForward("unix://" + agent.socket_path, agent.token, echo_port) as forward:
        socks = [socket.create_connection((forward.host, forward.port), timeout=30) for _ in range(20)]
        assert [echo_through(s, b"n%d" % i) for i, s in enumerate(socks)] == [b"n%d" % i for i in range(20)]
    assert repr(forward).endswith("closed)")


def test_refusals_say_why(agent, tcp_agent):
    url = "unix://" + agent.socket_path
    with pytest.raises(AuthError, match="token"):
        connect_port(url, "wrong", 80)
    with pytest.raises(PortClosed, match="nothing listens on port 1 inside the sandbox"):
        connect_port(url, agent.token, 1)
    with pytest.raises(InvalidRequest, match="not a TCP port"):
        connect_port(url, agent.token, 0)
    sock, data = _raw(agent, "GET /ports/80 HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n" % agent.token)
    sock.close()
    assert data.startswith(b"HTTP/1.1 400 ") and b"Upgrade: orchard-tcp" in data
    sock, data = _raw(agent, "GET /ports/99999 HTTP/1.1\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\n"
                             "Upgrade: orchard-tcp\r\n\r\n" % agent.token)
    sock.close()
    assert b"not a TCP port number" in data
    # The socket can be handed over only on a Unix socket: a TCP client must offer the relay.
    tcp = socket.create_connection(tuple(tcp_agent.address[len("tcp:"):].rsplit(":", 1)), timeout=30)
    with tcp:
        tcp.sendall(("GET /ports/80 HTTP/1.1\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\n"
                     "Upgrade: orchard-fd\r\n\r\n" % tcp_agent.token).encode())
        answer = tcp.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"Unix socket" in answer


def test_an_agent_on_the_host_network_opens_no_port(echo_port):
    """The local backend's network 'open' shares the host's namespace: its loopback is the host's."""
    with RunningAgent(env={"ORCHARD_AGENT_HOST_NETWORK": "1"}) as agent:
        with pytest.raises(InvalidRequest, match="shares the host's network"):
            connect_port("unix://" + agent.socket_path, agent.token, echo_port)


def test_a_refusal_is_json_with_a_code(agent):
    sock, data = _raw(agent, "GET /ports/1 HTTP/1.1\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\n"
                             "Upgrade: orchard-tcp\r\n\r\n" % agent.token)
    with sock:
        head, _, body = data.partition(b"\r\n\r\n")
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(fields[b"Content-Length"])
        while len(body) < length:
            body += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert json.loads(body)["error"] == "port_closed"


# --- POST /exec/attach -----------------------------------------------------------------------------------

def test_an_attached_command_talks_over_the_connection(agent):
    from orchard.sandbox.ports import connect_attached

    request = json.dumps({"command": ["sh", "-c", "while read line; do echo \"got $line\"; done; echo bye"]})
    sock = connect_attached("unix://" + agent.socket_path, agent.token, request.encode())
    assert echo_through(sock, b"one\ntwo\n") == b"got one\ngot two\nbye\n"  # stdin closed: it ends, its output stays


def test_attach_refusals_say_why(agent):
    from orchard.sandbox.ports import connect_attached

    url = "unix://" + agent.socket_path
    with pytest.raises(InvalidRequest, match="cannot run 'no-such-program'"):
        connect_attached(url, agent.token, json.dumps({"command": ["no-such-program"]}).encode())
    with pytest.raises(InvalidRequest, match="stdin is the connection"):
        connect_attached(url, agent.token, json.dumps({"command": "cat", "stdin": "x"}).encode())
    with pytest.raises(AuthError):
        connect_attached(url, "wrong", json.dumps({"command": "cat"}).encode())
    body = b'{"command": "cat"}'
    sock, data = _raw(agent, "POST /exec/attach HTTP/1.1\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n"
                             % (agent.token, len(body)) + body.decode())
    sock.close()
    assert data.startswith(b"HTTP/1.1 400 ") and b"Upgrade: orchard-attach" in data


def test_an_attached_command_is_killed_when_the_client_goes(agent):
    from orchard.sandbox.ports import connect_attached

    marker = "attached-%d" % os.getpid()
    sock = connect_attached("unix://" + agent.socket_path, agent.token,
                            json.dumps({"command": ["sh", "-c", f"sleep 600; : {marker}"]}).encode())
    assert _running(marker)  # started before the 101 answer
    sock.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.05)
    assert not _running(marker)


def test_an_attached_command_ends_at_its_timeout_however_quiet_the_client(agent):
    from orchard.sandbox.ports import connect_attached

    marker = "attached-timeout-%d" % os.getpid()
    sock = connect_attached("unix://" + agent.socket_path, agent.token,
                            json.dumps({"command": ["sh", "-c", f"sleep 600; : {marker}"], "timeout": 1}).encode())
    with sock:
        sock.settimeout(30)
        assert sock.recv(1) == b""  # cut off: the command was killed, its stdout ended
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.05)
    assert not _running(marker)


def _running(marker: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                return True
        except OSError:
            continue
    return False
