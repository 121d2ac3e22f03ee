"""Credit assignment, the optional LLM judge: one OpenAI-compatible call per failed rollout (through the
gateway, like any model call: recorded and budgeted under its own rollout key) that reads the task, the gold
patch, the FAIL_TO_PASS tests and the agent's steps, and answers one value in 0..1 per agent step: how close
the agent was to the solution after that step. Its values are mixed with the proxies' under the name
`judge` (CreditSettings.proxy_weights)."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from orchard.core.errors import InvalidRequest
from orchard.core.harness import ModelConfig
from orchard.core.task import SWETestsGrader, Task
from orchard.core.trajectory import Trajectory
from orchard.harnesses.openai_client import ChatClient
from orchard.recipes.credit.proxies import agent_steps

EXCERPT_CHARS = 400
SYSTEM_PROMPT = (
    "You judge the progress of a software engineering agent that failed its task. You are given the task, the "
    "reference solution (a patch), the tests it must make pass, and the agent's steps: each step's tool calls and "
    "their results. For every step, give one number from 0 to 1: how close the agent was to the reference solution "
    "after that step (0: no progress; 1: the solution is in place). Progress includes finding and reading the "
    "right code and making the right change. Answer with JSON only: {\"values\": [v1, v2, ...]}, one value per step.")


class JudgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="the judge model, as the gateway knows it")
    base_url: str = Field(description="the gateway's OpenAI-compatible URL (…/v1)")
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=120, gt=0)


def judge_messages(trajectory: Trajectory, task: Task) -> list[dict[str, Any]]:
    grader = task.grader
    gold = grader.reference_patch if isinstance(grader, SWETestsGrader) else None
    tests = grader.fail_to_pass if isinstance(grader, SWETestsGrader) else []
    lines = [f"<task>\n{task.instruction}\n</task>", f"<reference_patch>\n{gold or '(none)'}\n</reference_patch>",
             f"<tests>\n{chr(10).join(tests)}\n</tests>", "<steps>"]
    for number, step in enumerate(agent_steps(trajectory), start=1):
        results = {r.source_call_id: r.content for r in (step.observation.results if step.observation else [])}
        calls = "; ".join(f"{c.function_name}({_cut(c.raw_arguments or json.dumps(c.arguments))}) -> "
                          f"{_cut(str(results.get(c.tool_call_id) or ''))}" for c in step.tool_calls)
        lines.append(f"Step {number}: {calls or _cut(str(step.message)) or '(no action)'}")
    lines.append("</steps>")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(lines)}]


def parse_values(content: str, steps: int) -> list[float]:
    """The judge's values: the first JSON object with `values`, one number per step, clamped to 0..1."""
    match = re.search(r"\{.*\}", content or "", re.S)
    try:
        values = json.loads(match.group(0))["values"] if match else None
    except (ValueError, KeyError, TypeError):
        values = None
    if not isinstance(values, list) or len(values) != steps or not all(isinstance(v, (int, float)) for v in values):
        raise InvalidRequest(f"the judge did not answer {steps} values as {{\"values\": [...]}}: {content[:200]!r}")
    return [min(1.0, max(0.0, float(v))) for v in values]


async def judge_values(trajectory: Trajectory, task: Task, config: JudgeConfig) -> list[float]:
    """One judge call for `trajectory`; its rollout key at the gateway is the trajectory's + `:judge`."""
    model = ModelConfig(model=config.model, base_url=config.base_url, api_key=config.api_key,
                        rollout_key=f"{trajectory.rollout_key}:judge", timeout_s=config.timeout_s)
    async with ChatClient(model) as client:
        completion = await client.complete(judge_messages(trajectory, task), params={"temperature": 0})
    return parse_values(completion.content or "", len(agent_steps(trajectory)))


def _cut(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"
