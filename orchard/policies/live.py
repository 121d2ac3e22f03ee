"""Policies handed to the gateway at run time: a model that lives in this process (e.g. the one being
trained) served under `orchard/<name>` like the built-in `oracle` and `smollm2`, so its calls are
recorded, budgeted and keyed by rollout the same way.

    serve("policy-1a2b", policy)     # policy.complete(messages, tools, params, rollout_key=..., timeout_s=...)
    GatewayConfig(models={"policy": ModelRoute(model="orchard/policy-1a2b")})
    ...
    withdraw("policy-1a2b")

A policy returns an `orchard.policies.smollm2.LocalCompletion` (message, finish reason, prompt and
completion token ids, a logprob per completion token); the gateway records those ids as they are."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from orchard.core.errors import InvalidRequest
from orchard.policies.smollm2 import LocalCompletion

RESERVED = frozenset({"oracle", "smollm2"})


class LivePolicy(Protocol):
    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 params: dict[str, Any], *, rollout_key: str | None,
                 timeout_s: float | None) -> LocalCompletion: ...


_policies: dict[str, LivePolicy] = {}
_lock = threading.Lock()


def serve(name: str, policy: LivePolicy) -> str:
    """Serve `policy` as the gateway model `orchard/<name>`; returns that model string."""
    if not name or "/" in name or name in RESERVED:
        raise InvalidRequest(f"cannot serve a live policy as {name!r}: use a non-empty name without '/', "
                             f"other than {', '.join(sorted(RESERVED))}")
    with _lock:
        _policies[name] = policy
    return f"orchard/{name}"


def withdraw(name: str) -> None:
    with _lock:
        _policies.pop(name, None)


def get(name: str) -> LivePolicy | None:
    with _lock:
        return _policies.get(name)
