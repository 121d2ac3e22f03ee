"""An `LLMCall` record from a request and what the provider answered.

Token ids come from wherever the backend put them: vLLM's `return_token_ids` (`prompt_token_ids` on the
response, `token_ids` on each choice, which litellm may also tuck into `provider_specific_fields`), or
logprob tokens named `token_id:N` (vLLM's `return_tokens_as_token_ids`). Logprobs are OpenAI's
`choices[].logprobs.content[].logprob`. Per-completion fields describe the first choice; every choice stays
in `response`. The token-id arrays are moved out of `response` (not copied) to keep records small."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from typing import Any

from orchard.core.trajectory import LLMCall
from orchard.gateway.wire import ChatCompletionRequest

_TOKEN_ID = re.compile(r"token_id:(\d+)")


def new_call_id() -> str:
    return f"llm-{uuid.uuid4().hex}"


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def success_record(*, call_id: str, rollout_key: str, request: ChatCompletionRequest, params: dict[str, Any],
                   provider_model: str, response: dict[str, Any], cost_usd: float | None, latency_s: float,
                   started_at: str) -> LLMCall:
    recorded = _without_token_ids(response)
    choice = (response.get("choices") or [{}])[0]
    usage = response.get("usage") or {}
    logprob_entries = ((choice.get("logprobs") or {}).get("content")) or []
    return LLMCall(
        id=call_id, rollout_key=rollout_key, model=request.model,
        request_messages=request.messages, request_params=params, response=recorded,
        latency_s=latency_s, started_at=started_at,
        prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
        cached_tokens=((usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
        cost_usd=cost_usd,
        prompt_token_ids=response.get("prompt_token_ids"),
        completion_token_ids=_completion_token_ids(choice, logprob_entries),
        logprobs=_logprobs(logprob_entries),
        extra={"provider_model": provider_model, "response_model": response.get("model")})


def failure_record(*, call_id: str, rollout_key: str, request: ChatCompletionRequest, params: dict[str, Any],
                   provider_model: str, error: str, latency_s: float, started_at: str) -> LLMCall:
    return LLMCall(id=call_id, rollout_key=rollout_key, model=request.model, request_messages=request.messages,
                   request_params=params, latency_s=latency_s, started_at=started_at, error=error,
                   extra={"provider_model": provider_model})


def total_tokens(call: LLMCall) -> int:
    return (call.prompt_tokens or 0) + (call.completion_tokens or 0)


def _completion_token_ids(choice: dict[str, Any], logprob_entries: list[dict[str, Any]]) -> list[int] | None:
    ids = choice.get("token_ids")
    if ids is None:
        ids = (choice.get("provider_specific_fields") or {}).get("token_ids")
    if ids is None and logprob_entries:
        matches = [_TOKEN_ID.fullmatch(str(entry.get("token", ""))) for entry in logprob_entries]
        if all(matches):
            ids = [int(match.group(1)) for match in matches]
    return ids


def _logprobs(entries: list[dict[str, Any]]) -> list[float] | None:
    values = [entry.get("logprob") for entry in entries]
    return values if values and all(isinstance(value, (int, float)) for value in values) else None


def _without_token_ids(response: dict[str, Any]) -> dict[str, Any]:
    """A copy of `response` without the token-id arrays (the record keeps them in their own fields)."""
    recorded = {key: value for key, value in response.items() if key != "prompt_token_ids"}
    choices = []
    for choice in response.get("choices") or []:
        choice = {key: value for key, value in choice.items() if key != "token_ids"}
        extras = choice.get("provider_specific_fields")
        if isinstance(extras, dict) and "token_ids" in extras:
            choice["provider_specific_fields"] = {k: v for k, v in extras.items() if k != "token_ids"}
        choices.append(choice)
    recorded["choices"] = choices
    return recorded
