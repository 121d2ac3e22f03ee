"""HTTP/1.1 request heads: the request line and header fields, read from a connection's buffered reader and
checked before anything else looks at them.

The agent's own reader instead of `http.server`, whose import (it pulls in `http.client` and most of
`email`) was over half of the agent's start-up time, paid by every sandbox creation. Limits keep a hostile
or broken client from growing the agent's memory: one line at most MAX_LINE bytes, a head at most
MAX_HEAD_BYTES and MAX_HEADERS fields. Body framing is checked here too, so no request is ever read two
ways (the shape of request smuggling): Content-Length with Transfer-Encoding, a repeated Content-Length and
any transfer coding but `chunked` are refused (RFC 9112 6.3 allows rejecting them)."""

from __future__ import annotations

MAX_LINE = 65536
MAX_HEADERS = 100
MAX_HEAD_BYTES = 65536
# Empty lines tolerated before a request line (RFC 9112 2.2: a stray CRLF after a previous body).
MAX_EMPTY_LINES = 4
# Digits of a Content-Length: 18 are up to ~1 EB, more than any body limit (and int() of a huge digit
# string is slow).
MAX_LENGTH_DIGITS = 18
# Characters of a method name (an HTTP token).
TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
    431: "Request Header Fields Too Large", 500: "Internal Server Error", 502: "Bad Gateway",
    503: "Service Unavailable", 505: "HTTP Version Not Supported", 507: "Insufficient Storage",
}


class HeadError(Exception):
    """A request head the agent refuses; answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Headers(dict):
    """Header fields by lower-case name; lookups ignore case. A repeated field keeps its first value,
    except Transfer-Encoding, whose values are joined (every coding counts), and Content-Length, which is
    refused."""

    def get(self, name, default=None):
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name):
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name):
        return dict.__contains__(self, name.lower())


class RequestHead:
    """One parsed request head. `keep_alive`: whether the connection may carry another request after this
    one (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`)."""

    def __init__(self, method: str, target: str, version: tuple, headers: Headers):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        tokens = [t.strip() for t in headers.get("Connection", "").lower().split(",")]
        self.keep_alive = "close" not in tokens and (version >= (1, 1) or "keep-alive" in tokens)
        self.expects_continue = (version >= (1, 1)
                                 and headers.get("Expect", "").strip().lower() == "100-continue")


def _readline(rfile) -> bytes:
    line = rfile.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise HeadError(431, "a request header line is longer than %d bytes; send shorter headers"
                        % MAX_LINE)
    return line


def _parse_version(text: str) -> tuple:
    name, _, number = text.partition("/")
    major, dot, minor = number.partition(".")
    if name != "HTTP" or not dot or not (major.isdigit() and minor.isdigit()
                                         and major.isascii() and minor.isascii()):
        raise HeadError(400, "bad HTTP version %r in the request line; send HTTP/1.1" % text[:20])
    version = (int(major), int(minor))
    if version[0] != 1:
        raise HeadError(505, "HTTP version %s is not supported; the agent speaks HTTP/1.1" % text[:20])
    return version


def _request_line(rfile):
    """(method, target, version), or None when the client closed the connection between requests."""
    for _ in range(MAX_EMPTY_LINES + 1):
        raw = rfile.readline(MAX_LINE + 1)
        if len(raw) > MAX_LINE:
            raise HeadError(414, "the request line is longer than %d bytes; send a shorter path or query"
                            % MAX_LINE)
        if not raw:
            return None
        line = raw.decode("latin-1").rstrip("\r\n")
        if line:
            break
    else:
        raise HeadError(400, "too many empty lines where a request line was expected")
    words = line.split()
    if len(words) != 3:
        raise HeadError(400, "malformed request line %r; expected METHOD /path HTTP/1.1" % line[:100])
    method, target, version = words
    if not set(method) <= TOKEN_CHARS:
        raise HeadError(400, "malformed method %r in the request line" % method[:20])
    if target.startswith("//"):  # `//health` names `/health`, not a host (as http.server treated it)
        target = "/" + target.lstrip("/")
    return method, target, _parse_version(version)


def _add_field(headers: Headers, line: str, previous):
    """Add one field line; returns its name (for continuation lines)."""
    if line[:1] in (" ", "\t"):  # obsolete line folding: the value goes on (RFC 9112 5.2)
        if previous is None:
            raise HeadError(400, "the first header line starts with whitespace")
        dict.__setitem__(headers, previous, dict.__getitem__(headers, previous) + " " + line.strip())
        return previous
    name, colon, value = line.partition(":")
    if not colon or not name or not set(name) <= TOKEN_CHARS:
        raise HeadError(400, "malformed header line %r; expected 'Name: value'" % line[:100])
    name, value = name.lower(), value.strip(" \t")
    if name not in headers:
        dict.__setitem__(headers, name, value)
    elif name == "transfer-encoding":
        dict.__setitem__(headers, name, dict.__getitem__(headers, name) + ", " + value)
    elif name == "content-length":
        raise HeadError(400, "more than one Content-Length header; send exactly one")
    return name


def _check_framing(headers: Headers):
    """Refuse a head whose body could be delimited in more than one way. Constant time."""
    coding = dict.get(headers, "transfer-encoding")
    length = dict.get(headers, "content-length")
    if coding is not None:
        if length is not None:
            raise HeadError(400, "the request has both Content-Length and Transfer-Encoding; send one of them")
        if coding.lower() != "chunked":
            raise HeadError(400, "Transfer-Encoding %r is not supported; send the body with Content-Length or "
                            "'Transfer-Encoding: chunked' alone" % coding[:60])
    elif length is not None and not (0 < len(length) <= MAX_LENGTH_DIGITS and length.isdigit()
                                     and length.isascii()):  # int() would take "+5", " 5" or "1_0"
        raise HeadError(400, "Content-Length %r is not a non-negative integer of at most %d digits"
                        % (length[:30], MAX_LENGTH_DIGITS))


def read_head(rfile):
    """The next request head on the connection, or None if the client closed it (or went away in the
    middle of a head: there is nobody left to answer). Raises HeadError for what must be refused."""
    first = _request_line(rfile)
    if first is None:
        return None
    headers = Headers()
    size = count = 0
    previous = None
    while True:
        raw = _readline(rfile)
        if raw in (b"\r\n", b"\n"):
            break
        if not raw or not raw.endswith(b"\n"):
            return None
        size += len(raw)
        count += 1
        if size > MAX_HEAD_BYTES or count > MAX_HEADERS:
            raise HeadError(431, "the request headers are over the agent's limit (%d lines, %d bytes); send "
                            "fewer or shorter headers" % (MAX_HEADERS, MAX_HEAD_BYTES))
        previous = _add_field(headers, raw.decode("latin-1").rstrip("\r\n"), previous)
    _check_framing(headers)
    return RequestHead(first[0], first[1], first[2], headers)
