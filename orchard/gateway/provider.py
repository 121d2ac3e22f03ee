"""Calls a model through litellm, so every provider litellm knows works behind the gateway, and turns
litellm's exceptions into Orchard's typed errors with the provider's own message.

litellm is imported on first use (litellm_loader.py): `import orchard.gateway` stays cheap."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchard.core.errors import (InvalidRequest, ModelError, ModelRateLimited, ModelUnreachable, OrchardError,
                                 exception_text)
from orchard.gateway.config import BUILTIN_PROVIDER_PREFIX, ModelRoute
from orchard.gateway.direct import ClientPool, api_key, direct_target, post_completion, request_body
from orchard.gateway.litellm_loader import load_litellm
from orchard.gateway.wire import ChatCompletionRequest

# Request fields a client may not set: they choose the server and credentials, which only the gateway's
# config decides (a harness in a sandbox must not point the gateway at an arbitrary URL), or litellm's own
# behaviour, which is the gateway's to set.
ROUTING_KEYS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "custom_llm_provider", "organization", "headers",
    "extra_headers", "num_retries", "max_retries", "timeout", "request_timeout", "mock_response", "metadata",
    "litellm_logging_obj", "litellm_call_id", "litellm_metadata", "aws_access_key_id", "aws_secret_access_key",
    "vertex_credentials", "azure_ad_token"})


@dataclass
class ProviderAnswer:
    response: dict[str, Any]
    cost_usd: float | None


def effective_params(route: ModelRoute, request: ChatCompletionRequest) -> dict[str, Any]:
    """The request's parameters over the route's defaults, less what only the gateway may set."""
    client = {key: value for key, value in request.params().items() if key not in ROUTING_KEYS}
    params = {**route.params, **client}
    if isinstance(route.params.get("extra_body"), dict) and isinstance(client.get("extra_body"), dict):
        params["extra_body"] = {**route.params["extra_body"], **client["extra_body"]}
    return params


def request_kwargs(route: ModelRoute, request: ChatCompletionRequest, params: dict[str, Any], *,
                   timeout_s: float, num_retries: int, rollout_key: str | None = None) -> dict[str, Any]:
    kwargs = dict(params)
    kwargs.update(model=route.model, messages=request.messages, stream=False, num_retries=num_retries,
                  max_retries=0, timeout=route.timeout_s or timeout_s)
    if route.model.startswith(BUILTIN_PROVIDER_PREFIX):
        # Orchard's own models read the rollout key (the oracle plays the task registered under it)
        from orchard.policies.litellm_provider import ROLLOUT_KEY_METADATA

        kwargs["metadata"] = {ROLLOUT_KEY_METADATA: rollout_key}
    if route.api_base:
        kwargs["api_base"] = route.api_base
    api_key = route.resolved_api_key()
    if api_key is not None:
        kwargs["api_key"] = api_key
    return kwargs


async def call_provider(route: ModelRoute, request: ChatCompletionRequest, params: dict[str, Any], *,
                        timeout_s: float, num_retries: int, rollout_key: str | None = None,
                        direct: ClientPool | None = None) -> ProviderAnswer:
    """One completion: over `direct` (the fast path, direct.py) where it applies, else through litellm."""
    if direct is not None:
        answer = await _call_direct(direct, route, request, params, timeout_s=route.timeout_s or timeout_s,
                                    num_retries=num_retries)
        if answer is not None:
            return answer
    litellm = load_litellm()
    kwargs = request_kwargs(route, request, params, timeout_s=timeout_s, num_retries=num_retries,
                            rollout_key=rollout_key)
    try:
        response = await litellm.acompletion(**kwargs)
    except Exception as exc:  # litellm raises many types (and wraps unknown ones): classify them all
        raise provider_error(route, exc, timeout_s=kwargs["timeout"]) from exc
    cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
    return ProviderAnswer(response=response.model_dump(),
                          cost_usd=float(cost) if isinstance(cost, (int, float)) and cost >= 0 else None)


async def _call_direct(pool: ClientPool, route: ModelRoute, request: ChatCompletionRequest, params: dict[str, Any],
                       *, timeout_s: float, num_retries: int) -> ProviderAnswer | None:
    """The fast path's answer, or None where it does not apply. Its models have no price in litellm's table,
    so their cost is unknown (None), as litellm reports it."""
    target = direct_target(route)
    if target is None:
        return None
    body = request_body(target, request, params)
    key = api_key(target, route) if body is not None else None
    if body is None or key is None:
        return None
    try:
        response = await post_completion(pool, target, key, body, timeout_s=timeout_s, num_retries=num_retries)
    except Exception as exc:
        raise provider_error(route, exc, timeout_s=timeout_s) from exc
    return ProviderAnswer(response=response, cost_usd=None)


def provider_error(route: ModelRoute, exc: Exception, *, timeout_s: float) -> OrchardError:
    where = f"model {route.model!r}" + (f" at {route.api_base}" if route.api_base else "")
    failure = _transport_failure(exc)
    if failure == "timeout":
        return ModelUnreachable(f"{where} did not answer within {timeout_s:g} s; check that the server is up "
                                "and not overloaded, or raise the route's timeout_s")
    if failure == "unreachable":
        return ModelUnreachable(f"cannot reach {where}: {_root_cause(exc)}; check that the model server is "
                                "running and that the route's api_base is right")
    status = getattr(exc, "status_code", None)
    detail = _provider_message(exc)
    if status == 429:
        return ModelRateLimited(f"{where} is rate-limiting the gateway: {detail}; retry later")
    if status in (401, 403):
        return ModelError(f"{where} refused the gateway's credentials ({status}): {detail}; set the route's "
                          "api_key / api_key_env (any non-empty key for servers that do not check keys)")
    if isinstance(status, int) and 400 <= status < 500:
        return InvalidRequest(f"{where} rejected the request ({status}): {detail}")
    return ModelError(f"{where} failed ({status or type(exc).__name__}): {detail}")


def _transport_failure(exc: Exception) -> str | None:
    """'timeout' or 'unreachable' when the chain of causes shows the network failed, else None. litellm
    also uses APIConnectionError for its own unexpected errors, so the low-level cause decides."""
    import httpx

    litellm = load_litellm()
    if isinstance(exc, litellm.Timeout):
        return "timeout"
    timeouts: tuple[type[BaseException], ...] = (httpx.TimeoutException, TimeoutError)
    unreachable: tuple[type[BaseException], ...] = (httpx.TransportError, ConnectionError)
    try:
        import aiohttp  # litellm's default transport

        timeouts += (aiohttp.ServerTimeoutError,)
        unreachable += (aiohttp.ClientConnectionError,)
    except ImportError:
        pass
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, timeouts):
            return "timeout"
        if isinstance(current, unreachable):
            return "unreachable"
        current = current.__cause__ or current.__context__
    return None


def _root_cause(exc: BaseException) -> str:
    seen: set[int] = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return exception_text(exc)


def _provider_message(exc: Exception) -> str:
    """The provider's own error text when its response is at hand (litellm often keeps only 'Error code')."""
    response = getattr(exc, "response", None)
    try:
        text = response.text if response is not None else ""
    except Exception:  # a streamed or closed response: its text is gone
        text = ""
    if not text:
        message = str(exc)
        return message.split(": ", 1)[1] if message.startswith("litellm.") and ": " in message else message
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):  # OpenAI's shape
            text = str(error["message"])
        elif body.get("message"):  # Orchard's shape: {"error": CODE, "message": TEXT}
            text = f"{error}: {body['message']}" if isinstance(error, str) else str(body["message"])
    return text.strip()[:500]
