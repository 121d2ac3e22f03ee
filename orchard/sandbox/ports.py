"""Ports inside a sandbox, from the client's machine: `connect_port` opens one TCP connection to a port in
the sandbox through its agent (`GET /ports/<port>` upgraded to a raw stream; docs/agent-protocol.md, Ports),
`connect_attached` the stdin and stdout of a command started there (`POST /exec/attach`), and `PortForward` listens on a local address and relays each connection made to it through its own such
connection, so that any library (httpx, a WebSocket or CDP client, an MCP client) can use the port.

Blocking sockets and threads, not the event loop: a forward keeps working while the caller's loop is busy
or blocked (a sync browser driver in the same process), and the sync and async SDKs share it. The bytes
are relayed as they are, with half-close, the way the agent relays them (agent/relay.py)."""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlsplit

from orchard.core.errors import (AuthError, InvalidRequest, OrchardError, PortClosed, SandboxLost,
                                 error_from_code)
from orchard.sandbox.agent.relay import relay

UPGRADE = "orchard-tcp"
UPGRADE_FD = "orchard-fd"  # on a Unix socket: the agent hands over the connected socket itself
UPGRADE_ATTACH = "orchard-attach"
CONNECT_TIMEOUT_S = 10.0
HANDSHAKE_TIMEOUT_S = 30.0  # the agent dials the port (its own connect timeout is 10 s) before it answers
MAX_HEAD_BYTES = 64 << 10
MAX_ERROR_BODY = 1 << 20
_BY_STATUS: dict[int, type[OrchardError]] = {400: InvalidRequest, 401: AuthError, 502: PortClosed}


def check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidRequest(f"port {port!r} is not a TCP port number (1-65535)")
    return port


def connect_port(agent_url: str, token: str, port: int, sandbox_id: str = "") -> socket.socket:
    """A connected blocking socket to `port` inside the sandbox: what is sent on it reaches the port, and
    what the port sends comes back. PortClosed when nothing listens there, AuthError for a wrong token,
    SandboxLost when the agent cannot be reached."""
    check_port(port)
    return _upgraded(agent_url, token, "GET", f"/ports/{port}", [UPGRADE_FD, UPGRADE], b"", f"port {port}",
                     sandbox_id)


def connect_attached(agent_url: str, token: str, request: bytes, sandbox_id: str = "") -> socket.socket:
    """A connected blocking socket to a command started in the sandbox (`request`: an ExecRequest's JSON):
    what is sent on it is the command's stdin, its stdout comes back (the agent's `POST /exec/attach`)."""
    return _upgraded(agent_url, token, "POST", "/exec/attach", [UPGRADE_ATTACH], request, "an attached command",
                     sandbox_id)


def _upgraded(agent_url: str, token: str, method: str, path: str, offers: list[str], body: bytes, what: str,
              sandbox_id: str) -> socket.socket:
    sock = _dial_agent(agent_url, sandbox_id)
    handed: list[socket.socket] = []
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        if sock.family != socket.AF_UNIX:
            offers = [offer for offer in offers if offer != UPGRADE_FD]
        framing = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else ""
        sock.sendall((f"{method} {path} HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {token}\r\n"
                      f"Connection: Upgrade\r\nUpgrade: {', '.join(offers)}\r\n{framing}\r\n").encode("latin-1")
                     + body)
        status, headers, rest = _read_head(sock, handed)
        if status != 101:
            raise _refusal(sock, status, headers, rest, what, sandbox_id)
        if rest:  # the agent sends nothing of the stream's before 101; anything here would be lost
            raise OrchardError(f"the agent of sandbox {sandbox_id} sent data before switching to {what}")
        if headers.get("upgrade", "").lower() == UPGRADE_FD:
            if not handed:
                raise OrchardError(f"the agent of sandbox {sandbox_id} answered {UPGRADE_FD} without a socket")
            sock.close()
            sock = handed.pop()
        sock.settimeout(None)
        return sock
    except BaseException as exc:
        sock.close()
        for extra in handed:
            extra.close()
        if isinstance(exc, OSError) and not isinstance(exc, OrchardError):
            raise SandboxLost(f"the agent of sandbox {sandbox_id} broke off opening {what}: {exc}") from exc
        raise


def _dial_agent(agent_url: str, sandbox_id: str) -> socket.socket:
    if agent_url.startswith("unix:"):
        path = agent_url[len("unix:"):]
        family, address = socket.AF_UNIX, path[2:] if path.startswith("//") else path
    elif agent_url.startswith("http://"):
        parts = urlsplit(agent_url)
        family = socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET
        address = (parts.hostname, parts.port or 80)
    else:
        raise InvalidRequest(f"ports need an agent at unix:///path.sock or http://host:port, not {agent_url!r}")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(address)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        sock.close()
        raise SandboxLost(f"cannot reach the agent of sandbox {sandbox_id} at {agent_url}: {exc}") from exc
    return sock


def _read_head(sock: socket.socket, handed: list[socket.socket]) -> tuple[int, dict[str, str], bytes]:
    """(status, headers by lower-case name, bytes after the head) of the agent's answer; a socket the agent
    handed over with it (SCM_RIGHTS, on a Unix socket) is appended to `handed`."""
    data = b""
    while b"\r\n\r\n" not in data:
        if sock.family == socket.AF_UNIX:
            chunk, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            handed.extend(socket.socket(fileno=fd) for fd in fds)
        else:
            chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the connection closed before an answer")
        data += chunk
        if len(data) > MAX_HEAD_BYTES:
            raise OSError("the answer's head is over 64 KiB")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise OSError(f"not an HTTP answer: {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


def _refusal(sock: socket.socket, status: int, headers: dict[str, str], body: bytes, what: str,
             sandbox_id: str) -> OrchardError:
    """The typed error of the agent's JSON answer."""
    length = min(int(headers.get("content-length") or 0), MAX_ERROR_BODY)
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            break
        body += chunk
    try:
        answer = json.loads(body[:length] or b"{}")
        code, message = answer.get("error", ""), answer.get("message", "")
    except (ValueError, AttributeError):
        code, message = "", body[:200].decode("utf-8", "replace")
    message = message or f"the agent answered {status}"
    if code in ("", "error", "invalid_request") and status in _BY_STATUS:
        return _BY_STATUS[status](f"{what} of sandbox {sandbox_id}: {message}")
    return error_from_code(code, f"{what} of sandbox {sandbox_id}: {message}")


class PortForward:
    """A local address (`host`, `port`; default 127.0.0.1 and a free port) whose connections reach `port`
    inside a sandbox, each through a connection of its own to the agent. Close it (or the sandbox client
    it came from) to stop listening; connections relayed at that moment are cut. A connection the agent
    refuses (nothing listens yet, the sandbox is gone) is closed at once, and its error kept as
    `last_error`."""

    def __init__(self, agent_url: str, token: str, remote_port: int, *, sandbox_id: str = "",
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.remote_port = check_port(remote_port)
        self._agent = (agent_url, token, sandbox_id)
        self.last_error: OrchardError | None = None
        self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
        except OSError as exc:
            self._listener.close()
            raise InvalidRequest(f"cannot listen on {host}:{port} to forward port {remote_port}: {exc}") from exc
        self.host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept_loop, name=f"orchard-forward-{remote_port}", daemon=True).start()

    @property
    def address(self) -> str:
        """`host:port`, as most clients take it (`[::1]:port` for IPv6)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def url(self, scheme: str = "http", path: str = "") -> str:
        return f"{scheme}://{self.address}{path}"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            open_now, self._open = list(self._open), set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self._listener.close()
        for sock in open_now:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"PortForward({self.address} -> sandbox port {self.remote_port}, {state})"

    def _accept_loop(self) -> None:
        while True:
            try:
                local, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(local,), name=f"orchard-forward-{self.remote_port}",
                             daemon=True).start()

    def _serve(self, local: socket.socket) -> None:
        remote = None
        try:
            local.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                remote = connect_port(*self._agent[:2], self.remote_port, self._agent[2])
            except OrchardError as exc:
                self.last_error = exc
                return
            if not self._track(local, remote):
                return
            relay(local.recv, local, remote, f"orchard-forward-{self.remote_port}")
        finally:
            with self._lock:
                self._open.discard(local)
                if remote is not None:
                    self._open.discard(remote)
            local.close()
            if remote is not None:
                remote.close()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.update(socks)
            return True
