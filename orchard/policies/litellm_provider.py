"""Orchard's own models (orchard/policies/registry.py: `oracle`, `smollm2`, a plugin's, the live ones) as the
litellm provider `orchard` (litellm's own extension point: a `CustomLLM` in `litellm.custom_provider_map`),
so the gateway calls them like any model (`orchard/<name>`) and records, budgets and streams their calls the
same way. Each is found by name in the registry and asked through the Policy protocol
(orchard/core/policy.py); its Completion becomes the response body here, one way for all.

The gateway passes the call's rollout key in litellm's `metadata` (`orchard_rollout_key`); the policy gets
it (the oracle finds its task by it). Orchard's typed errors become `CustomLLMError`s with the error's HTTP
status, which litellm turns into its exception of that status, which the gateway turns back into Orchard's.

Imported by the gateway once litellm is loaded (this module imports litellm); a policy's heavy code (e.g.
smollm2's torch) loads on its first call."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from litellm import CustomLLM, ModelResponse
from litellm.llms.custom_llm import CustomLLMError

from orchard.core.errors import OrchardError
from orchard.core.policy import PROVIDER, Completion, Policy, TokenLogprob
from orchard.policies.registry import get_policy

ROLLOUT_KEY_METADATA = "orchard_rollout_key"


class OrchardModels(CustomLLM):
    """litellm's handler for `orchard/<model>`."""

    def completion(self, model: str, messages: list, *args: Any, optional_params: dict | None = None,
                   litellm_params: dict | None = None, timeout: Any = None, **kwargs: Any) -> ModelResponse:
        return _answer(_policy(model), messages, optional_params or {}, litellm_params or {}, _seconds(timeout))

    async def acompletion(self, model: str, messages: list, *args: Any, optional_params: dict | None = None,
                          litellm_params: dict | None = None, timeout: Any = None, **kwargs: Any) -> ModelResponse:
        policy = _policy(model)
        if not policy.blocking:  # answers at once: no thread needed
            return _answer(policy, messages, optional_params or {}, litellm_params or {}, _seconds(timeout))
        # generation takes seconds of CPU: off the event loop, so the gateway keeps serving other rollouts
        return await asyncio.to_thread(_answer, policy, messages, optional_params or {}, litellm_params or {},
                                       _seconds(timeout))


def register(litellm: Any) -> None:
    """Add the `orchard` provider to litellm (once per process)."""
    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": OrchardModels()})


def _policy(model: str) -> Policy:
    try:
        return get_policy(model)
    except OrchardError as exc:
        raise CustomLLMError(status_code=exc.status, message=str(exc)) from exc


def _answer(policy: Policy, messages: list[dict[str, Any]], params: dict[str, Any], litellm_params: dict[str, Any],
            timeout_s: float | None) -> ModelResponse:
    rollout_key = (litellm_params.get("metadata") or {}).get(ROLLOUT_KEY_METADATA)
    try:
        done = policy.complete(messages, params.get("tools"), params, rollout_key=rollout_key, timeout_s=timeout_s)
    except OrchardError as exc:
        raise CustomLLMError(status_code=exc.status, message=str(exc)) from exc
    return ModelResponse(**response_body(policy, done))


def response_body(policy: Policy, done: Completion) -> dict[str, Any]:
    """The OpenAI body of a policy's completion."""
    return completion_body(done.model or policy.name, done.message, done.finish_reason,
                           prompt_token_ids=done.prompt_token_ids, completion_token_ids=done.completion_token_ids,
                           logprobs=None if done.logprobs is None else [_logprob_entry(e) for e in done.logprobs])


def completion_body(model: str, message: dict[str, Any], finish_reason: str, *,
                    prompt_token_ids: list[int] | None = None, completion_token_ids: list[int] | None = None,
                    logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An OpenAI `chat.completion` body, with vLLM's token-id fields (`prompt_token_ids`, per-choice
    `token_ids`) when known. Without token ids (e.g. the oracle's) the usage is zero."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason,
                              "logprobs": {"content": logprobs} if logprobs is not None else None}
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_token_ids or ()), "completion_tokens": len(completion_token_ids or ()),
                  "total_tokens": len(prompt_token_ids or ()) + len(completion_token_ids or ())}}
    if completion_token_ids is not None:
        choice["token_ids"] = completion_token_ids
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    return body


def _logprob_entry(entry: TokenLogprob) -> dict[str, Any]:
    return {"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.text.encode()),
            "top_logprobs": [{"token": text, "logprob": value, "bytes": list(text.encode())}
                             for text, value in entry.top]}


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, (int, float)):
        return float(timeout)
    if isinstance(timeout, httpx.Timeout):
        return timeout.read
    return None
