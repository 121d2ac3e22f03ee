"""The gateway's configuration: model aliases (routes to a litellm model), the default budget, and how
clients authenticate. Loaded from JSON or YAML:

    models:
      policy:   {model: hosted_vllm/Qwen/Qwen3-8B, api_base: http://vllm:8000/v1,
                 params: {logprobs: true, extra_body: {return_token_ids: true}}}
      teacher:  {model: anthropic/claude-sonnet-4-5, api_key_env: ANTHROPIC_API_KEY}
    default_budget: {max_calls: 200, max_total_tokens: 2000000}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from orchard.core.errors import InvalidRequest, first_problem, ModelError
from orchard.core.policy import PROVIDER_PREFIX
from orchard.gateway.budget import Budget
from orchard.util.config_files import read_config_file
from orchard.util.connection_guard import ConnectionGuard, ConnectionLimits
from orchard.policies.registry import model_names, provider_model

# Models Orchard runs itself (registered in the `orchard.models` entry-point group, or served at run time;
# see orchard/policies/registry.py) are reached through litellm's custom-provider hook as provider `orchard`
# (`orchard/<name>`). They need no config; an alias of the same name in `models` takes precedence.
BUILTIN_PROVIDER_PREFIX = PROVIDER_PREFIX


class ModelRoute(BaseModel):
    """Where an alias goes: a litellm model string (`openai/...`, `anthropic/...`, `hosted_vllm/...`) and,
    if needed, the server and key to use."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="litellm model string, e.g. hosted_vllm/Qwen/Qwen3-8B")
    api_base: str | None = Field(default=None, description="the provider's base URL, e.g. http://vllm:8000/v1")
    api_key: SecretStr | None = Field(default=None, description="the provider's key (kept out of logs)")
    api_key_env: str | None = Field(default=None, description="or: the environment variable holding it")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="default request parameters; the client's own take precedence "
                                               "(extra_body is merged key by key)")
    timeout_s: float | None = Field(default=None, gt=0, description="per call; default: the gateway's")

    def resolved_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env is not None:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ModelError(f"the gateway's route for {self.model!r} reads its API key from the "
                                     f"environment variable {self.api_key_env}, which is not set on the gateway")
            return value
        return None  # litellm then uses the provider's usual variable (OPENAI_API_KEY, ...)


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelRoute] = Field(default_factory=dict, description="alias -> route")
    allow_any_model: bool = Field(
        default=False, description="also pass model names that are not aliases to litellm as they are")
    default_budget: Budget = Field(default_factory=Budget, description="for rollouts not given their own")
    api_key: SecretStr | None = Field(
        default=None, description="if set, clients must send 'Authorization: Bearer <api_key>'")
    require_rollout_key: bool = Field(
        default=False, description="refuse calls without a rollout key instead of recording them under "
                                   "the key 'unkeyed'")
    timeout_s: float = Field(default=600, gt=0, description="per model call")
    num_retries: int = Field(default=0, ge=0, description="litellm's retries of a failed call")
    fast_path: bool = Field(
        default=True, description="call self-hosted OpenAI-compatible servers (openai/ or hosted_vllm/ routes with "
                                  "an api_base to a model litellm does not know) directly instead of through "
                                  "litellm, for plain requests (see docs/gateway.md); false: always litellm")
    record_path: Path | None = Field(default=None, description="also append every call to this JSONL file")
    max_connections_per_sandbox: int = Field(
        default=64, ge=1, description="most connections one sandbox holds on the gateway's Unix socket (its "
                                      "network namespace; the agent's forwarder relays at most 32): past it, "
                                      "that sandbox's oldest idle connection is closed for the new one")
    connection_idle_timeout_s: float = Field(
        default=30, gt=0, le=3600, description="a connection that sends no whole request for this long is "
                                               "closed (a call in progress is never cut)")
    max_connections: int | None = Field(
        default=None, ge=1, description="most connections in all (default: half the process's descriptors)")

    def connection_guard(self) -> ConnectionGuard:
        """What bounds the connections clients (sandboxes) hold on the gateway's server."""
        return ConnectionGuard(ConnectionLimits(max_connections=self.max_connections,
                                                max_per_peer=self.max_connections_per_sandbox,
                                                idle_timeout_s=self.connection_idle_timeout_s))

    @field_validator("models")
    @classmethod
    def _aliases_are_names(cls, models: dict[str, ModelRoute]) -> dict[str, ModelRoute]:
        for alias in models:
            if not alias.strip():
                raise ValueError("a model alias must not be empty")
        return models

    @classmethod
    def load(cls, path: str | Path) -> GatewayConfig:
        """Read a JSON or YAML (.yaml/.yml) file."""
        path = Path(path)
        data = read_config_file(path, "gateway config")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidRequest(f"gateway config {path}: {first_problem(exc.errors(), 'config')}") from None

    def route(self, model: str) -> ModelRoute:
        """The route for a requested model name: its alias, else one of Orchard's own models (see
        `orchard model list`), else (if allowed) the name as a litellm model."""
        route = self.models.get(model)
        if route is not None:
            return route
        if model in model_names():
            return ModelRoute(model=provider_model(model))
        if self.allow_any_model:
            return ModelRoute(model=model)
        configured = ", ".join(sorted(self.models)) or "none"
        raise InvalidRequest(f"unknown model {model!r}; this gateway serves: {configured} (add an alias to the "
                             "gateway config's `models`, or set allow_any_model to pass litellm model names on)")
