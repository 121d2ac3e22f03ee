"""Who is calling the orchestrator's `/v1` API, checked as soon as a request's headers are in and before
any of its body is read: a client without a valid key gets 401 and the connection is closed, so nobody
without a key can make the server read (and wait for) a body.

Two kinds of keys: the server's admin key (`ORCHARD_API_KEY`: acts for any owner, configures pools; the
one-user setup), and owner keys (api_keys.py: bound to one owner, who sees and deletes only its own
sandboxes and whose sandboxes count against the key's cap)."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any, Awaitable, Callable

from pydantic import BaseModel

from orchard.core.errors import AuthError
from orchard.sandbox.server.api_keys import KeyRing
from orchard.util.connection_guard import AUTHENTICATED

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]

PRINCIPAL = "orchard.principal"  # the ASGI scope key the caller is put under
PROTECTED_PREFIX = "/v1/"


class Principal(BaseModel):
    """The caller. `owner` None: the admin key (any owner). Else the owner its key is bound to, with the
    key's cap on that owner's live sandboxes."""

    owner: str | None = None
    key_id: str | None = None
    max_sandboxes: int | None = None

    @property
    def admin(self) -> bool:
        return self.owner is None


class Authenticate:
    """ASGI middleware: `/v1/...` requests need `Authorization: Bearer <admin key | owner key>`."""

    def __init__(self, app: ASGIApp, admin_key: str, keys: KeyRing | None = None) -> None:
        self.app = app
        self.admin_key = admin_key.encode()
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not (scope["path"] + "/").startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        principal, problem = self.identify(_bearer(scope))
        if principal is None:
            await _refuse(send, problem)
            return
        scope[PRINCIPAL] = principal
        scope[AUTHENTICATED] = True
        await self.app(scope, receive, send)

    def identify(self, presented: str | None) -> tuple[Principal | None, str]:
        if presented is None:
            return None, "missing API key: send the header 'Authorization: Bearer <api key>'"
        if hmac.compare_digest(presented.encode(), self.admin_key):
            return Principal(), ""
        entry = self.keys.find(presented) if self.keys is not None else None
        if entry is None:
            return None, "wrong API key: check the key the orchestrator was started with, or your owner key"
        if entry.expired(time.time()):
            return None, (f"API key {entry.id} (owner {entry.owner!r}) expired; ask the operator for a new one "
                          "(orchard serve keys add)")
        return Principal(owner=entry.owner, key_id=entry.id, max_sandboxes=entry.max_sandboxes), ""


def principal_of(scope: Scope) -> Principal:
    """The caller `Authenticate` identified; a route it did not guard fails closed."""
    principal = scope.get(PRINCIPAL)
    if principal is None:
        raise AuthError("missing API key: send the header 'Authorization: Bearer <api key>'")
    return principal


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
            return None
    return None


async def _refuse(send: Callable, message: str) -> None:
    """401, and the connection closed: its body is never read."""
    body = json.dumps({"error": "unauthorized", "message": message}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
