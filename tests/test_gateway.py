"""The model gateway end to end on real servers: the scripted model server as a subprocess (the backend,
reached by litellm as `openai/scripted` with its api_base), the gateway on a real uvicorn server in front of
it, and real clients (the OpenAI SDK, httpx) in front of that."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from orchard.core.errors import BudgetExceeded, InvalidRequest, ModelError, ModelUnreachable, NotFound
from orchard.core.harness import ROLLOUT_KEY_HEADER
from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import LLMCall
from orchard.gateway import Budget, Gateway, GatewayConfig, ModelRoute, create_app
from orchard.testing.scripted_script import byte_tokens, render_prompt
from orchard.util.uvicorn_thread import ServerThread
from tests.running_server import free_port

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "list the files"}]
START_TIMEOUT_S = 30


# --- servers ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> Iterator[str]:
    """`python -m orchard.testing.scripted_model` on a free port; tests load their own script with PUT /v1/script."""
    directory = tmp_path_factory.mktemp("scripted")
    script = directory / "script.json"
    script.write_text(json.dumps([{"content": "ready"}]))
    port = free_port()
    log = directory / "scripted.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "orchard.testing.scripted_model", "--script", str(script),
                                    "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_health(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """A real uvicorn server for `app` on a free port, in a thread of this process."""
    with ServerThread(app, what="the gateway's uvicorn server", start_timeout_s=START_TIMEOUT_S * 2) as server:
        yield server.url  # the first start imports litellm


def gateway_config(scripted_url: str, **overrides: Any) -> GatewayConfig:
    base = f"{scripted_url}/v1"
    return GatewayConfig(**{"models": {
        # what a training run configures for its policy: token ids and logprobs on every call
        "policy": ModelRoute(model="openai/scripted", api_base=base, api_key="unused",
                             params={"logprobs": True, "extra_body": {"return_token_ids": True}}),
        "plain": ModelRoute(model="hosted_vllm/scripted", api_base=base),
        "down": ModelRoute(model="openai/down", api_base=f"http://127.0.0.1:{free_port()}/v1", api_key="unused"),
        "slow": ModelRoute(model="openai/scripted", api_base=base, api_key="unused", timeout_s=0.5),
    }, **overrides})


@pytest.fixture(scope="module")
def gateway(scripted) -> Iterator[tuple[Gateway, str]]:
    gw = Gateway(gateway_config(scripted))
    with serving(create_app(gw)) as url:
        yield gw, url


@pytest.fixture
def gw_url(gateway) -> str:
    return gateway[1]


def load_script(scripted_url: str, responses: list[dict[str, Any]], **options: Any) -> None:
    response = httpx.put(f"{scripted_url}/v1/script", json={"responses": responses, **options})
    assert response.status_code == 200, response.text


def received(scripted_url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{scripted_url}/v1/script/requests").json()


def end_rollout(gw_url: str, key: str) -> dict[str, Any]:
    response = httpx.delete(f"{gw_url}/v1/rollouts/{key}")
    assert response.status_code == 200, response.text
    return response.json()


def chat(gw_url: str, key: str | None, model: str = "policy", **body: Any) -> httpx.Response:
    headers = {ROLLOUT_KEY_HEADER: key} if key else {}
    return httpx.post(f"{gw_url}/v1/chat/completions", headers=headers, timeout=30,
                      json={"model": model, "messages": USER, **body})


def _wait_for_health(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the scripted server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the scripted server did not come up:\n{log.read_text()}")


# --- recording -------------------------------------------------------------------------------------

async def test_records_messages_tool_calls_token_ids_logprobs_and_latency(scripted, gw_url):
    load_script(scripted, [{"tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}], "delay_s": 0.05},
                           {"content": "two files: a.py, b.py"}])
    client = openai.AsyncOpenAI(base_url=f"{gw_url}/v1", api_key="any", max_retries=0,
                                default_headers={ROLLOUT_KEY_HEADER: "rec-1"})
    asked = time.monotonic()
    first = await client.chat.completions.create(model="policy", messages=USER, tools=TOOLS, temperature=0.0)
    waited_s = time.monotonic() - asked
    call = first.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"cmd": "ls"})
    followup = [*USER, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"}]
    second = await client.chat.completions.create(model="policy", messages=followup, tools=TOOLS)
    assert second.choices[0].message.content == "two files: a.py, b.py"
    await client.close()

    records = end_rollout(gw_url, "rec-1")
    assert records["usage"]["calls"] == 2
    calls = [LLMCall.model_validate(c) for c in records["calls"]]
    assert [c.rollout_key for c in calls] == ["rec-1", "rec-1"] and all(c.error is None for c in calls)
    tool_call_record, answer_record = calls
    assert tool_call_record.model == "policy" and tool_call_record.extra["provider_model"] == "openai/scripted"
    assert tool_call_record.request_messages == USER
    assert tool_call_record.request_params["tools"] == TOOLS
    assert tool_call_record.request_params["temperature"] == 0.0
    assert tool_call_record.request_params["extra_body"] == {"return_token_ids": True}  # the route's default
    recorded_call = tool_call_record.response["choices"][0]["message"]["tool_calls"][0]
    assert recorded_call["function"]["name"] == "bash" and recorded_call["id"] == call.id
    # token ids and logprobs passed through from the backend (the scripted server tokenizes bytes)
    expected_completion = byte_tokens(json.dumps({"name": "bash", "arguments": json.dumps({"cmd": "ls"})}))
    assert tool_call_record.completion_token_ids == expected_completion
    assert tool_call_record.prompt_token_ids == byte_tokens(render_prompt(USER, TOOLS))
    assert tool_call_record.logprobs == [0.0] * len(expected_completion)
    assert tool_call_record.prompt_tokens == len(tool_call_record.prompt_token_ids)
    assert tool_call_record.completion_tokens == len(expected_completion)
    assert "prompt_token_ids" not in tool_call_record.response  # moved out, not duplicated
    assert answer_record.completion_token_ids == byte_tokens("two files: a.py, b.py")
    assert answer_record.request_messages[-1] == {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"}
    # the latency covers the model's time (the script's 0.05 s) and lies within what the client waited
    assert 0.05 <= tool_call_record.latency_s <= waited_s
    datetime.fromisoformat(tool_call_record.started_at)
    assert tool_call_record.cost_usd is None  # litellm has no price for a model named "scripted"
    assert records["usage"]["total_tokens"] == sum(c.prompt_tokens + c.completion_tokens for c in calls)
    sent = received(scripted)[-2]  # what reached the backend: the client's and the route's fields, none of litellm's
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["temperature"] == 0.0
    assert not {"num_retries", "max_retries", "api_key", "api_base", "timeout"} & set(sent)


def test_cost_is_recorded_when_litellm_knows_the_price(scripted, gateway):
    gw, url = gateway
    gw.config.models["priced"] = ModelRoute(model="openai/gpt-4o-mini", api_base=f"{scripted}/v1", api_key="unused")
    try:
        load_script(scripted, [{"content": "hello"}])
        assert chat(url, "cost-1", model="priced").status_code == 200
    finally:
        del gw.config.models["priced"]
    (call,) = gw.end_rollout("cost-1").calls
    assert call.cost_usd is not None and call.cost_usd > 0


def test_rollout_key_from_the_path_prefix(scripted, gw_url):
    load_script(scripted, [{"content": "from a sandboxed harness"}], loop=True)
    client = openai.OpenAI(base_url=f"{gw_url}/r/sandbox-7/v1", api_key="any", max_retries=0)
    # the configured aliases and Orchard's built-in models (orchard/policies)
    assert [m.id for m in client.models.list()] == ["down", "oracle", "plain", "policy", "slow", "smollm2"]
    reply = client.chat.completions.create(model="plain", messages=USER)
    assert reply.choices[0].message.content == "from a sandboxed harness"
    client.close()
    (call,) = end_rollout(gw_url, "sandbox-7")["calls"]
    assert call["rollout_key"] == "sandbox-7" and call["model"] == "plain"
    assert call["prompt_token_ids"] is None  # this route does not ask for token ids

    # a client cannot redirect the gateway: routing fields in the body are dropped
    redirected = httpx.post(f"{gw_url}/r/sandbox-8/v1/chat/completions",
                            json={"model": "plain", "messages": USER, "api_base": "http://127.0.0.1:9/v1"})
    assert redirected.status_code == 200, redirected.text
    end_rollout(gw_url, "sandbox-8")

    conflicting = httpx.post(f"{gw_url}/r/a/v1/chat/completions", headers={ROLLOUT_KEY_HEADER: "b"},
                             json={"model": "plain", "messages": USER})
    assert conflicting.status_code == 400 and "make them agree" in conflicting.json()["message"]


def test_streaming_request_gets_the_recorded_completion_as_events(scripted, gw_url):
    load_script(scripted, [{"content": "streamed answer",
                            "tool_calls": [{"name": "bash", "arguments": {"cmd": "pwd"}}]}])
    client = openai.OpenAI(base_url=f"{gw_url}/r/stream-1/v1", api_key="any", max_retries=0)
    chunks = list(client.chat.completions.create(model="policy", messages=USER, tools=TOOLS, stream=True,
                                                 stream_options={"include_usage": True}))
    client.close()
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tool_deltas = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert content == "streamed answer"
    assert tool_deltas[0].function.name == "bash" and json.loads(tool_deltas[0].function.arguments) == {"cmd": "pwd"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    (call,) = end_rollout(gw_url, "stream-1")["calls"]
    assert call["completion_token_ids"] == byte_tokens(
        "streamed answer" + json.dumps({"name": "bash", "arguments": json.dumps({"cmd": "pwd"})}))


def test_calls_without_a_key_are_recorded_as_unkeyed(scripted, gateway):
    gw, url = gateway
    load_script(scripted, [{"content": "no key"}])
    assert chat(url, None, model="plain").status_code == 200
    assert [c.response["choices"][0]["message"]["content"] for c in gw.end_rollout("unkeyed").calls] == ["no key"]


async def test_in_process_use_and_the_jsonl_record_file(scripted, tmp_path):
    load_script(scripted, [{"content": "in process"}])
    record_file = tmp_path / "calls.jsonl"
    gw = Gateway(gateway_config(scripted, record_path=record_file))
    try:
        body = await gw.complete("inproc", {"model": "policy", "messages": USER})
        assert body["choices"][0]["message"]["content"] == "in process"
        assert [c.id for c in gw.calls("inproc")] == [c.id for c in read_jsonl(record_file, LLMCall)]
        with pytest.raises(InvalidRequest, match="messages"):
            await gw.complete("inproc", {"model": "policy", "messages": []})
        with pytest.raises(InvalidRequest, match="invalid rollout key"):
            await gw.complete("has space", {"model": "policy", "messages": USER})
        records = gw.end_rollout("inproc")
        assert len(records.calls) == 1 and gw.calls("inproc") == []
        with pytest.raises(NotFound, match="never started"):
            gw.end_rollout("inproc")
    finally:
        gw.close()


# --- budgets ---------------------------------------------------------------------------------------

def test_call_budget_refuses_with_429_naming_the_budget(scripted, gw_url):
    load_script(scripted, [{"content": "ok"}], loop=True)
    started = httpx.post(f"{gw_url}/v1/rollouts/budget-calls", json={"max_calls": 2})
    assert started.status_code == 200 and started.json()["budget"]["max_calls"] == 2
    before = len(received(scripted))
    assert [chat(gw_url, "budget-calls").status_code for _ in range(2)] == [200, 200]
    refused = chat(gw_url, "budget-calls")
    assert refused.status_code == 429
    assert refused.json()["error"] == "budget_exceeded"
    assert "budget of 2 model calls (max_calls)" in refused.json()["message"]
    assert len(received(scripted)) == before + 2  # the refused call never reached the model
    assert len(end_rollout(gw_url, "budget-calls")["calls"]) == 2


def test_token_budget_lets_the_crossing_call_finish_then_refuses(scripted, gw_url):
    load_script(scripted, [{"content": "x" * 40}], loop=True)
    httpx.post(f"{gw_url}/v1/rollouts/budget-tokens", json={"max_total_tokens": 30})
    assert chat(gw_url, "budget-tokens").status_code == 200
    refused = chat(gw_url, "budget-tokens")
    assert refused.status_code == 429 and "max_total_tokens" in refused.json()["message"]
    state = httpx.get(f"{gw_url}/v1/rollouts/budget-tokens").json()
    assert state["usage"]["total_tokens"] > 30 and len(state["calls"]) == 1
    # a larger budget lets the rollout go on, usage kept
    assert httpx.post(f"{gw_url}/v1/rollouts/budget-tokens", json={"max_total_tokens": 10_000}).status_code == 200
    assert chat(gw_url, "budget-tokens").status_code == 200
    assert len(end_rollout(gw_url, "budget-tokens")["calls"]) == 2


def test_wall_time_budget(scripted, gw_url):
    load_script(scripted, [{"content": "ok"}], loop=True)
    httpx.post(f"{gw_url}/v1/rollouts/budget-wall", json={"max_wall_time_s": 0.3})
    assert chat(gw_url, "budget-wall").status_code == 200
    time.sleep(0.35)
    refused = chat(gw_url, "budget-wall")
    assert refused.status_code == 429 and "max_wall_time_s" in refused.json()["message"]
    end_rollout(gw_url, "budget-wall")


async def test_concurrent_calls_cannot_overshoot_the_call_budget(scripted, gateway):
    gw, _ = gateway
    load_script(scripted, [{"content": "ok", "delay_s": 0.1}], loop=True)
    gw.start_rollout("budget-concurrent", Budget(max_calls=3))
    results = await asyncio.gather(*(gw.complete("budget-concurrent", {"model": "plain", "messages": USER})
                                     for _ in range(6)), return_exceptions=True)
    assert sum(isinstance(r, dict) for r in results) == 3
    assert sum(isinstance(r, BudgetExceeded) for r in results) == 3
    assert len(gw.end_rollout("budget-concurrent").calls) == 3


def test_default_budget_from_the_config(scripted):
    load_script(scripted, [{"content": "ok"}], loop=True)
    gw = Gateway(gateway_config(scripted, default_budget=Budget(max_calls=1)))
    with serving(create_app(gw)) as url:
        assert chat(url, "d").status_code == 200
        assert chat(url, "d").status_code == 429
        assert httpx.post(f"{url}/v1/rollouts/e", json={"max_calls": 2}).json()["budget"]["max_calls"] == 2
        assert httpx.delete(f"{url}/v1/rollouts/never").status_code == 404


# --- errors ----------------------------------------------------------------------------------------

def test_unreachable_backend_is_a_clear_502(gw_url):
    response = chat(gw_url, "down-1", model="down")  # chat's own timeout fails the test on a hang
    assert response.status_code == 502
    body = response.json()
    assert body["error"] == "model_unreachable"
    assert "cannot reach model 'openai/down'" in body["message"] and "api_base" in body["message"]
    (call,) = end_rollout(gw_url, "down-1")["calls"]
    assert call["error"].startswith("model_unreachable") and call["response"] is None


def test_backend_that_does_not_answer_in_time(scripted, gw_url):
    load_script(scripted, [{"content": "too late", "delay_s": 5}])
    response = chat(gw_url, "slow-1", model="slow")  # had the gateway waited, "too late" would be a 200
    assert response.status_code == 502 and response.json()["error"] == "model_unreachable"
    assert "did not answer within 0.5 s" in response.json()["message"]
    end_rollout(gw_url, "slow-1")


def test_unknown_model_lists_the_configured_aliases(gw_url):
    response = chat(gw_url, "k", model="gpt-nope")
    assert response.status_code == 400
    assert response.json() == {"error": "invalid_request", "message": (
        "unknown model 'gpt-nope'; this gateway serves: down, plain, policy, slow (add an alias to the gateway "
        "config's `models`, or set allow_any_model to pass litellm model names on)")}


def test_backend_rejection_keeps_the_backends_message(scripted, gw_url):
    load_script(scripted, [{"content": "only one"}])
    assert chat(gw_url, "rej", model="plain").status_code == 200
    exhausted = chat(gw_url, "rej", model="plain")
    assert exhausted.status_code == 400
    assert "rejected the request (400)" in exhausted.json()["message"]
    assert "responses have all been used" in exhausted.json()["message"]
    end_rollout(gw_url, "rej")


def test_bad_requests_and_routes(gw_url):
    missing = httpx.post(f"{gw_url}/v1/chat/completions", json={"model": "policy"})
    assert missing.status_code == 400 and "messages" in missing.json()["message"]
    assert httpx.post(f"{gw_url}/v1/rollouts/x", json={"max_calls": 0}).status_code == 400
    assert httpx.get(f"{gw_url}/v2/nothing").json()["error"] == "not_found"


def test_api_key_and_required_rollout_key(scripted):
    load_script(scripted, [{"content": "ok"}], loop=True)
    gw = Gateway(gateway_config(scripted, api_key="gw-secret", require_rollout_key=True))
    with serving(create_app(gw)) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200
        denied = httpx.get(f"{url}/v1/models")
        assert denied.status_code == 401 and denied.json()["error"] == "unauthorized"
        auth = {"Authorization": "Bearer gw-secret"}
        assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
        unkeyed = httpx.post(f"{url}/v1/chat/completions", headers=auth, json={"model": "plain", "messages": USER})
        assert unkeyed.status_code == 400 and ROLLOUT_KEY_HEADER in unkeyed.json()["message"]
        keyed = httpx.post(f"{url}/r/k/v1/chat/completions", headers=auth, json={"model": "plain", "messages": USER})
        assert keyed.status_code == 200


async def test_in_process_errors_are_typed(gateway, monkeypatch):
    gw, _ = gateway
    with pytest.raises(ModelUnreachable):
        await gw.complete("typed", {"model": "down", "messages": USER})
    assert gw.end_rollout("typed").calls[0].error is not None
    monkeypatch.delenv("ORCHARD_TEST_PROVIDER_KEY", raising=False)
    route = ModelRoute(model="openai/x", api_key_env="ORCHARD_TEST_PROVIDER_KEY")
    keyless = Gateway(GatewayConfig(models={"m": route}))
    with pytest.raises(ModelError, match="environment variable ORCHARD_TEST_PROVIDER_KEY, which is not set"):
        await keyless.complete("typed", {"model": "m", "messages": USER})


# --- configuration and the scripted server ---------------------------------------------------------

def test_config_files(tmp_path):
    yaml_file = tmp_path / "gateway.yaml"
    yaml_file.write_text(textwrap.dedent("""\
        models:
          policy: {model: hosted_vllm/Qwen/Qwen3-8B, api_base: "http://vllm:8000/v1",
                   params: {extra_body: {return_token_ids: true}}}
        default_budget: {max_calls: 50}
        """))
    config = GatewayConfig.load(yaml_file)
    assert config.models["policy"].params == {"extra_body": {"return_token_ids": True}}
    assert config.default_budget.max_calls == 50
    json_file = tmp_path / "gateway.json"
    json_file.write_text(json.dumps({"models": {"a": {"model": "openai/x", "api_kee": "typo"}}}))
    with pytest.raises(InvalidRequest, match=r"models\.a\.api_kee: unknown field \(not allowed here\)"):
        GatewayConfig.load(json_file)
    with pytest.raises(NotFound):
        GatewayConfig.load(tmp_path / "missing.yaml")


def test_scripted_server_rejects_a_bad_script(scripted, tmp_path):
    bad = httpx.put(f"{scripted}/v1/script", json=[{"finish_reason": "stop"}])
    assert bad.status_code == 400 and "needs `content`, `tool_calls` or both" in bad.json()["message"]
    run = subprocess.run([sys.executable, "-m", "orchard.testing.scripted_model", "--script", str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "does not exist" in run.stderr


async def test_scripted_delays_overlap_for_concurrent_requests(scripted):
    """The per-response delay stands for model time: concurrent requests wait it out side by side, so the
    quick answers come while the slow one (taken first) still waits; one after another, it would come first."""
    load_script(scripted, [{"content": "slow", "delay_s": 3.0}, *[{"content": "quick"}] * 3])
    async with httpx.AsyncClient(timeout=30) as client:
        async def ask() -> str:
            reply = await client.post(f"{scripted}/v1/chat/completions", json={"model": "m", "messages": USER})
            return reply.json()["choices"][0]["message"]["content"]

        in_order_of_arrival = [await reply for reply in asyncio.as_completed([ask() for _ in range(4)])]
    assert in_order_of_arrival == ["quick"] * 3 + ["slow"]


# --- what litellm reaches, and what the gateway costs ------------------------------------------------

@pytest.mark.slow
def test_litellm_reaches_only_the_backend(scripted):
    """A fresh process (so litellm's import is watched too) records every socket connect and address lookup
    with an audit hook while it imports litellm and makes a call through the gateway: all go to loopback."""
    load_script(scripted, [{"content": "ok"}])
    code = textwrap.dedent(f"""
        import asyncio, json, sys
        seen = []
        def hook(event, args):
            if event == "socket.connect":
                seen.append(str(args[1]))
            elif event == "socket.getaddrinfo":
                seen.append(str(args[0]))
        sys.addaudithook(hook)
        from orchard.gateway import Gateway, GatewayConfig, ModelRoute
        gw = Gateway(GatewayConfig(models={{"m": ModelRoute(model="openai/scripted", api_base="{scripted}/v1",
                                                             api_key="unused")}}))
        gw.warm_up()
        body = asyncio.run(gw.complete("k", {{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}))
        print(json.dumps({{"content": body["choices"][0]["message"]["content"], "seen": seen}}))
        """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["content"] == "ok"
    assert result["seen"], "the audit hook saw no connection at all"
    assert all("127.0.0.1" in target for target in result["seen"]), result["seen"]
