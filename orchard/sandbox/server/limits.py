"""`BodySizeLimit`: an ASGI middleware that answers 413 to request bodies over a limit, whether they declare
their size (`Content-Length`) or are chunked, and 400 to a request that declares both. The orchestrator only
takes small JSON bodies, so a chunked body is read up to the limit here and then handed on whole (a single
chunk over the limit is refused before its bytes come by orchard/util/chunk_limit.py, under `orchard serve`)."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MIB = 1024 * 1024


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = MIB) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and _has_header(scope, b"transfer-encoding"):
            # Which one frames the body? h11 goes by Transfer-Encoding, a proxy in front may go by the length:
            # a request smuggled inside another's body. RFC 9112 6.3 lets a server refuse it; we do.
            await _reply(send, 400, "invalid_request", "the request has both Content-Length and Transfer-Encoding; "
                                                       "send one of them")
            return
        if declared == "invalid":
            await _reply(send, 400, "invalid_request", "the Content-Length header is not a number")
            return
        if declared is not None:
            if declared > self.max_bytes:
                await self._too_large(send)
                return
            await self.app(scope, receive, send)  # the server enforces the declared length
            return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _too_large(self, send: Send) -> None:
        await _reply(send, 413, "too_large",
                     f"the request body is over the {self.max_bytes} byte limit; send a smaller request")


def _content_length(scope: Scope) -> int | str | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else "invalid"
    return None


def _has_header(scope: Scope, name: bytes) -> bool:
    return any(key == name for key, _ in scope.get("headers", ()))


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


async def _reply(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
