"""Orchard's model gateway: an OpenAI-compatible endpoint in front of litellm that records every model call
(messages, tool calls, token ids, logprobs, latency, cost) under its rollout key and enforces per-rollout
budgets. Use it in-process (`Gateway.complete`) or over HTTP (`serve`).

Nothing heavy is imported here: litellm loads on the first model call (or at `serve`)."""

from typing import TYPE_CHECKING

from orchard.util.lazy import lazy_exports

_LAZY_EXPORTS = {
    "Gateway": "orchard.gateway.gateway",
    "RolloutRecords": "orchard.gateway.gateway",
    "RolloutState": "orchard.gateway.gateway",
    "GatewayConfig": "orchard.gateway.config",
    "ModelRoute": "orchard.gateway.config",
    "Budget": "orchard.gateway.budget",
    "Recorder": "orchard.gateway.recorder",
    "create_app": "orchard.gateway.app",
    "serve": "orchard.gateway.server",
}

__all__ = list(_LAZY_EXPORTS)

if TYPE_CHECKING:
    from orchard.gateway.app import create_app
    from orchard.gateway.budget import Budget
    from orchard.gateway.config import GatewayConfig, ModelRoute
    from orchard.gateway.gateway import Gateway, RolloutRecords, RolloutState
    from orchard.gateway.recorder import Recorder
    from orchard.gateway.server import serve


__getattr__, __dir__ = lazy_exports(__name__, _LAZY_EXPORTS, globals())
