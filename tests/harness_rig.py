"""What the harness tests run on, all real: the scripted OpenAI-compatible model server (a stand-in for
the model only: it replays a fixed script of replies) served by uvicorn on a free port, the real gateway in
front of it (the evaluator's LocalGateway, with its API key), and swe-mini tasks in real embedded
sandboxes prepared as the evaluator prepares them (orchard.eval: the repository placed at /testbed and
committed, Orchard's Python first on PATH), graded as it grades them (a fresh sandbox, test patch, tests)."""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from orchard.core.harness import ModelConfig
from orchard.core.task import Task
from orchard.core.trajectory import LLMCall, Outcome, Trajectory
from orchard.eval.grading import grade_swe_patch
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.suites import load_suite
from orchard.eval.patch import extract_patch, snapshot_base
from orchard.eval.task_sandbox import create_task_sandbox
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.client import AsyncOrchard
from orchard.testing.scripted_model import create_scripted_app
from orchard.testing.scripted_script import Script
from orchard.util.uvicorn_thread import ServerThread

SWE_MINI_DIR = Path(__file__).resolve().parents[1] / "eval" / "swe-mini"
POLICY = "policy"  # the gateway alias the harnesses are given as their model
# The swe-mini tasks a harness's oracle test runs: the oracle plays every task the same way (apply the reference
# patch, show the diff, submit), so what differs between tasks is only the patch's text, which the harness's own
# tool must carry intact; these three hold every kind of character that could be mangled on the way ($, `, \,
# quotes, !, non-ASCII). The whole suite runs end to end once, through mini-swe-agent's own CLI
# (tests/test_harness_cli.py).
ORACLE_SAMPLE = ["orchard__envfile-47", "orchard__pinspec-41", "orchard__inkpost-219"]
START_TIMEOUT_S = 30


@dataclass
class ScriptedModel:
    url: str

    def load(self, responses: list[dict[str, Any]], **options: Any) -> None:
        """Replace the script (and start over); `options` are Script fields such as `loop`."""
        response = httpx.put(f"{self.url}/v1/script", json={"responses": responses, **options}, timeout=10)
        response.raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/v1/script/requests", timeout=10).json()


@contextlib.contextmanager
def scripted_model() -> Iterator[ScriptedModel]:
    """The scripted server on a free loopback port, in a thread of this process. At its stop nothing waits for
    its answers any more, so a delayed one still in flight (a test's `delay_s` past a timeout) is cut after
    1 s instead of holding the module's teardown for the 10 s stop timeout."""
    app = create_scripted_app(Script.parse([{"content": "no script loaded yet"}]))
    with ServerThread(app, what="the scripted model server", start_timeout_s=START_TIMEOUT_S,
                      stop_timeout_s=10, timeout_graceful_shutdown=1) as server:
        yield ScriptedModel(server.url)


SCRIPTED = "scripted"  # the evaluator's gateway alias for the scripted server in eval tests


def scripted_config(model: ScriptedModel) -> GatewayConfig:
    """An evaluation's gateway config serving the scripted server as the model `scripted`."""
    return GatewayConfig(models={SCRIPTED: ModelRoute(model="openai/scripted", api_base=f"{model.url}/v1",
                                                      api_key="unused")})


@contextlib.contextmanager
def gateway_in_front_of(scripted: ScriptedModel) -> Iterator[LocalGateway]:
    """The real gateway (HTTP, API key) routing the alias `policy` to the scripted server through litellm,
    and `down` to a port where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    config = GatewayConfig(models={
        POLICY: ModelRoute(model="openai/scripted", api_base=f"{scripted.url}/v1", api_key="unused"),
        "down": ModelRoute(model="openai/down", api_base=f"http://127.0.0.1:{dead_port}/v1", api_key="unused"),
    })
    with LocalGateway(config) as gateway:
        yield gateway


def model_config(gateway: LocalGateway, model: str = POLICY, **fields: Any) -> ModelConfig:
    """What the evaluator hands a harness: the gateway's URL and key, and a fresh rollout key."""
    return ModelConfig(model=model, base_url=gateway.base_url, api_key=gateway.api_key,
                       rollout_key=f"test-{uuid.uuid4().hex[:12]}", timeout_s=30, **fields)


def swe_mini_task(instance_id: str) -> Task:
    return load_suite(SWE_MINI_DIR).get(instance_id)


_BASE_TREES: dict[str, str] = {}  # sandbox id -> the snapshot the evaluator takes after setup


@contextlib.asynccontextmanager
async def task_sandbox(orch: AsyncOrchard, task: Task):
    """A task's sandbox as the evaluator makes it: set up, and its base snapshot taken."""
    sandbox = await create_task_sandbox(orch, task)
    try:
        _BASE_TREES[sandbox.id] = await snapshot_base(sandbox, task.environment.workdir)
        yield sandbox
    finally:
        await sandbox.close()


async def grade(orch: AsyncOrchard, task: Task, sandbox: AgentSandbox) -> tuple[str, Outcome]:
    """The agent's patch (as the evaluator takes it) and its grade in a fresh sandbox."""
    patch = await extract_patch(sandbox, task.environment.workdir, _BASE_TREES[sandbox.id])
    return patch, await grade_swe_patch(orch, task, patch)


def tool_calls(*calls: tuple[str, dict[str, Any]], content: str | None = None,
               reasoning: str | None = None) -> dict[str, Any]:
    """One scripted reply that makes the given tool calls."""
    reply: dict[str, Any] = {"tool_calls": [{"name": name, "arguments": arguments} for name, arguments in calls]}
    if content is not None:
        reply["content"] = content
    if reasoning is not None:
        reply["reasoning_content"] = reasoning
    return reply


def assert_valid_and_linked(trajectory: Trajectory) -> None:
    """The trajectory survives a JSON round trip and every observation answers a tool call of its step."""
    assert Trajectory.model_validate_json(trajectory.model_dump_json()) == trajectory
    for step in trajectory.steps:
        call_ids = {call.tool_call_id for call in step.tool_calls}
        for result in step.observation.results if step.observation else []:
            assert result.source_call_id in call_ids, (step.step_id, result.source_call_id, call_ids)


def assert_recorded(calls: list[LLMCall], trajectory: Trajectory, rollout_key: str) -> None:
    """The gateway recorded one call per agent step under the rollout key, and each step's response id is
    the id of the response recorded for its call."""
    agent_steps = [step for step in trajectory.steps if step.source == "agent"]
    assert len(calls) == len(agent_steps) and calls
    assert {call.rollout_key for call in calls} == {rollout_key}
    assert all(call.error is None and call.model == POLICY for call in calls)
    assert [call.response["id"] for call in calls] == [step.extra["response_id"] for step in agent_steps]
    assert [call.prompt_tokens for call in calls] == [step.metrics.prompt_tokens for step in agent_steps]


def normalized(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages compared by meaning: tool arguments parsed, no content == empty content, no reasoning."""
    result = []
    for message in messages:
        item = {"role": message["role"], "content": message.get("content") or ""}
        if message.get("tool_calls"):
            item["tool_calls"] = [(call["id"], call["function"]["name"], json.loads(call["function"]["arguments"]))
                                  for call in message["tool_calls"]]
        if message.get("tool_call_id"):
            item["tool_call_id"] = message["tool_call_id"]
        result.append(item)
    return result
