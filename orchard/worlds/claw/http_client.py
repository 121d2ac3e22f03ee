"""The few HTTP/1.1 requests the MCP proxy and the grader make to a Claw service on loopback, on a plain
socket: urllib would import http.client and most of email, several times what the rest of them takes to
start. Standard library only."""

from __future__ import annotations

import json
import socket

VIA_HEADER = "X-Claw-Via"  # "mcp" from the MCP proxy; informational only


class HttpError(OSError):
    """The service could not be reached or did not answer HTTP."""


def split_url(url: str) -> tuple:
    """(host, port, path) of `http://host[:port][/path]` (urllib.parse's import would cost more than this)."""
    if not url.startswith("http://"):
        raise HttpError(f"{url!r} is not an http:// URL")
    netloc, _, path = url[len("http://"):].partition("/")
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "80")
    if not port.isdigit():
        raise HttpError(f"{url!r} has no valid port")
    return host, int(port), "/" + path


def request(url: str, method: str = "GET", body=None, headers: dict | None = None, timeout: float = 120) -> tuple:
    """(status, the answer's JSON) of one request to `url` (http only)."""
    host, port, path = split_url(url)
    data = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
            "Content-Type: application/json", f"Content-Length: {len(data)}",
            *(f"{k}: {v}" for k, v in (headers or {}).items())]
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        raise HttpError(f"{method} {url}: {exc}") from None
    raw = b"".join(chunks)
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    status_line = head_bytes.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise HttpError(f"{method} {url}: the answer is not HTTP: {raw[:80]!r}")
    try:
        answer = json.loads(payload) if payload.strip() else None
    except ValueError:
        answer = {"error": payload[:300].decode("utf-8", "replace")}
    return int(status_line[1]), answer
