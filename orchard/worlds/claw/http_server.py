"""A Claw service's HTTP API (docs/claw.md): HTTP/1.1 on a plain socket, a thread per connection, rather than
http.server, whose import (http.client, most of email) would double a service's start: every trial's
environment phase waits for it.

    GET  /health          {"ok": true, "service": NAME}
    GET  /                the service's description and its actions
    GET  /tools           the actions as MCP tools (name, description, inputSchema)
    GET  /state           the whole state (what graders check)
    GET  /audit           {"calls": [...]}: every action called, in order, with its arguments and answer
    POST /reset           back to the seed, the audit emptied (needs the admin token of the state directory)
    POST /<action>        a JSON object of arguments -> 200 and the action's result, or 4xx/5xx and
                          {"error": "..."}

Only `POST /<action>` is audited and only it meets injected faults. Standard library only."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

from .base import Service, clone
from .http_client import VIA_HEADER

ADMIN_TOKEN_FILE = "admin.token"  # /reset needs it: only the services' user (a grader) can read it
ADMIN_HEADER = "X-Claw-Admin"
MAX_BODY = 4 << 20

MAX_LINE = 65536
MAX_HEADERS = 100
REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           413: "Content Too Large", 429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
           503: "Service Unavailable"}


class Handler:
    """One connection: its requests, one after the other, while the client keeps it open."""

    def __init__(self, connection: socket.socket, service: Service, admin_token: str) -> None:
        self.connection, self.service, self.admin_token = connection, service, admin_token
        self.rfile = connection.makefile("rb")

    def handle(self) -> None:
        try:
            while self._one_request():
                pass
        except (ConnectionError, TimeoutError, OSError):
            pass
        finally:
            self.rfile.close()
            self.connection.close()

    def _one_request(self) -> bool:
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._answer(400, {"error": "not an HTTP request"}, close=True)
            return False
        method, target, version = parts
        headers = {}
        for _ in range(MAX_HEADERS + 1):
            raw = self.rfile.readline(MAX_LINE + 1)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            self._answer(400, {"error": "too many header fields"}, close=True)
            return False
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        if headers.get("transfer-encoding"):
            self._answer(400, {"error": "send the body with a Content-Length"}, close=True)
            return False
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._answer(413, {"error": f"a request body is at most {MAX_BODY} bytes, with a Content-Length"},
                         close=True)
            return False
        body = self.rfile.read(length) if length else b""
        path = target.split("?", 1)[0].rstrip("/") or "/"
        if method in ("GET", "HEAD"):
            status, answer, extra = self._get(path, headers)
        elif method == "POST":
            status, answer, extra = self._post(path, headers, body)
        else:
            status, answer, extra = 405, {"error": "GET or POST"}, {}
        self._answer(status, answer, extra, close=not keep, head=method == "HEAD")
        return keep

    def _get(self, path: str, headers: dict):
        service = self.service
        if path == "/state" and service.private_state and headers.get(ADMIN_HEADER.lower(), "") != self.admin_token:
            return 403, {"error": f"the {service.name} service's state is the grader's: act and look through its "
                                  "tools (GET /tools)"}, {}
        if path == "/health":
            return 200, {"ok": True, "service": service.name}, {}
        if path == "/":
            return 200, service.describe(), {}
        if path == "/tools":
            return 200, {"tools": service.tools()}, {}
        with service.lock:
            if path == "/state":
                return 200, clone(service.state), {}
            if path == "/audit":
                return 200, {"service": service.name, "calls": list(service.calls)}, {}
        return 404, {"error": f"no GET {path}: GET /, /health, /tools, /state or /audit; actions are "
                              "POST /<action>"}, {}

    def _post(self, path: str, headers: dict, body: bytes):
        service = self.service
        if path == "/reset":
            if headers.get(ADMIN_HEADER.lower(), "") != self.admin_token:
                return 403, {"error": "reset needs the admin token (the grader's, not the agent's)"}, {}
            service.reset()
            return 200, {"reset": True}, {}
        try:
            arguments = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            return 400, {"error": f"the body must be a JSON object of arguments: {exc}"}, {}
        via = headers.get(VIA_HEADER.lower()) or "http"
        status, answer = service.call(path.lstrip("/"), arguments, via=via if via in ("mcp", "http") else "http")
        sys.stderr.write(f"claw {service.name}: POST {path} {status}\n")
        return status, answer, ({"Retry-After": "1"} if status in (429, 503) else {})

    def _answer(self, status: int, body, headers: dict | None = None, close: bool = False,
                head: bool = False) -> None:
        data = json.dumps(body, indent=1).encode() + b"\n"
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", "Content-Type: application/json",
                 f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        if close:
            lines.append("Connection: close")
        self.connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else data))


def serve(service: Service, port: int, host: str = "127.0.0.1") -> None:
    """Answer HTTP on `port` until killed. The admin token is written to the state directory first."""
    token = os.urandom(16).hex()
    if service.state_dir:
        path = os.path.join(service.state_dir, ADMIN_TOKEN_FILE)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(token)
        service.save()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    print(f"claw {service.name} listening on http://{host}:{port}", flush=True)
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=Handler(connection, service, token).handle, daemon=True).start()
