"""The gateway's fast path: a self-hosted OpenAI-compatible server (vLLM, SGLang, the scripted server) called
straight over one pooled aiohttp session (a quarter of httpx's CPU a call), without litellm's per-call
machinery (its logging objects, cost lookup and response metadata cost milliseconds of CPU a call, which
parallel rollouts queue behind).

It applies only where litellm would send the request unchanged, so what reaches the server, what the client
gets back and what is recorded are the same as through litellm:

- the route is `openai/NAME` or `hosted_vllm/NAME` with an `api_base`, and litellm knows nothing of NAME (no
  price, no model-specific parameter mapping: a self-hosted model, whose cost litellm reports as unknown);
- the request's messages are plain: roles system / user / assistant / tool, content a string or text parts
  (image parts with a URL object in user messages), no `cache_control`; its parameters are ones litellm sends
  on as they are (sampling, tools, logprobs, ...) or does not know (vLLM's own, such as `return_token_ids`), not
  ones it maps or consumes (`thinking`, `functions`, `drop_params`, ...).

Everything else goes through litellm (provider.py). The body is litellm's for such a request: keys set to null
in a message are left out, `extra_body` is merged into the body, `tool_choice` is dropped without tools, and
`stream` is false. The response is turned into litellm's `ModelResponse` by litellm's own converter, so its
shape is exactly litellm's. Retries follow litellm's: up to `num_retries` more attempts of any failure, a
rate-limited one with exponential back-off (1, 2, 4, ... 10 s), others at once."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

from orchard.gateway.config import ModelRoute
from orchard.gateway.litellm_loader import load_litellm
from orchard.gateway.wire import ChatCompletionRequest

PROVIDERS = ("openai", "hosted_vllm")
# Parameters litellm sends on as they are to these providers (tests/test_gateway_fast_path.py checks them on
# both); any other parameter litellm knows by name may be mapped, dropped or consumed, so it takes litellm's path.
# Names litellm does not know (vLLM's own, such as return_token_ids) it passes on untouched, and so do we.
PASSED_AS_IS = frozenset({
    "temperature", "top_p", "n", "stop", "max_tokens", "max_completion_tokens", "presence_penalty",
    "frequency_penalty", "logit_bias", "seed", "tools", "tool_choice", "logprobs", "top_logprobs",
    "parallel_tool_calls", "response_format", "reasoning_effort", "top_k", "extra_body"})
# litellm's own controls that are in none of its public lists of parameter names (read from kwargs in main.py).
_UNLISTED_CONTROLS = frozenset({
    "additional_drop_params", "azure_ad_token", "drop_params", "file", "gigachat_access_token", "gigachat_auth_url",
    "gigachat_scope", "mock_delay", "mock_tool_calls", "session_id"})
_PLAIN_ROLES = frozenset({"system", "user", "assistant", "tool"})
_BACKOFF_MAX_S = 10.0


@dataclass(frozen=True)
class DirectTarget:
    """Where the fast path sends a route's calls."""

    provider: str
    model: str  # the name the server knows (the route's model without its provider prefix)
    url: str  # .../chat/completions


class UpstreamStatusError(Exception):
    """The server answered with an error status; carries what provider_error reads (status_code, response.text)."""

    def __init__(self, status_code: int, text: str) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.response = SimpleNamespace(text=text)


def direct_target(route: ModelRoute) -> DirectTarget | None:
    """The fast path's target for `route`, or None where litellm must make the call."""
    return _target(route.model, route.api_base)


@functools.lru_cache(maxsize=256)
def _target(model: str, api_base: str | None) -> DirectTarget | None:
    provider, _, name = model.partition("/")
    if provider not in PROVIDERS or not name or not api_base:
        return None
    prices = load_litellm().model_cost
    if name in prices or model in prices:  # litellm prices it, and may map its parameters: its path
        return None
    return DirectTarget(provider=provider, model=name, url=api_base.rstrip("/") + "/chat/completions")


def api_key(target: DirectTarget, route: ModelRoute) -> str | None:
    """The key litellm would send, or None where litellm would fail on its own (no key for `openai/`)."""
    key = route.resolved_api_key()
    if key is not None:
        return key
    if target.provider == "hosted_vllm":
        return os.environ.get("HOSTED_VLLM_API_KEY") or "fake-api-key"
    return os.environ.get("OPENAI_API_KEY") or None


def request_body(target: DirectTarget, request: ChatCompletionRequest, params: dict[str, Any]) -> dict[str, Any] | None:
    """The body litellm would send for this request, or None where litellm would change it in ways the fast
    path does not repeat (the call then goes through litellm)."""
    if any(key not in PASSED_AS_IS and key in _litellm_names() for key in params):
        return None
    messages = []
    for message in request.messages:
        if not _plain(message):
            return None
        messages.append({key: value for key, value in message.items() if value is not None})
    body: dict[str, Any] = {"model": target.model, "messages": messages}
    body.update((key, value) for key, value in params.items() if value is not None and key != "extra_body")
    extra_body = params.get("extra_body")
    if isinstance(extra_body, dict):
        body.update(extra_body)
    elif extra_body is not None:
        return None
    if not body.get("tools") and not body.get("functions"):
        body.pop("tool_choice", None)
    body["stream"] = False
    return body


def _plain(message: Any) -> bool:
    if not isinstance(message, dict) or message.get("role") not in _PLAIN_ROLES:
        return False
    content = message.get("content")
    if content is None or isinstance(content, str):
        return True
    if not isinstance(content, list):
        return False
    for part in content:
        if not isinstance(part, dict) or "cache_control" in part:
            return False
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind == "image_url" and message["role"] == "user" and isinstance(part.get("image_url"), dict):
            continue
        return False
    return True


@functools.cache
def _litellm_names() -> frozenset[str]:
    """Every request parameter litellm knows by name: OpenAI's and its own."""
    import inspect

    litellm = load_litellm()
    from litellm.constants import OPENAI_CHAT_COMPLETION_PARAMS
    from litellm.types.utils import all_litellm_params

    return frozenset({*all_litellm_params, *OPENAI_CHAT_COMPLETION_PARAMS, *_UNLISTED_CONTROLS,
                      *inspect.signature(litellm.completion).parameters})


class ClientPool:
    """One pooled `aiohttp.ClientSession` per event loop (a session belongs to the loop it was made on)."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary())

    def session(self) -> aiohttp.ClientSession:
        import aiohttp  # on first use: `import orchard.gateway` stays cheap

        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            # no limit on connections at once, idle ones kept for reuse; proxies: env_proxy
            session = self._sessions[loop] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), json_serialize=_dumps)
        return session

    async def aclose(self) -> None:
        """Close every session: the running loop's here, the others' on their own loops where they still run."""
        running = asyncio.get_running_loop()
        for loop, session in list(self._sessions.items()):
            if loop is running:
                await session.close()
            else:
                _close_elsewhere(loop, session)
        self._sessions.clear()

    def close(self) -> None:
        """Close every session from outside their loops (those still open are closed on them)."""
        for loop, session in list(self._sessions.items()):
            _close_elsewhere(loop, session)
        self._sessions.clear()


def _close_elsewhere(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    if session.closed or loop.is_closed():
        return
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(session.close(), loop)
    else:
        loop.run_until_complete(session.close())


@functools.lru_cache(maxsize=256)
def env_proxy(url: str) -> tuple[Any, Any]:
    """(proxy, proxy auth) for `url` from the environment (HTTP_PROXY, NO_PROXY, ...), as litellm's aiohttp
    transport takes them; looked up once per server (aiohttp's trust_env looks again on every request)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def post_completion(pool: ClientPool, target: DirectTarget, key: str | None, body: dict[str, Any], *,
                          timeout_s: float, num_retries: int) -> dict[str, Any]:
    """POST `body`, retrying as litellm does; return the response as litellm's ModelResponse dumps it. Raises
    the transport's error (aiohttp's, TimeoutError) or an UpstreamStatusError (provider.provider_error
    classifies them)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    proxy, proxy_auth = env_proxy(target.url)
    attempt, backoff = 0, None
    while True:
        try:
            async with pool.session().post(target.url, json=body, headers=headers, timeout=timeout, proxy=proxy,
                                           proxy_auth=proxy_auth) as response:
                data = await response.read()
            if response.status >= 400:
                raise UpstreamStatusError(response.status, data.decode("utf-8", "replace"))
            return _as_litellm_dump(json.loads(data))
        except (aiohttp.ClientError, TimeoutError, UpstreamStatusError, ValueError) as exc:
            attempt += 1
            if attempt > num_retries:
                raise
            if backoff is None:  # litellm picks its strategy from the first failure
                backoff = isinstance(exc, UpstreamStatusError) and exc.status_code == 429
            if backoff:
                await asyncio.sleep(min(_BACKOFF_MAX_S, 2.0 ** (attempt - 1)))


def _as_litellm_dump(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("choices"), list):
        raise ValueError(f"the server's answer is not a chat completion: {str(raw)[:200]}")
    from litellm import ModelResponse
    from litellm.utils import convert_to_model_response_object

    return convert_to_model_response_object(response_object=raw, model_response_object=ModelResponse()).model_dump()
