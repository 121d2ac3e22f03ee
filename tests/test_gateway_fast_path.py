"""The gateway's fast path (orchard/gateway/direct.py) against litellm's path, on real servers: the scripted model
server as a subprocess, and a small stdlib HTTP server of this module that answers with whatever status and
body a test queues (the scripted server only answers 200 or 400). Every comparison runs the same request
through two gateways, one with `fast_path` on and one with it off (litellm), and checks what reached the
server, what came back and what was recorded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchard.core.errors import InvalidRequest, ModelError, ModelRateLimited, ModelUnreachable, OrchardError
from orchard.gateway import Gateway, GatewayConfig, ModelRoute
from orchard.gateway.direct import env_proxy, direct_target
from orchard.gateway.litellm_loader import load_litellm
from tests.running_server import free_port
from tests.test_gateway import TOOLS, USER, load_script, received, scripted  # noqa: F401 (scripted: a fixture)

TOOL_CALL = [{"id": "call-1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]
# What harnesses send: tool calls with null content (as the OpenAI SDK dumps them), tool results, sampling
# and vLLM parameters, a tool_choice without tools, and requests the fast path leaves to litellm.
REQUESTS: dict[str, dict[str, Any]] = {
    "plain": {"messages": USER},
    "tool round trip": {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": TOOL_CALL,
                                             "function_call": None},
                                     {"role": "tool", "tool_call_id": "call-1", "content": "a.py"}],
                        "tools": TOOLS, "tool_choice": "auto", "temperature": 0.0, "max_tokens": 64},
    "tokens and extras": {"messages": [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, *USER],
                          "logprobs": True, "top_logprobs": 1, "seed": 3, "top_k": 5,
                          "extra_body": {"return_token_ids": True}, "reasoning_effort": "low"},
    "tool_choice without tools": {"messages": USER, "tool_choice": "none"},
    "sampling": {"messages": USER, "n": 1, "stop": ["\n\n"], "top_p": 0.9, "presence_penalty": 0.1,
                 "frequency_penalty": 0.2, "logit_bias": {"42": -1}, "max_completion_tokens": 32,
                 "response_format": {"type": "text"}, "parallel_tool_calls": False, "tools": TOOLS},
    "developer role (litellm's)": {"messages": [{"role": "developer", "content": "be brief"}, *USER]},
    "user (litellm drops it)": {"messages": USER, "user": "u-1"},
    "image as a string (litellm's)": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "http://images.invalid/a.png"}]}]},
}
LITELLM_ONLY = {"developer role (litellm's)", "user (litellm drops it)", "image as a string (litellm's)"}


class LitellmCalls:
    """Counts litellm.acompletion calls (the real function still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        litellm = load_litellm()
        real, self.count = litellm.acompletion, 0

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(litellm, "acompletion", counted)


@pytest.fixture
async def gateways() -> AsyncIterator[Callable[..., tuple[Gateway, Gateway]]]:
    """Makes (fast path, litellm's path) gateway pairs, closed (connections too) after the test."""
    made: list[Gateway] = []

    def pair(routes: dict[str, ModelRoute], **config: Any) -> tuple[Gateway, Gateway]:
        made.extend((Gateway(GatewayConfig(models=routes, **config)),
                     Gateway(GatewayConfig(models=routes, fast_path=False, **config))))
        return made[-2], made[-1]

    yield pair
    for gateway in made:
        await gateway.aclose()


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A call record less what differs from call to call (ids, clocks)."""
    record = {key: value for key, value in record.items() if key not in ("id", "latency_s", "started_at")}
    if record.get("response"):
        record["response"] = {key: value for key, value in record["response"].items() if key not in ("id", "created")}
    return record


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
@pytest.mark.parametrize("name", list(REQUESTS))
async def test_sends_answers_and_records_what_litellm_does(scripted, gateways, monkeypatch, name, provider):  # noqa: F811
    route = ModelRoute(model=f"{provider}/scripted", api_base=f"{scripted}/v1", api_key="unused")
    fast, slow = gateways({"m": route})
    load_script(scripted, [{"content": "done", "tool_calls": [{"name": "bash", "arguments": {"cmd": "pwd"}}]}],
                loop=True)
    litellm_calls = LitellmCalls(monkeypatch)
    request = {"model": "m", **REQUESTS[name]}
    answers = []
    for gateway in (fast, slow):
        body = await gateway.complete("k", json.loads(json.dumps(request)))
        answers.append(({k: v for k, v in body.items() if k not in ("id", "created")}, received(scripted)[-1],
                        comparable(gateway.end_rollout("k").calls[0].model_dump(mode="json"))))
    assert litellm_calls.count == (2 if name in LITELLM_ONLY else 1)
    (fast_body, fast_sent, fast_record), (slow_body, slow_sent, slow_record) = answers
    assert fast_sent == slow_sent
    assert fast_body == slow_body
    assert fast_record == slow_record
    assert fast_record["completion_token_ids"] or "return_token_ids" not in fast_sent


# --- errors, retries and timeouts against a server that answers as told ----------------------------------------

class StubServer:
    """A stdlib HTTP server answering POSTs with queued (status, body, delay_s) answers, the last one repeated."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, str, float]] = []
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stub.requests += 1
                status, body, delay = stub.answers.pop(0) if len(stub.answers) > 1 else stub.answers[0]
                time.sleep(delay)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


def completion(content: str) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "stub",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


def openai_error(message: str) -> str:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": None}})


@pytest.mark.parametrize(("status", "body", "error"), [
    (400, openai_error("max_tokens is too large: 99999"), InvalidRequest),
    (401, openai_error("bad key"), ModelError),
    (429, openai_error("slow down"), ModelRateLimited),
    (500, openai_error("engine crashed"), ModelError),
    (503, "upstream unavailable", ModelError),
])
async def test_error_statuses_map_as_through_litellm(stub, gateways, monkeypatch, status, body, error):
    stub.answers = [(status, body, 0.0)]
    fast, slow = gateways({"m": ModelRoute(model="openai/stub", api_base=stub.url, api_key="unused")})
    litellm_calls = LitellmCalls(monkeypatch)
    failures: list[OrchardError] = []
    for gateway in (fast, slow):
        with pytest.raises(error) as caught:
            await gateway.complete("k", {"model": "m", "messages": USER})
        (record,) = gateway.end_rollout("k").calls
        assert record.error == f"{caught.value.code}: {caught.value}" and record.response is None
        failures.append(caught.value)
    assert litellm_calls.count == 1
    assert [type(failure) for failure in failures] == [error, error]
    if status != 503:  # the provider's own message, on both paths
        assert json.loads(body)["error"]["message"] in str(failures[0])
        assert str(failures[0]) == str(failures[1])


async def test_connection_refused_and_timeout_are_unreachable(stub, gateways):
    stub.answers = [(200, completion("late"), 2.0)]
    refused = ModelRoute(model="openai/down", api_base=f"http://127.0.0.1:{free_port()}/v1", api_key="unused")
    slow_route = ModelRoute(model="openai/stub", api_base=stub.url, api_key="unused", timeout_s=0.3)
    for gateway in gateways({"down": refused, "slow": slow_route}):
        with pytest.raises(ModelUnreachable, match="cannot reach model 'openai/down'.*api_base"):
            await gateway.complete("k", {"model": "down", "messages": USER})
        # the stub answers after 2 s: the route's 0.3 s timeout, not the answer, ends the call
        with pytest.raises(ModelUnreachable, match=r"did not answer within 0\.3 s"):
            await gateway.complete("k", {"model": "slow", "messages": USER})
        assert [call.error.split(":")[0] for call in gateway.end_rollout("k").calls] == ["model_unreachable"] * 2


async def test_retries_like_litellm(stub, gateways):
    """num_retries more attempts of a failed call: a 500 is retried at once and the third attempt answers."""
    route = ModelRoute(model="openai/stub", api_base=stub.url, api_key="unused")
    for gateway in gateways({"m": route}, num_retries=2):
        stub.requests = 0
        stub.answers = [(500, openai_error("flaky"), 0.0), (500, openai_error("flaky"), 0.0),
                        (200, completion("third time"), 0.0)]
        body = await gateway.complete("k", {"model": "m", "messages": USER})
        assert body["choices"][0]["message"]["content"] == "third time"
        assert stub.requests == 3
        assert len(gateway.end_rollout("k").calls) == 1  # one call recorded, however many attempts


async def test_other_routes_go_through_litellm(scripted, gateways, monkeypatch):  # noqa: F811
    """Priced models (litellm maps their parameters and prices them), other providers, Orchard's own models, and
    routes without an api_base all take litellm's path."""
    load_script(scripted, [{"content": "ok"}], loop=True)
    routes = {"priced": ModelRoute(model="openai/gpt-4o-mini", api_base=f"{scripted}/v1", api_key="unused"),
              "other": ModelRoute(model="anthropic/claude-x", api_base=f"{scripted}/v1", api_key="unused"),
              "fast": ModelRoute(model="openai/scripted", api_base=f"{scripted}/v1", api_key="unused")}
    gateway, _ = gateways(routes)
    litellm_calls = LitellmCalls(monkeypatch)
    priced = await gateway.complete("k", {"model": "priced", "messages": USER})
    assert priced["choices"][0]["message"]["content"] == "ok" and litellm_calls.count == 1
    assert gateway.calls("k")[0].cost_usd > 0
    with pytest.raises(OrchardError):  # litellm speaks Anthropic's API to it: not found
        await gateway.complete("k", {"model": "other", "messages": USER})
    assert litellm_calls.count == 2
    await gateway.complete("k", {"model": "fast", "messages": USER})
    await gateway.complete("k", {"model": "fast", "messages": USER, "drop_params": True})  # a litellm control
    assert litellm_calls.count == 3
    # routes that never reach a server here: no api_base (litellm's default endpoint), Orchard's own models
    assert direct_target(ModelRoute(model="openai/scripted", api_key="unused")) is None
    assert direct_target(ModelRoute(model="orchard/oracle")) is None
    assert direct_target(ModelRoute(model="hosted_vllm/Qwen/Qwen3-8B", api_base="http://vllm:8000/v1")) is not None


async def test_proxy_from_the_environment_as_litellm(stub, gateways, monkeypatch):
    """HTTP_PROXY is honoured on both paths (the stub stands in for the proxy; the server's name never resolves)."""
    stub.answers = [(200, completion("via the proxy"), 0.0)]
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", stub.url.removesuffix("/v1"))
    env_proxy.cache_clear()
    try:
        route = ModelRoute(model="openai/stub", api_base="http://model.invalid/v1", api_key="unused")
        for gateway in gateways({"m": route}):
            body = await gateway.complete("k", {"model": "m", "messages": USER})
            assert body["choices"][0]["message"]["content"] == "via the proxy"
        assert stub.requests == 2
    finally:
        env_proxy.cache_clear()
