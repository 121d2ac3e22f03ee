"""The oracle and smollm2 as the litellm provider `orchard` (litellm's own extension point: a `CustomLLM`
in `litellm.custom_provider_map`), so the gateway calls them like any model (`orchard/oracle`,
`orchard/smollm2`) and records, budgets and streams their calls the same way; policies served at run time
(orchard/policies/live.py, e.g. the model being trained) are reached the same way under their names.

The gateway passes the call's rollout key in litellm's `metadata` (`orchard_rollout_key`): the oracle
needs it to find its task. Orchard's typed errors become `CustomLLMError`s with the error's HTTP status,
which litellm turns into its exception of that status, which the gateway turns back into Orchard's.

Imported by the gateway once litellm is loaded (this module imports litellm); smollm2's torch only loads
on its first call."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from litellm import CustomLLM, ModelResponse
from litellm.llms.custom_llm import CustomLLMError

from orchard.core.errors import OrchardError
from orchard.policies import live, oracle, smollm2

PROVIDER = "orchard"
ROLLOUT_KEY_METADATA = "orchard_rollout_key"
MODELS = ("oracle", "smollm2")


class OrchardModels(CustomLLM):
    """litellm's handler for `orchard/<model>`."""

    def completion(self, model: str, messages: list, *args: Any, optional_params: dict | None = None,
                   litellm_params: dict | None = None, timeout: Any = None, **kwargs: Any) -> ModelResponse:
        return _answer(model, messages, optional_params or {}, litellm_params or {}, _seconds(timeout))

    async def acompletion(self, model: str, messages: list, *args: Any, optional_params: dict | None = None,
                          litellm_params: dict | None = None, timeout: Any = None, **kwargs: Any) -> ModelResponse:
        if model == "oracle":  # instant: no thread needed
            return _answer(model, messages, optional_params or {}, litellm_params or {}, None)
        # generation takes seconds of CPU: off the event loop, so the gateway keeps serving other rollouts
        return await asyncio.to_thread(_answer, model, messages, optional_params or {}, litellm_params or {},
                                       _seconds(timeout))


def register(litellm: Any) -> None:
    """Add the `orchard` provider to litellm (once per process)."""
    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": OrchardModels()})


def _answer(model: str, messages: list[dict[str, Any]], params: dict[str, Any], litellm_params: dict[str, Any],
            timeout_s: float | None) -> ModelResponse:
    tools = params.get("tools")
    try:
        if model == "oracle":
            rollout_key = (litellm_params.get("metadata") or {}).get(ROLLOUT_KEY_METADATA)
            reply = oracle.respond(rollout_key, messages, tools)
            body = completion_body("oracle", reply.message, reply.finish_reason)
        elif model == "smollm2":
            if params.get("tool_choice") == "none":
                tools = None
            done = smollm2.complete(messages, tools, params, timeout_s=timeout_s)
            body = completion_body(done.model, done.message, done.finish_reason,
                                   prompt_token_ids=done.prompt_token_ids,
                                   completion_token_ids=done.completion_token_ids,
                                   logprobs=[_logprob_entry(entry) for entry in done.logprobs])
        elif (policy := live.get(model)) is not None:  # a model served at run time (e.g. one in training)
            rollout_key = (litellm_params.get("metadata") or {}).get(ROLLOUT_KEY_METADATA)
            done = policy.complete(messages, tools, params, rollout_key=rollout_key, timeout_s=timeout_s)
            body = completion_body(done.model, done.message, done.finish_reason,
                                   prompt_token_ids=done.prompt_token_ids,
                                   completion_token_ids=done.completion_token_ids,
                                   logprobs=[_logprob_entry(entry) for entry in done.logprobs])
        else:
            raise CustomLLMError(status_code=400, message=f"unknown model {PROVIDER}/{model}: Orchard's own models "
                                                          f"are {', '.join(MODELS)}")
    except OrchardError as exc:
        raise CustomLLMError(status_code=exc.status, message=str(exc)) from exc
    return ModelResponse(**body)


def completion_body(model: str, message: dict[str, Any], finish_reason: str, *,
                    prompt_token_ids: list[int] | None = None, completion_token_ids: list[int] | None = None,
                    logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An OpenAI `chat.completion` body, with vLLM's token-id fields (`prompt_token_ids`, per-choice
    `token_ids`) when known. The oracle uses no tokens: its usage is zero."""
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


def _logprob_entry(entry: smollm2.TokenLogprob) -> dict[str, Any]:
    return {"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.text.encode()),
            "top_logprobs": [{"token": text, "logprob": value, "bytes": list(text.encode())}
                             for text, value in entry.top]}


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, (int, float)):
        return float(timeout)
    if isinstance(timeout, httpx.Timeout):
        return timeout.read
    return None
