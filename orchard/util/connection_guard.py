"""`ConnectionGuard`: bounds what idle or stalled clients can hold of a uvicorn server (the orchestrator's REST
API, the model gateway). uvicorn accepts every connection and waits for its request as long as the client
likes: one that drips a header or a body a byte at a time is never closed, so a few hundred of them use up
the process's file descriptors and nobody else is served. The guard, on uvicorn's h11 protocol:

- **a request deadline**: from the moment a connection opens, or its last response ended, the whole next
  request (head and body) must arrive within `idle_timeout_s`, else the connection is closed. It is lifted
  once the request is in (its last body chunk received, or no body) or its answer starts, so a long model
  call or a create waiting for a sandbox is never cut.
- **a cap on connections** (`max_connections`, default: half the descriptors the process may open): at the
  cap, a new connection evicts the oldest one that is waiting for a request and never sent an authenticated
  one; with none such it is closed at once. The app says a request was authenticated by setting
  `scope[AUTHENTICATED] = True` (the orchestrator's key check does).
- **a cap per peer** (`max_per_peer`): on a Unix socket, connections are grouped by the peer's network
  namespace (every sandbox has its own), so one sandbox cannot hold the gateway's connections; past the
  cap, that peer's own oldest waiting connection is evicted (else the new one is closed). TCP peers are
  not grouped.

Use: `uvicorn.Config(app, http=guarded_h11(ConnectionGuard(limits)))`."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import resource
import socket
import struct
from collections import Counter
from typing import Any, Callable, Hashable

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("orchard.connections")

# The ASGI scope key an app sets to True once it authenticated the request.
AUTHENTICATED = "orchard.authenticated"
DEFAULT_IDLE_TIMEOUT_S = 30.0
MAX_DEFAULT_CONNECTIONS = 4096


class ConnectionLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_connections: int | None = Field(
        default=None, ge=1, description="most connections at once (default: half the file descriptors the "
                                        "process may open, at most 4096)")
    max_per_peer: int | None = Field(
        default=None, ge=1, description="most connections of one peer: on a Unix socket, one network "
                                        "namespace (a sandbox); default no cap")
    idle_timeout_s: float = Field(
        default=DEFAULT_IDLE_TIMEOUT_S, gt=0, le=3600,
        description="how long a connection may take to send its next whole request (head and body)")

    def resolved_max_connections(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return MAX_DEFAULT_CONNECTIONS
        return max(8, min(MAX_DEFAULT_CONNECTIONS, soft // 2))  # the other half: the app's own files


class Tracked:
    """One connection the guard watches."""

    def __init__(self, transport: asyncio.BaseTransport, peer: Hashable | None, seq: int) -> None:
        self.transport = transport
        self.peer = peer
        self.seq = seq
        self.authenticated = False
        self.timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """Waiting for (the rest of) a request: its deadline runs."""
        return self.timer is not None

    def close(self) -> None:
        self.cancel_timer()
        self.transport.close()

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class ConnectionGuard:
    """The connections of one server, under `limits`. `peer_of(transport)` groups connections for
    `max_per_peer` (None: not grouped). Runs on the server's event loop only."""

    def __init__(self, limits: ConnectionLimits | None = None,
                 peer_of: Callable[[asyncio.BaseTransport], Hashable | None] | None = None) -> None:
        self.limits = limits or ConnectionLimits()
        self.max_connections = self.limits.resolved_max_connections()
        self.peer_of = peer_of or unix_peer_namespace
        self.live: dict[Tracked, None] = {}  # oldest first
        self.per_peer: Counter = Counter()
        self.refused = self.evicted = self.timed_out = 0
        self._seq = itertools.count()

    def opened(self, transport: asyncio.BaseTransport) -> Tracked | None:
        """A new connection: tracked with its deadline running, or closed (None) when no place is free."""
        peer = self.peer_of(transport)
        cap = self.limits.max_per_peer
        if peer is not None and cap is not None and self.per_peer[peer] >= cap:
            if not self._evict(lambda t: t.peer == peer, "its peer is at its cap of %d connections" % cap):
                return self._refuse(transport, "its peer is at its cap of %d connections, all busy" % cap)
        if len(self.live) >= self.max_connections:
            if not self._evict(lambda t: not t.authenticated,
                               "the server is at its cap of %d connections" % self.max_connections):
                return self._refuse(transport, "the server is at its cap of %d connections, none idle"
                                    % self.max_connections)
        tracked = Tracked(transport, peer, next(self._seq))
        self.live[tracked] = None
        if peer is not None:
            self.per_peer[peer] += 1
        self.await_request(tracked)
        return tracked

    def closed(self, tracked: Tracked | None) -> None:
        if tracked is None or tracked not in self.live:
            return
        tracked.cancel_timer()
        del self.live[tracked]
        if tracked.peer is not None:
            self.per_peer[tracked.peer] -= 1
            if self.per_peer[tracked.peer] <= 0:
                del self.per_peer[tracked.peer]

    def await_request(self, tracked: Tracked) -> None:
        """(Re)start the deadline for the next request: at open, and when a response ended."""
        tracked.cancel_timer()
        if tracked in self.live and not tracked.transport.is_closing():
            loop = asyncio.get_running_loop()
            tracked.timer = loop.call_later(self.limits.idle_timeout_s, self._expire, tracked)

    def request_in(self, tracked: Tracked) -> None:
        """The request arrived whole (or its answer started): no deadline while the app works on it."""
        tracked.cancel_timer()

    def _expire(self, tracked: Tracked) -> None:
        tracked.timer = None
        if tracked in self.live:
            self.timed_out += 1
            log.info("closing a connection that sent no whole request within %g s", self.limits.idle_timeout_s)
            tracked.close()

    def _evict(self, eligible: Callable[[Tracked], bool], why: str) -> bool:
        """Close the oldest connection waiting for a request that `eligible` allows; whether there was one."""
        for tracked in self.live:
            if tracked.waiting and eligible(tracked):
                self.evicted += 1
                log.warning("closing an idle connection for a new one: %s", why)
                self.closed(tracked)
                tracked.close()
                return True
        return False

    def _refuse(self, transport: asyncio.BaseTransport, why: str) -> None:
        self.refused += 1
        log.warning("refusing a new connection: %s", why)
        transport.close()
        return None


def unix_peer_namespace(transport: asyncio.BaseTransport) -> Hashable | None:
    """The network namespace of a Unix-socket peer (the process that connected): every sandbox has its own.
    When it cannot be read (the process is gone, or not ours to inspect), the peer's uid. None for TCP."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    except OSError:
        return ("unknown",)
    try:
        ns = os.stat(f"/proc/{pid}/ns/net")
        return ("netns", ns.st_dev, ns.st_ino)
    except OSError:
        return ("uid", uid)


def guarded_h11(guard: ConnectionGuard) -> Callable[..., Any]:
    """A uvicorn `http` protocol factory: h11 with `guard` watching every connection."""
    protocol_class = _guarded_h11_class()

    def protocol(**kwargs: Any) -> Any:
        return protocol_class(guard, **kwargs)

    return protocol


@functools.cache
def _guarded_h11_class() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol  # uvicorn only where a server runs

    class GuardedH11(H11Protocol):
        """uvicorn's h11 protocol, telling the guard when a connection opens, closes, has its request in and
        has answered it. The request's ASGI events are watched by wrapping the app this connection runs."""

        def __init__(self, guard: ConnectionGuard, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._guard = guard
            self._tracked: Tracked | None = None
            self.app = _watched(self.app, guard, lambda: self._tracked)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._tracked = self._guard.opened(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._guard.closed(self._tracked)
            super().connection_lost(exc)

    return GuardedH11


def _watched(app: Any, guard: ConnectionGuard, tracked_now: Callable[[], Tracked | None]) -> Any:
    """`app`, telling `guard` when its connection's request is in and when its response ended."""

    async def watched(scope: dict, receive: Callable, send: Callable) -> None:
        tracked = tracked_now()
        if scope["type"] != "http" or tracked is None:
            await app(scope, receive, send)
            return
        if not _has_body(scope):
            guard.request_in(tracked)

        async def receive_watched() -> dict:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                guard.request_in(tracked)
            return message

        async def send_watched(message: dict) -> None:
            if message["type"] == "http.response.start":
                guard.request_in(tracked)
                if scope.get(AUTHENTICATED) is True:
                    tracked.authenticated = True
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                guard.await_request(tracked)

        await app(scope, receive_watched, send_watched)

    return watched


def _has_body(scope: dict) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"0", b"")):
            return True
    return False
