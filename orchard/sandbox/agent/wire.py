"""HTTP plumbing the route handlers share: typed API errors, request bodies (Content-Length or chunked,
size-capped), JSON and chunked/streamed responses, and the agent's shared context.

Every response is written with as few socket writes as possible: a response split into a header write and
a body write pays Nagle + delayed-ACK (~40 ms) on TCP connections."""

from __future__ import annotations

import json
import os
import sys

from .http1 import REASONS

JSON_TYPE = "application/json"
CHUNK = 1 << 20  # body read size: big enough for throughput, small enough for flat memory
# A chunk-size line of a chunked body: at most 16 hex digits (2**64 - 1), the line (extensions included)
# at most MAX_CHUNK_LINE bytes, at most MAX_TRAILERS trailer lines after the last chunk.
MAX_CHUNK_DIGITS = 16
MAX_CHUNK_LINE = 1024
MAX_TRAILERS = 100
HEX_DIGITS = b"0123456789abcdefABCDEF"
# Nesting of a JSON request body: no request has more than 2 levels (an object of lists or objects).
MAX_JSON_DEPTH = 32


class ApiError(Exception):
    """A failure reported to the client as `{"error": code, "message": message}` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def bad_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def too_large(message: str) -> ApiError:
    return ApiError(413, "too_large", message)


class AgentContext:
    """What every handler may need: the token, the default cwd, the environment children get, limits,
    and the registry of shell sessions (set by the server)."""

    def __init__(self, token: str, workdir: str, env: dict, max_body: int, max_json: int):
        self.token = token
        self.workdir = workdir
        self.env = env
        self.max_body = max_body
        self.max_json = max_json
        self.sessions = None  # a sessions.SessionRegistry, attached by the server
        # umask is process-wide and can only be read by setting it, so it is read once here, single-threaded
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def resolve(self, path, what: str = "path") -> str:
        """An absolute path; relative ones are under the workdir."""
        if not isinstance(path, str) or not path:
            raise bad_request("%s is required (a path inside the sandbox; relative ones are under %s)"
                              % (what, self.workdir))
        if "\x00" in path:
            raise bad_request("%s must not contain NUL bytes" % what)
        return os.path.normpath(os.path.join(self.workdir, path))


class Body:
    """A request body read in pieces, from `Content-Length` or chunked transfer encoding. Reading past
    `limit` bytes raises 413; `finished` says whether the connection can carry another request."""

    def __init__(self, rfile, headers, limit: int, limit_name: str = "ORCHARD_AGENT_MAX_BODY"):
        self._rfile = rfile
        self._limit = limit
        self._limit_name = limit_name
        self._total = 0
        self._chunk_left = 0
        self._broken = False  # a framing error was found: nothing more can be read from this body
        self.finished = False
        encoding = (headers.get("Transfer-Encoding") or "").lower()
        length = headers.get("Content-Length")
        self.chunked = "chunked" in encoding
        if self.chunked:
            self._left = None
        elif length is not None:
            if not (length.isdigit() and length.isascii()):  # int() would take "+5", " 5" or "1_0"
                self._left = 0
                raise bad_request("Content-Length %r is not a non-negative integer" % length)
            self._left = int(length)
            if self._left > limit:
                raise too_large("request body of %d bytes is over the agent's limit of %d bytes (%s); "
                                "send less or raise the limit" % (self._left, limit, limit_name))
        else:
            self._left = 0
        self.finished = not self.chunked and self._left == 0

    def read(self, size: int = CHUNK) -> bytes:
        """Up to `size` bytes (fewer near chunk boundaries); b"" at the end of the body."""
        if self.finished:
            return b""
        if self._broken:
            raise bad_request("the request body is malformed; nothing more of it is read")
        if size is None or size < 0:
            size = CHUNK
        if self.chunked:
            data = self._read_chunked(size)
        else:
            data = self._rfile.read(min(size, self._left))
            if not data:
                raise bad_request("request body ended after %d bytes, before its Content-Length"
                                  % self._total)
            self._left -= len(data)
            self.finished = self._left == 0
        self._total += len(data)
        if self._total > self._limit:
            raise too_large("request body is over the agent's limit of %d bytes (%s); send less or raise "
                            "the limit" % (self._limit, self._limit_name))
        return data

    def _read_chunked(self, size: int) -> bytes:
        try:
            return self._read_chunk(size)
        except ApiError:
            self._broken = True  # the stream position is unknown: never read on (drain included)
            raise

    def _read_chunk(self, size: int) -> bytes:
        if self._chunk_left == 0:
            self._chunk_left = self._chunk_size()
            if self._chunk_left == 0:
                for _ in range(MAX_TRAILERS + 1):
                    if self._rfile.readline(MAX_CHUNK_LINE + 2) in (b"\r\n", b"\n", b""):
                        break
                else:
                    raise bad_request("more than %d trailer lines after the last chunk" % MAX_TRAILERS)
                self.finished = True
                return b""
        data = self._rfile.read(min(size, self._chunk_left))
        if not data:
            raise bad_request("request body ended inside a chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and self._rfile.readline(3) not in (b"\r\n", b"\n"):
            raise bad_request("malformed chunked request body: a chunk is not followed by CRLF")
        return data

    def _chunk_size(self) -> int:
        """The size of the next chunk, checked before any of it is read: a bad line is 400, a size that
        would take the body over its limit 413, at once (never waiting for data that will not come)."""
        line = self._rfile.readline(MAX_CHUNK_LINE + 1)
        if not line.endswith(b"\n"):
            if len(line) > MAX_CHUNK_LINE:
                raise bad_request("a chunk-size line of the chunked request body is longer than %d bytes"
                                  % MAX_CHUNK_LINE)
            raise bad_request("request body ended before its last chunk")
        digits = line.split(b";", 1)[0].strip(b" \t\r\n")
        if not 0 < len(digits) <= MAX_CHUNK_DIGITS or digits.strip(HEX_DIGITS):
            raise bad_request("malformed chunked request body (bad chunk size line %r; expected at most %d hex "
                              "digits)" % (line[:40], MAX_CHUNK_DIGITS))
        chunk = int(digits, 16)
        if chunk > self._limit - self._total:
            raise too_large("a chunk of %d bytes takes the request body over the agent's limit of %d bytes "
                            "(%s); send less or raise the limit" % (chunk, self._limit, self._limit_name))
        return chunk

    def read_all(self) -> bytes:
        parts = []
        while True:
            data = self.read(CHUNK)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def drain(self, max_bytes: int) -> bool:
        """Read and drop what is left of the body, up to `max_bytes`; True if the body was used up, so the
        connection can serve another request."""
        dropped = 0
        try:
            while not self.finished and dropped <= max_bytes:
                data = self.read(CHUNK)
                if not data:
                    break
                dropped += len(data)
        except (ApiError, OSError, ValueError):
            return False
        return self.finished


class ChunkedWriter:
    """The body of a chunked response; each `write` is one chunk sent in one socket write."""

    def __init__(self, wfile):
        self._wfile = wfile

    def write(self, data) -> int:
        if data:
            self._wfile.write(b"%x\r\n%s\r\n" % (len(data), bytes(data)))
        return len(data)

    def flush(self):
        pass

    def close(self):
        self._wfile.write(b"0\r\n\r\n")


_TOO_DEEP = object()


def _too_deep(value) -> bool:
    """Whether JSON `value` nests lists/objects more than MAX_JSON_DEPTH levels (walked without recursion,
    so the check itself cannot hit the recursion limit)."""
    level = [value]
    for _ in range(MAX_JSON_DEPTH):
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return any(isinstance(item, (dict, list)) for item in level)


def unquote(text: str, plus: bool = False) -> str:
    """Percent-decoded text (`+` as a space too when `plus`), as urllib.parse decodes it. urllib.parse is
    imported only for text that needs it: importing it costs ~2 ms, paid by every sandbox's start."""
    if "%" not in text and not (plus and "+" in text):
        return text
    from urllib.parse import unquote as decode, unquote_plus as decode_plus
    return decode_plus(text) if plus else decode(text)


def parse_query(query: str) -> dict:
    """Query parameters (the last of repeated ones). Only `&` separates them, on every Python version (older
    3.8 releases' parse_qs also split on `;`, which paths may contain)."""
    params = {}
    for part in query.split("&"):
        if part:
            name, _, value = part.partition("=")
            params[unquote(name, plus=True)] = unquote(value, plus=True)
    return params


class Request:
    """One HTTP request as route handlers see it: `method`, `path`, query `params`, `context`, the body,
    and ways to answer. A handler returns a dict (sent as 200 JSON) or None once it has answered."""

    def __init__(self, handler, method: str, path: str, query: str, context: AgentContext):
        self.handler = handler
        self.method = method
        self.path = path
        self.params = parse_query(query)
        self.context = context
        self.responded = False
        self._body = None

    # -- request ---------------------------------------------------------------------------------
    def param(self, name: str, required: bool = False):
        value = self.params.get(name)
        if required and not value:
            raise bad_request("query parameter %r is required, e.g. %s?%s=..." % (name, self.path, name))
        return value

    def flag(self, name: str) -> bool:
        value = (self.params.get(name) or "").lower()
        if value in ("", "0", "false", "no"):
            return False
        if value in ("1", "true", "yes"):
            return True
        raise bad_request("query parameter %r must be 1 or 0, not %r" % (name, value))

    def body(self) -> Body:
        """The raw body (files, tar), capped at ORCHARD_AGENT_MAX_BODY."""
        if self._body is None:
            self._body = Body(self.handler.rfile, self.handler.headers, self.context.max_body)
        return self._body

    def json(self) -> dict:
        """The body as a JSON object (capped at ORCHARD_AGENT_MAX_JSON)."""
        if self._body is None:
            self._body = Body(self.handler.rfile, self.handler.headers, self.context.max_json,
                              "ORCHARD_AGENT_MAX_JSON")
        raw = self._body.read_all()
        if not raw.strip():
            raise bad_request("%s %s needs a JSON object body" % (self.method, self.path))
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad_request("request body is not valid JSON (%s)" % exc)
        except RecursionError:
            value = _TOO_DEEP  # nested past the interpreter's recursion limit
        # Only a body with enough brackets to nest deeply is walked (count() runs in C, in microseconds).
        if value is _TOO_DEEP or (raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(value)):
            raise bad_request("request body nests JSON more than %d levels deep; no request needs that"
                              % MAX_JSON_DEPTH)
        if not isinstance(value, dict):
            raise bad_request("request body must be a JSON object, not %s" % type(value).__name__)
        return value

    def body_done(self) -> bool:
        """Whether the body was read to its end (or there was none), so the connection can be reused."""
        if self._body is None:
            try:
                self.body()
            except ApiError:
                return False
        return self._body.finished

    # -- response --------------------------------------------------------------------------------
    def _head(self, status: int, headers) -> bytes:
        lines = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, ""))]
        lines.extend("%s: %s" % kv for kv in headers)
        if self.handler.close_connection:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send_bytes(self, status: int, body: bytes, content_type: str = JSON_TYPE):
        self.responded = True
        head = self._head(status, (("Content-Type", content_type), ("Content-Length", len(body))))
        self.handler.wfile.write(head + body)

    def send_json(self, obj, status: int = 200):
        self.send_bytes(status, json.dumps(obj, separators=(",", ":")).encode("utf-8"))

    def send_error(self, error: ApiError):
        self.send_json({"error": error.code, "message": error.message}, error.status)

    def start_chunked(self, content_type: str) -> ChunkedWriter:
        """Send the head of a chunked 200 response; the caller writes chunks and closes the writer."""
        self.responded = True
        self.handler.wfile.write(self._head(200, (("Content-Type", content_type),
                                                  ("Transfer-Encoding", "chunked"))))
        return ChunkedWriter(self.handler.wfile)

    def send_file(self, fileobj, size: int, content_type: str = "application/octet-stream"):
        """Stream an open file with sendfile(2): the file never passes through the agent's memory."""
        self.responded = True
        self.handler.wfile.write(self._head(200, (("Content-Type", content_type), ("Content-Length", size))))
        sent = self.handler.connection.sendfile(fileobj, 0, size) if size else 0
        if sent != size:  # the file shrank while being sent: the client must see a broken response
            self.handler.close_connection = True


def log_error(text: str):
    """Errors go to stderr (stdout carries only the READY line); a closed stderr must not crash a request."""
    import traceback  # only on failures: it is not worth its import time at every start

    try:
        sys.stderr.write("orchard-agent: %s\n%s" % (text, traceback.format_exc()))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
