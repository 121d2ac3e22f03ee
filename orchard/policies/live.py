"""Policies handed to the gateway at run time: a model that lives in this process (e.g. the one being
trained) served under `orchard/<name>` like the registered ones (`oracle`, `smollm2`, a plugin's), so its
calls are recorded, budgeted and keyed by rollout the same way. orchard/policies/registry.py finds them
beside the registered models.

    serve_live("policy-1a2b", policy)  # registry's; policy.complete(messages, tools, params, rollout_key=...)
    GatewayConfig(models={"policy": ModelRoute(model="orchard/policy-1a2b")})
    ...
    withdraw_live("policy-1a2b")

A policy returns an `orchard.core.policy.Completion` (message, finish reason, prompt and completion token
ids, a logprob per completion token); the gateway records those ids as they are. One that only has
`complete` is run in a worker thread; a full `orchard.core.policy.Policy` (with `blocking`, and rollout
hooks if it has them) is used as it is."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from orchard.core.policy import Completion


class LivePolicy(Protocol):
    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 params: dict[str, Any], *, rollout_key: str | None,
                 timeout_s: float | None) -> Completion: ...


_policies: dict[str, LivePolicy] = {}
_lock = threading.Lock()


def put(name: str, policy: LivePolicy) -> None:
    """Store `policy` under `name` (registry.serve_live checks the name first)."""
    with _lock:
        _policies[name] = policy


def withdraw(name: str) -> None:
    with _lock:
        _policies.pop(name, None)


def get(name: str) -> LivePolicy | None:
    with _lock:
        return _policies.get(name)


def names() -> list[str]:
    with _lock:
        return sorted(_policies)
