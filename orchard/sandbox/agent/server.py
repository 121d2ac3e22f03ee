"""The agent's HTTP/1.1 server: a threaded `socketserver` server on a Unix socket or TCP, keep-alive
connections, bearer-token auth, routing to the endpoint handlers, and JSON error bodies for every failure.
Request heads are read by http1.py; bodies and responses are wire.py's. The handler and the three ways the
agent listens (TCP, a Unix socket, a socket its launcher bound) share one server base here, a little over
~400 lines: the agent is standard library only, and this is all of its serving."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import socketserver
import stat
import threading
import time

from . import VERSION, attach, claim, execs, files, http1, pidns, ports, services, sessions, stats, tars
from . import services_ready, workload_cgroup
from .wire import ApiError, Request, log_error, unquote

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # the writable layer (disk_mb) or a quota is used up

try:
    # The constant-time comparison hmac.compare_digest falls back to; importing hmac itself would load
    # hashlib and its digests, a millisecond of every sandbox's start.
    from _operator import _compare_digest as compare_digest
except ImportError:  # another Python implementation
    from hmac import compare_digest

# How much of a body a handler left unread is drained so the connection can be reused; more than this and
# the connection is closed after the response instead.
DRAIN_LIMIT = 1 << 20
# After an error response to a client still sending a big body: how long to keep reading (and dropping) it,
# so the client gets to read the response instead of a connection reset.
LINGER_S = 2.0
# Connections: at most this many at once (each is a thread). At the limit, a new one evicts the oldest that
# has not yet made an authorized request, so idle connections without the token cannot lock clients out.
MAX_CONNECTIONS = 256
# How long a new connection at the limit waits for the thread of the one it evicted to end (it sees the end
# of input at once: a thread without the token never waits on anything else); past this it is closed.
EVICTION_WAIT_S = 5.0
# How long a connection may keep the agent waiting (for a request head, a body, a read of its response)
# before it is closed: briefly until it has made an authorized request, longer once it has (clients keep
# idle connections for a few seconds; httpx: 5 s).
UNAUTHENTICATED_TIMEOUT_S = 10.0
AUTHENTICATED_TIMEOUT_S = 120.0


def health(req) -> dict:
    return {"status": "ok", "version": VERSION, "pid": os.getpid(), "workload_pid_namespace": pidns.health(),
            "workload_cgroup": workload_cgroup.health()}


EXACT_ROUTES = {
    ("GET", "/health"): health,
    ("GET", "/stats"): stats.handle_stats,
    ("POST", "/claim"): claim.handle_claim,
    ("POST", "/exec"): execs.handle_exec,
    ("POST", "/exec/stream"): execs.handle_exec_stream,
    ("POST", "/exec/attach"): attach.handle_attach,
    ("GET", "/sessions"): sessions.handle_list,
    ("POST", "/sessions"): sessions.handle_create,
    ("GET", "/files"): files.handle_read,
    ("PUT", "/files"): files.handle_write,
    ("DELETE", "/files"): files.handle_delete,
    ("GET", "/files/stat"): files.handle_stat,
    ("GET", "/files/list"): files.handle_list,
    ("GET", "/tar"): tars.handle_download,
    ("GET", "/ports"): ports.handle_list,
    ("GET", "/services"): services.handle_list,
    ("POST", "/services"): services.handle_start,
    ("POST", "/services/exec"): services.handle_exec,
    ("POST", "/services/wait"): services_ready.handle_wait,
    ("PUT", "/tar"): tars.handle_upload,
}
PATTERN_ROUTES = [
    ("POST", re.compile(r"^/sessions/([^/]+)/run$"), sessions.handle_run),
    ("POST", re.compile(r"^/sessions/([^/]+)/interrupt$"), sessions.handle_interrupt),
    ("DELETE", re.compile(r"^/sessions/([^/]+)$"), sessions.handle_delete),
    ("GET", re.compile(r"^/ports/([^/]+)$"), ports.handle_connect),
]
# Methods some endpoint has; any other is refused before auth and routing.
METHODS = frozenset(method for method, _ in EXACT_ROUTES) | {method for method, _, _ in PATTERN_ROUTES}


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


class AgentHandler(socketserver.StreamRequestHandler):
    """One connection: its requests are read and answered in turn while the client keeps it alive. Each
    response is one socket write (wire.Request), so no TCP delay is ever waited for."""

    def setup(self):
        # TCP_NODELAY: streamed responses are several writes, and Nagle would hold each back ~40 ms.
        self.disable_nagle_algorithm = self.server.address_family != socket.AF_UNIX
        self.authenticated = False
        self.request.settimeout(UNAUTHENTICATED_TIMEOUT_S)
        super().setup()

    def handle(self):
        self.close_connection = False
        while not self.close_connection:
            self._serve_one()

    def _serve_one(self):
        self.close_connection = True  # unless the request proves the connection can carry another
        try:
            head = http1.read_head(self.rfile)
        except http1.HeadError as exc:
            self._refuse(exc.status, exc.message)
            return
        except OSError:  # reset by the client: nobody to answer
            return
        if head is None:
            return
        self.command, self.path, self.headers = head.method, head.target, head.headers
        self.close_connection = not head.keep_alive
        if self.command not in METHODS:  # a method no endpoint has (PATCH, HEAD, ...)
            self._refuse(405, "method %s is not supported by any endpoint; see docs/agent-protocol.md"
                         % self.command)
            return
        if head.expects_continue:
            try:
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            except OSError:
                self.close_connection = True
                return
        self._dispatch()

    def _refuse(self, status: int, message: str):
        """Answer a request refused before routing, and close the connection (what follows on it cannot
        be told apart from the rest of this request)."""
        self.close_connection = True
        body = json.dumps({"error": "invalid_request" if status < 500 else "error",
                           "message": message}).encode("utf-8")
        try:
            self.wfile.write(("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                              "Connection: close\r\n\r\n" % (status, http1.REASONS.get(status, ""), len(body))
                              ).encode("latin-1") + body)
        except OSError:
            return
        self._linger()

    def _authorize(self):
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        expected = self.server.context.token.encode("utf-8")
        if not (scheme.lower() == "bearer"
                and compare_digest(token.strip().encode("utf-8", "replace"), expected)):
            raise ApiError(401, "unauthorized",
                           "missing or wrong token: send 'Authorization: Bearer <token>' with the token of "
                           "this sandbox")
        if not self.authenticated:
            self.authenticated = True
            self.connection.settimeout(AUTHENTICATED_TIMEOUT_S)
            self.server.mark_authenticated(self.request)

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
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                error = self._failed(path, exc)
            else:  # the handlers remove what they half-wrote, so nothing of the request is left
                error = ApiError(507, "disk_full", "the sandbox's disk is full (%s): nothing of this %s %s was "
                                 "kept; delete files in the sandbox, or create it with a larger disk_mb"
                                 % (os.strerror(exc.errno), self.command, path))
        except Exception as exc:
            error = self._failed(path, exc)
        self._answer_error(req, error)

    def _failed(self, path: str, exc: Exception) -> ApiError:
        log_error("%s %s failed" % (self.command, path))
        return ApiError(500, "error", "the agent failed on %s %s: %s: %s"
                        % (self.command, path, type(exc).__name__, exc))

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


class _AgentServerBase(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True  # a stuck connection never keeps the agent from exiting
    block_on_close = False
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address, context):
        self.context = context
        self.track_connections()
        super().__init__(address, AgentHandler)

    def track_connections(self):
        # socket -> its _Connection, in the order accepted. A connection is counted until its thread has
        # ended, not until its socket is closed: the limit bounds the agent's threads.
        self.connections = {}
        self.connections_lock = threading.Lock()

    def process_request(self, request, client_address):
        if not self._make_room():
            request.close()
            return
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  daemon=self.daemon_threads)
        with self.connections_lock:
            self.connections[request] = _Connection(thread)
        try:
            thread.start()
        except BaseException:  # no thread (the process is out of them): nothing to count; the caller closes it
            with self.connections_lock:
                self.connections.pop(request, None)
            raise

    def _make_room(self) -> bool:
        """Whether fewer than MAX_CONNECTIONS connection threads are alive, once the oldest connection
        without an authorized request, if any, has been shut down and its thread has ended. Only the
        accepting thread adds connections, so the room it makes stays free for the newcomer."""
        deadline = time.monotonic() + EVICTION_WAIT_S
        while True:
            with self.connections_lock:
                if len(self.connections) < MAX_CONNECTIONS:
                    return True
                for conn, entry in list(self.connections.items()):
                    if not entry.thread.is_alive():  # ended (only this thread adds connections and starts them)
                        del self.connections[conn]
                if len(self.connections) < MAX_CONNECTIONS:
                    return True
                # A thread already ending (closed, or evicted earlier) is waited for before evicting another.
                waited = next((entry for entry in self.connections.values() if entry.ending), None)
                if waited is None:
                    victim = next((conn for conn, entry in self.connections.items() if not entry.authorized),
                                  None)
                    if victim is None:  # every one is a client's: the newcomer waits for none of them
                        return False
                    waited = self.connections[victim]
                    waited.ending = True
                    try:
                        victim.shutdown(socket.SHUT_RDWR)  # its thread sees the end of input and finishes
                    except OSError:
                        pass
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            waited.thread.join(left)

    def mark_authenticated(self, request):
        with self.connections_lock:
            entry = self.connections.get(request)
            if entry is not None:
                entry.authorized = True

    after_first_request = None  # called once, when the first connection has been answered and closed

    def shutdown_request(self, request):
        with self.connections_lock:
            entry = self.connections.get(request)
            if entry is not None:
                entry.ending = True  # counted until its thread has ended (_make_room)
            hook, self.after_first_request = self.after_first_request, None
        super().shutdown_request(request)
        if hook is not None:
            hook()


class _Connection:
    """A connection's thread and its state: authorized once it has made an authorized request (it is then
    never evicted), ending once it is shut down (evicted) or closed and its thread finishing."""

    __slots__ = ("thread", "authorized", "ending")

    def __init__(self, thread: threading.Thread):
        self.thread, self.authorized, self.ending = thread, False, False


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


class InheritedAgentServer(_AgentServerBase):
    """A server on a listening socket the agent was started with (fd N): the local backend binds the
    socket outside the sandbox, where the sandbox cannot reach, swap or fill the directory it lies in."""

    def __init__(self, fd: int, context):
        sock = socket.socket(fileno=fd)
        if sock.type != socket.SOCK_STREAM:
            raise ValueError("fd %d is not a stream socket" % fd)
        self.address_family = sock.family
        self.context = context
        self.track_connections()
        # TCPServer.__init__ would make and bind a socket of its own: only the base part is wanted.
        socketserver.BaseServer.__init__(self, sock.getsockname(), AgentHandler)
        self.socket = sock
        self.fd = fd

    @property
    def address_text(self) -> str:
        return "fd:%d" % self.fd


def make_server(listen: str, context):
    """A server for `unix:PATH`, `tcp:HOST:PORT` (port 0 picks a free one) or `fd:N` (an inherited
    socket that is already listening)."""
    kind, _, rest = listen.partition(":")
    if kind == "unix" and rest:
        server = UnixAgentServer(os.path.abspath(rest), context)
    elif kind == "fd" and rest.isdigit():
        server = InheritedAgentServer(int(rest), context)
    elif kind == "tcp" and ":" in rest:
        host, _, port = rest.rpartition(":")
        try:
            port_number = int(port)
        except ValueError:
            raise ValueError("bad port %r in --listen %s" % (port, listen))
        server = TCPAgentServer(host.strip("[]") or "0.0.0.0", port_number, context)
    else:
        raise ValueError("--listen must be unix:PATH, tcp:HOST:PORT or fd:N, not %r" % listen)
    context.sessions = sessions.SessionRegistry(context)
    return server
