"""The OpenAI-compatible chat-completions client the in-process harnesses share.

Harnesses reach models only through `ModelConfig.base_url` (normally the Orchard gateway, which records
each call under the rollout key that `ModelConfig.headers()` carries). This client sends one
`POST {base_url}/chat/completions`, turns every failure into a typed Orchard error, and parses the answer
into a `Completion` that knows how to become an assistant message and ATIF step metrics."""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import BaseModel, Field

from orchard.core.errors import (
    InvalidRequest,
    ModelError,
    ModelRateLimited,
    ModelUnreachable,
    OrchardError,
    error_from_code,
    exception_text,
)
from orchard.core.harness import ModelConfig
from orchard.core.trajectory import Metrics, ToolCall


class CompletionToolCall(BaseModel):
    id: str
    name: str
    arguments: str = Field(description="the JSON text the model produced, as it produced it")

    def parsed_arguments(self) -> tuple[dict[str, Any], str | None]:
        """The arguments as an object, and why they are not one when the model wrote something else."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError as exc:
            return {}, f"the arguments are not valid JSON ({exc})"
        if not isinstance(value, dict):
            return {}, f"the arguments must be a JSON object, got {type(value).__name__}"
        return value, None

    def to_trajectory(self) -> ToolCall:
        """The call as the trajectory records it: parsed `arguments` plus the text the model wrote, which
        is what training replays (malformed text included, with the problem in `extra["argument_error"]`)."""
        arguments, problem = self.parsed_arguments()
        return ToolCall(tool_call_id=self.id, function_name=self.name, arguments=arguments,
                        raw_arguments=self.arguments, extra={"argument_error": problem} if problem else {})

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class Completion(BaseModel):
    """The first choice of a `chat.completion` body, plus the usage and token data of the call."""

    response_id: str | None
    content: str | None
    reasoning_content: str | None
    tool_calls: list[CompletionToolCall]
    finish_reason: str | None
    usage: dict[str, Any]
    body: dict[str, Any] = Field(description="the response as returned")

    @classmethod
    def from_body(cls, body: Any, where: str) -> Completion:
        choices = body.get("choices") if isinstance(body, dict) else None
        if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
            raise ModelError(f"{where} answered without a message in `choices` (got {str(body)[:300]!r}); the "
                             "server is not OpenAI-compatible or failed silently")
        choice = choices[0]
        message = choice["message"]
        calls = []
        for position, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            arguments = function.get("arguments")
            calls.append(CompletionToolCall(
                id=call.get("id") or f"call_{position}", name=function.get("name") or "",
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments or {})))
        return cls(response_id=body.get("id"), content=message.get("content"),
                   reasoning_content=message.get("reasoning_content"), tool_calls=calls,
                   finish_reason=choice.get("finish_reason"), usage=body.get("usage") or {}, body=body)

    def assistant_message(self) -> dict[str, Any]:
        """The assistant turn to send back in the next request: what the model said, as it said it.
        Reasoning stays out: several APIs refuse it in requests, and the trajectory keeps it."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return message

    @property
    def total_tokens(self) -> int:
        return int(self.usage.get("prompt_tokens") or 0) + int(self.usage.get("completion_tokens") or 0)

    def metrics(self) -> Metrics:
        """ATIF step metrics from `usage`, and token ids / logprobs when the server returned them (vLLM's
        `return_token_ids`, OpenAI `logprobs`)."""
        choice = self.body["choices"][0]
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [entry.get("logprob") for entry in entries]
        details = self.usage.get("prompt_tokens_details") or {}
        cost = self.usage.get("cost")
        return Metrics(
            prompt_tokens=self.usage.get("prompt_tokens"), completion_tokens=self.usage.get("completion_tokens"),
            cached_tokens=details.get("cached_tokens"),
            cost_usd=float(cost) if isinstance(cost, (int, float)) and cost >= 0 else None,
            prompt_token_ids=self.body.get("prompt_token_ids"), completion_token_ids=choice.get("token_ids"),
            logprobs=logprobs if logprobs and all(isinstance(v, (int, float)) for v in logprobs) else None)


class ChatClient:
    """Async client of one OpenAI-compatible endpoint for one ModelConfig. Use `async with`, or `aclose()`."""

    def __init__(self, model: ModelConfig) -> None:
        if not model.base_url:
            raise InvalidRequest("the model config has no base_url: harnesses call models through an "
                                 "OpenAI-compatible endpoint, normally the Orchard gateway (e.g. "
                                 "http://127.0.0.1:4000/v1)")
        self.model = model
        self.url = model.base_url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json", **model.headers()}
        if model.api_key is not None:
            headers["Authorization"] = f"Bearer {model.api_key.get_secret_value()}"
        # trust_env=False: a proxy from the environment must not sit between a harness and its gateway.
        # A plain-http gateway (the usual, on loopback) needs no CA bundle, whose loading costs ~15-20 ms of
        # CPU per rollout; https keeps full verification.
        verify = not self.url.startswith("http://")
        self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(model.timeout_s, connect=10),
                                         trust_env=False, verify=verify)

    async def complete(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                       params: dict[str, Any] | None = None) -> Completion:
        """One chat completion. `params` are request fields (e.g. a harness config's defaults); the model
        config's sampling parameters override them. Raises ModelUnreachable, ModelError, BudgetExceeded,
        InvalidRequest (the server refused the request)."""
        body: dict[str, Any] = {**(params or {}), "model": self.model.model, "messages": messages}
        sampling = self.model.sampling.request_kwargs()
        body.update(sampling.pop("extra_body", {}))  # as the OpenAI SDK does: extra_body fields go top-level
        body.update(sampling)
        if tools:
            body["tools"] = tools
        where = f"the model endpoint {self.model.base_url}"
        try:
            response = await self._client.post(self.url, content=json.dumps(body))
        except httpx.TimeoutException:
            raise ModelUnreachable(f"{where} did not answer within {self.model.timeout_s:g} s; check that it is "
                                   "up and not overloaded, or raise ModelConfig.timeout_s") from None
        except httpx.TransportError as exc:
            raise ModelUnreachable(f"cannot reach {where}: {exception_text(exc)}; check that the gateway "
                                   "(or model server) is running and that base_url is right") from None
        if response.status_code >= 400:
            raise _http_error(response, where)
        try:
            answer = response.json()
        except ValueError:
            raise ModelError(f"{where} answered {response.status_code} with a body that is not JSON: "
                             f"{response.text[:300]!r}") from None
        return Completion.from_body(answer, where)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _http_error(response: httpx.Response, where: str) -> OrchardError:
    """The typed error for an error answer: the gateway's `{"error": CODE, "message": ...}` keeps its type;
    other servers' errors (OpenAI's `{"error": {"message": ...}}`, plain text) are classified by status."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str) and isinstance(body.get("message"), str):
        return error_from_code(body["error"], f"{where} answered {response.status_code}: {body['message']}")
    message = response.text[:500]
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
        message = str(body["error"]["message"])[:500]
    text = f"{where} answered {response.status_code}: {message}"
    if response.status_code == 429:
        return ModelRateLimited(text + "; retry later")
    if 400 <= response.status_code < 500:
        return InvalidRequest(text)
    return ModelError(text)
