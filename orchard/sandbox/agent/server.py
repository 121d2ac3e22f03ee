"""The agent's HTTP/1.1 server: a threaded stdlib server on a Unix socket or TCP, keep-alive connections,
bearer-token auth, routing to the endpoint handlers, and JSON error bodies for every failure."""

from __future__ import annotations

import hmac
import json
import os
import re
import socket
import socketserver
import stat
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from . import VERSION, execs, files, sessions, tars
from .wire import ApiError, Request, log_error

# How much of a body a handler left unread is drained so the connection can be reused; more than this and
# the connection is closed after the response instead.
DRAIN_LIMIT = 1 << 20
# After an error response to a client still sending a big body: how long to keep reading (and dropping) it,
# so the client gets to read the response instead of a connection reset.
LINGER_S = 2.0


def health(req) -> dict:
    return {"status": "ok", "version": VERSION, "pid": os.getpid()}


EXACT_ROUTES = {
    ("GET", "/health"): health,
    ("POST", "/exec"): execs.handle_exec,
    ("POST", "/exec/stream"): execs.handle_exec_stream,
    ("GET", "/sessions"): sessions.handle_list,
    ("POST", "/sessions"): sessions.handle_create,
    ("GET", "/files"): files.handle_read,
    ("PUT", "/files"): files.handle_write,
    ("DELETE", "/files"): files.handle_delete,
    ("GET", "/files/stat"): files.handle_stat,
    ("GET", "/files/list"): files.handle_list,
    ("GET", "/tar"): tars.handle_download,
    ("PUT", "/tar"): tars.handle_upload,
}
PATTERN_ROUTES = [
    ("POST", re.compile(r"^/sessions/([^/]+)/run$"), sessions.handle_run),
    ("POST", re.compile(r"^/sessions/([^/]+)/interrupt$"), sessions.handle_interrupt),
    ("DELETE", re.compile(r"^/sessions/([^/]+)$"), sessions.handle_delete),
]


def route(method: str, path: str):
    """(handler, path arguments) for a request, or an ApiError (404 unknown path, 405 wrong method)."""
    handler = EXACT_ROUTES.get((method, path))
    if handler is not None:
        return handler, ()
    allowed = sorted(m for m, p in EXACT_ROUTES if p == path)
    for route_method, pattern, handler in PATTERN_ROUTES:
        match = pattern.match(path)
        if match:
            if route_method == method:
                return handler, tuple(unquote(g) for g in match.groups())
            allowed.append(route_method)
    if allowed:
        raise ApiError(405, "invalid_request", "%s %s is not supported; use %s %s"
                       % (method, path, " or ".join(allowed), path))
    raise ApiError(404, "not_found", "no endpoint %s %s; see docs/agent-protocol.md for the endpoints"
                   % (method, path))


class AgentHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests
    server_version = "orchard-agent/" + VERSION

    def setup(self):
        # TCP_NODELAY: streamed responses are several writes, and Nagle would hold each back ~40 ms.
        self.disable_nagle_algorithm = self.server.address_family != socket.AF_UNIX
        super().setup()

    def log_message(self, format, *args):
        pass  # no per-request logging: it costs latency; errors go to stderr via log_error

    def send_error(self, code, message=None, explain=None):
        """Protocol-level failures found by http.server itself (bad request line, unknown method)."""
        if code == 501:  # a method no endpoint has (PATCH, HEAD, ...)
            code, message = 405, "method %s is not supported by any endpoint" % self.command
        body = json.dumps({"error": "invalid_request" if code < 500 else "error",
                           "message": message or self.responses.get(code, ("",))[0]}).encode()
        self.close_connection = True
        try:
            self.wfile.write(("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                              "Connection: close\r\n\r\n" % (code, self.responses.get(code, ("",))[0],
                                                             len(body))).encode("latin-1") + body)
        except OSError:
            pass

    def _authorize(self):
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        expected = self.server.context.token.encode("utf-8")
        if not (scheme.lower() == "bearer"
                and hmac.compare_digest(token.strip().encode("utf-8", "replace"), expected)):
            raise ApiError(401, "unauthorized",
                           "missing or wrong token: send 'Authorization: Bearer <token>' with the token of "
                           "this sandbox")

    def _dispatch(self):
        path, _, query = self.path.partition("?")
        req = Request(self, self.command, path, query, self.server.context)
        try:
            if not (self.command == "GET" and path == "/health"):
                self._authorize()
            handler, args = route(self.command, path)
            result = handler(req, *args)
            if result is not None:
                req.send_json(result)
            if not self._body_finished(req):
                self.close_connection = True
            return
        except ApiError as exc:
            error = exc
        except PermissionError as exc:
            error = ApiError(400, "invalid_request", "permission denied: %s (the agent runs as uid %d)"
                             % (exc.filename or exc, os.getuid()))
        except ConnectionError:
            self.close_connection = True  # the client went away; nothing to answer
            return
        except Exception as exc:
            log_error("%s %s failed" % (self.command, path))
            error = ApiError(500, "error", "the agent failed on %s %s: %s: %s"
                             % (self.command, path, type(exc).__name__, exc))
        self._answer_error(req, error)

    do_GET = do_POST = do_PUT = do_DELETE = _dispatch

    def _body_finished(self, req: Request) -> bool:
        try:
            body = req.body()
        except ApiError:
            return False
        return body.finished or body.drain(DRAIN_LIMIT)

    def _answer_error(self, req: Request, error: ApiError):
        if req.responded:  # failed mid-stream: cut the connection so the client sees an incomplete body
            self.close_connection = True
            return
        body_left = not self._body_finished(req)
        if body_left:
            self.close_connection = True
        try:
            req.send_error(error)
        except OSError:
            self.close_connection = True
            return
        if body_left:
            self._linger()

    def _linger(self):
        """Half-close, then read and drop the rest of the client's upload for a while, so that the error
        response is read rather than lost to a reset from unread data."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.5)
            end = time.monotonic() + LINGER_S
            while time.monotonic() < end and self.connection.recv(1 << 20):
                pass
        except OSError:
            pass


class _AgentServerBase(ThreadingHTTPServer):
    daemon_threads = True  # a stuck connection never keeps the agent from exiting
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address, context):
        self.context = context
        super().__init__(address, AgentHandler)

    def server_bind(self):
        # HTTPServer.server_bind resolves the host name (getfqdn), which can stall without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "agent", 0


class TCPAgentServer(_AgentServerBase):
    def __init__(self, host: str, port: int, context):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), context)

    @property
    def address_text(self) -> str:
        host, port = self.server_address[:2]
        return "tcp:%s:%d" % ("[%s]" % host if ":" in host else host, port)


class UnixAgentServer(_AgentServerBase):
    address_family = socket.AF_UNIX

    def __init__(self, path: str, context):
        if len(path.encode()) > 107:
            raise ValueError("Unix socket path %r is longer than the 107 bytes the kernel allows; use a "
                             "shorter one" % path)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # left by an agent that died; binding would fail on it
            else:
                raise ValueError("%s exists and is not a socket; pick another --listen path" % path)
        except FileNotFoundError:
            pass
        self.path = path
        super().__init__(path, context)

    @property
    def address_text(self) -> str:
        return "unix:" + self.path

    def server_close(self):
        super().server_close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def make_server(listen: str, context):
    """A server for `unix:PATH` or `tcp:HOST:PORT` (port 0 picks a free one)."""
    kind, _, rest = listen.partition(":")
    if kind == "unix" and rest:
        server = UnixAgentServer(os.path.abspath(rest), context)
    elif kind == "tcp" and ":" in rest:
        host, _, port = rest.rpartition(":")
        try:
            port_number = int(port)
        except ValueError:
            raise ValueError("bad port %r in --listen %s" % (port, listen))
        server = TCPAgentServer(host.strip("[]") or "0.0.0.0", port_number, context)
    else:
        raise ValueError("--listen must be unix:PATH or tcp:HOST:PORT, not %r" % listen)
    context.sessions = sessions.SessionRegistry(context)
    return server
