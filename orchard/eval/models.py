"""Which models an evaluation's gateway serves: Orchard's own models (the gateway serves them by name, see
`orchard.policies.registry` and `orchard model list`), the aliases of a gateway config, the model asked for
(with its server and key when given), and any other litellm model string."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from orchard.core.errors import InvalidRequest
from orchard.gateway.config import BUILTIN_PROVIDER_PREFIX, GatewayConfig, ModelRoute


def eval_gateway_config(model: str, *, api_base: str | None = None, api_key: str | None = None,
                        api_key_env: str | None = None, config: GatewayConfig | str | Path | None = None,
                        timeout_s: float | None = None) -> GatewayConfig:
    """The gateway config for evaluating `model`: `config` (a GatewayConfig or a config file) if given, with
    any litellm model string allowed; `api_base` / `api_key` make a route for `model` itself (e.g. an
    OpenAI-compatible server: `--model openai/NAME --api-base URL`)."""
    if config is None:
        base = GatewayConfig()
    elif isinstance(config, GatewayConfig):
        base = config
    else:
        base = GatewayConfig.load(config)
    models = dict(base.models)
    if api_base is not None or api_key is not None or api_key_env is not None:
        models[model] = ModelRoute(model=model, api_base=api_base,
                                   api_key=SecretStr(api_key) if api_key is not None else None,
                                   api_key_env=api_key_env)
    update: dict = {"models": models, "allow_any_model": True}
    if timeout_s is not None:
        update["timeout_s"] = timeout_s
    return base.model_copy(update=update)


def check_model_route(config: GatewayConfig, model: str) -> None:
    """Refuse, before any sandbox starts, a model the run's gateway could not call: one it has no route for,
    or a bare name litellm cannot tell the provider of (e.g. a typo). Otherwise every task would start its
    sandboxes only to fail on its first model call."""
    route = config.route(model)  # InvalidRequest for an unknown alias (allow_any_model off)
    if route.model.startswith(BUILTIN_PROVIDER_PREFIX):
        return  # Orchard's own models: served by the gateway itself
    from orchard.gateway.litellm_loader import load_litellm

    try:
        load_litellm().get_llm_provider(route.model, api_base=route.api_base)
    except Exception:  # litellm's BadRequestError "LLM Provider NOT provided"
        raise InvalidRequest(
            f"model {model!r} has no provider: it is not one of Orchard's own models (`orchard model list`), "
            f"not an alias of the gateway config, and litellm cannot tell which provider serves "
            f"{route.model!r}. Name it as PROVIDER/MODEL (e.g. openai/NAME with --api-base URL, "
            "anthropic/claude-...), or add an alias with --gateway-config") from None
