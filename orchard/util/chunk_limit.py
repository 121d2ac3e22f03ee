"""`chunk_limited_h11`: uvicorn's h11 protocol, refusing a chunked request body as soon as a chunk's size line
takes it over the body limit.

h11 takes chunk sizes of up to 20 hex digits and then waits for the bytes: a client that declares an
18-digit chunk and sends nothing more held the connection (and a create's handler) for as long as it
liked, since the app only sees body bytes as they come and cannot tell a huge chunk from a slow one. A
chunk that takes the body over the limit is answered 413 at once and the connection closed, as the sandbox
agent's own parser does (orchard/sandbox/agent/wire.py).

The size is read from h11's chunked reader (`Connection._reader._bytes_in_chunk`): h11 has no public way to
see it. Should a later h11 rename it, the check finds nothing and the request falls back to the app's body
limit and the connection's deadline; tests/security/test_api_input_edges.py catches that."""

from __future__ import annotations

import json
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MIB = 1024 * 1024


def chunk_limited_h11(factory: Callable[..., H11Protocol] = H11Protocol, *,
                      max_body_bytes: int = MIB) -> Callable[..., H11Protocol]:
    """A uvicorn `http` protocol factory: what `factory` makes (uvicorn's h11 protocol, or a subclass of it),
    refusing a chunked request body as soon as a chunk's size line takes it over `max_body_bytes` (the
    app's body limit)."""

    def protocol(**kwargs: Any) -> H11Protocol:
        made = factory(**kwargs)
        made.conn = _ChunkLimited(made, max_body_bytes)  # type: ignore[assignment]
        return made

    return protocol


class _ChunkLimited:
    """The protocol's h11 connection, checked after each event it parses."""

    def __init__(self, protocol: H11Protocol, max_body_bytes: int) -> None:
        self._protocol = protocol
        self._conn = protocol.conn
        self._max = max_body_bytes
        self._received = 0  # of the current request's body

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def next_event(self) -> Any:
        event = self._conn.next_event()
        if isinstance(event, h11.Request):
            self._received = 0
        elif isinstance(event, h11.Data):
            self._received += len(event.data)
        left = getattr(getattr(self._conn, "_reader", None), "_bytes_in_chunk", 0)
        if isinstance(left, int) and self._received + left > self._max:
            _refuse(self._protocol, self._conn, self._received + left, self._max)
            return h11.NEED_DATA  # the connection is closing: nothing more is read from it
        return event


def _refuse(protocol: H11Protocol, conn: h11.Connection, declared: int, limit: int) -> None:
    """Answer 413 (unless the app already answered), keep the app from answering again, and close."""
    cycle = protocol.cycle
    if conn.our_state is h11.SEND_RESPONSE and (cycle is None or not cycle.response_started):
        body = json.dumps({"error": "too_large",
                           "message": f"the request body's chunks declare at least {declared} bytes, over this "
                                      f"server's body limit of {limit} bytes; send a smaller request"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            out = conn.send(h11.Response(status_code=413, headers=headers, reason=b"Content Too Large"))
            out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
            protocol.transport.write(out)
        except h11.LocalProtocolError:
            pass  # h11 will not write a response in this state: closing is answer enough
    if cycle is not None:  # the app (waiting for the body) sees a disconnect, and what it sends is dropped
        cycle.disconnected = True
        cycle.message_event.set()
    protocol.transport.close()
