"""The model gateway's forwarder (`--gateway unix:PATH|tcp:HOST:PORT`): listens on 127.0.0.1:4000 in the
sandbox's own network namespace and relays every connection, bytes both ways, to the orchestrator's model
gateway, so a harness inside reaches it at one fixed URL on every backend while the sandbox has no other
route out (the local backend binds the gateway's Unix socket in; Kubernetes allows only the gateway's
address).

It knows nothing of HTTP: streamed responses (SSE) pass through as the gateway writes them, two threads
per connection (relay.py)."""

from __future__ import annotations

import socket
import sys
import threading

from .relay import CHUNK, relay

LISTEN_HOST = "127.0.0.1"
LISTEN_PORT = 4000
# Connections relayed at once; past this a new one is closed at once. A harness makes a handful; each one
# costs the agent two threads, which count against the sandbox's process limit like the workload's own, so
# a workload opening connections by the hundred must not be able to starve its agent of threads.
MAX_PAIRS = 32
CONNECT_TIMEOUT_S = 10.0
REFUSE_LINGER_S = 2.0


def parse_target(text: str):
    """(family, address) of `unix:PATH` or `tcp:HOST:PORT`; ValueError for anything else."""
    kind, _, rest = text.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        if host and port.isdigit() and 0 < int(port) < 65536:
            return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))
    raise ValueError("the gateway must be unix:PATH or tcp:HOST:PORT, not %r" % text)


class Forwarder:
    def __init__(self, target: str, host: str = LISTEN_HOST, port: int = LISTEN_PORT) -> None:
        self.family, self.address = parse_target(target)
        self.target = target
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((host, port))
            self.listener.listen(128)
        except OSError:
            self.listener.close()
            raise
        self.port = self.listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_PAIRS)

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="gateway-forwarder", daemon=True).start()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self.listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                client.close()
                continue
            try:
                threading.Thread(target=self._relay, args=(client,), name="gateway-relay", daemon=True).start()
            except RuntimeError:  # no thread to be had
                self._slots.release()
                client.close()

    def _connect(self) -> socket.socket:
        upstream = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            upstream.settimeout(CONNECT_TIMEOUT_S)
            upstream.connect(self.address)
            upstream.settimeout(None)
            if self.family != socket.AF_UNIX:
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            upstream.close()
            raise
        return upstream

    def _relay(self, client: socket.socket) -> None:
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small SSE events go out at once
            try:
                upstream = self._connect()
            except OSError as exc:
                _refuse(client, "the model gateway (%s) is unreachable from the sandbox: %s" % (self.target, exc))
                return
            try:
                relay(client.recv, client, upstream, "gateway-relay")
            finally:
                upstream.close()
        except Exception as exc:  # noqa: BLE001 — one connection's failure must not end the agent
            sys.stderr.write("orchard-agent: gateway relay: %r\n" % (exc,))
        finally:
            client.close()
            self._slots.release()


def _refuse(client: socket.socket, message: str) -> None:
    """Tell an HTTP client why (it is one: the gateway speaks only HTTP) rather than just closing."""
    body = ('{"error": "gateway_unreachable", "message": "%s"}'
            % message.replace("\\", "\\\\").replace('"', '\\"')).encode()
    head = ("HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n" % len(body)).encode()
    try:
        client.sendall(head + body)
        # Read what the client still sends before closing: closing with unread data resets the connection,
        # and the client would see the reset instead of this answer.
        client.shutdown(socket.SHUT_WR)
        client.settimeout(REFUSE_LINGER_S)
        while client.recv(CHUNK):
            pass
    except OSError:
        pass
