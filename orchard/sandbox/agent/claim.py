"""`POST /claim`: hand a pre-started (pooled) sandbox to its user. Authorized by the token the agent has
now (the pool's, for this member alone), it atomically replaces that token with the one in the request,
so the old one is refused from the next request on, and sets the environment later commands and shells
start from (the caller's spec env on top of the agent's own). A sandbox is claimed at most once: a second
claim is 409, since its holder already has it."""

from __future__ import annotations

import threading

from . import fields
from .wire import ApiError, bad_request

CLAIM_FIELDS = ("token", "env")
MIN_TOKEN_CHARS = 16
_lock = threading.Lock()


def handle_claim(req) -> dict:
    body = req.json()
    fields.reject_unknown(body, CLAIM_FIELDS, "a claim request")
    token = body.get("token")
    if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_CHARS or token != token.strip():
        raise bad_request("token must be a string of at least %d characters without surrounding spaces"
                          % MIN_TOKEN_CHARS)
    env = fields.str_dict(body, "env")
    context = req.context
    with _lock:  # two claims at once: one wins, the other is 409 (never a mix of both)
        if getattr(context, "claimed", False):
            raise ApiError(409, "invalid_request", "this sandbox was already claimed; its holder has its token")
        merged = dict(context.env)
        merged.update(env)
        # The environment first: once the new token works, commands sent with it get the caller's env.
        context.env = merged
        context.token = token
        context.claimed = True
    return {"claimed": True}
