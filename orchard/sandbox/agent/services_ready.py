"""`POST /services/wait`: wait until services are ready (docs/agent-protocol.md, "Services"). A service is
ready once its declared port listens (read from the kernel, without connecting) and then its health check
answers 2xx to one GET; a service that declared neither is ready once started. The agent checks this
itself, inside the sandbox, every POLL_S: a client asks once, instead of polling over HTTP while the
services compete with it for the CPU as they start.

The answer comes when every service asked for is ready, when one of them has ended (ready or not), or at
the timeout (at most MAX_WAIT_S; ask again to wait longer): each service's status, with `ready` and, for
one not ready, `not_ready` (why not yet)."""

from __future__ import annotations

import socket
import time

from . import fields, ports, services
from .wire import bad_request

POLL_S = 0.002
MAX_WAIT_S = 60.0
CHECK_TIMEOUT_S = 5.0
WAIT_FIELDS = ("names", "timeout")


def handle_wait(req) -> dict:
    body = req.json()
    fields.reject_unknown(body, WAIT_FIELDS, "a services wait")
    names = body.get("names")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise bad_request("names must be a list of service names, or null for all of them")
    timeout = fields.timeout(body)
    chosen = services.chosen(names)
    end = time.monotonic() + min(timeout or MAX_WAIT_S, MAX_WAIT_S)
    while True:
        pending = [s for s in chosen if not s.ready and s.proc.poll() is None]
        if pending:
            listening = ports.listening() if any(s.port for s in pending) else set()
            for service in pending:
                _check(service, listening)
        done = all(s.ready for s in chosen) or any(s.proc.poll() is not None for s in chosen)
        if done or time.monotonic() >= end:
            return {"services": [s.status() for s in chosen]}
        time.sleep(POLL_S)


def _check(service, listening: set) -> None:
    if service.port is not None and service.port not in listening:
        service.not_ready = "nothing listens on port %d" % service.port
    elif service.health_check is not None:
        service.not_ready = _health(service.port, service.health_check)
        service.ready = service.not_ready is None
    else:
        service.ready = True


def _health(port: int, path: str):
    """None when `GET path` answers 2xx on the port (127.0.0.1, else ::1), else why not."""
    failed = None
    for family, address in ports.LOOPBACKS:
        # Not create_connection: its getaddrinfo needs the idna codec, which a sandbox's Python may lack.
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(CHECK_TIMEOUT_S)
            try:
                sock.connect((address, port))
            except OSError as exc:
                failed = failed or exc
                continue
            try:
                host = "[%s]" % address if ":" in address else address
                sock.sendall(("GET %s HTTP/1.0\r\nHost: %s:%d\r\n\r\n" % (path, host, port)).encode())
                status_line = sock.makefile("rb").readline(200)
            except OSError as exc:
                return "GET %s failed: %s" % (path, exc.strerror or exc or type(exc).__name__)
        parts = status_line.split()
        if len(parts) >= 2 and parts[1][:1] == b"2":
            return None
        return "GET %s answered %r" % (path, status_line.decode("latin-1").strip()[:80])
    return "GET %s failed: %s" % (path, failed.strerror or failed)
