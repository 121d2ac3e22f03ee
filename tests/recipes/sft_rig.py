"""Real trajectories and a real tiny student for the training-data and SFT tests: react rollouts on swe-mini in
real embedded sandboxes, through the evaluation's own gateway, with the oracle policy or the scripted model
server (which, like vLLM, returns token ids: its own byte-level ids); a random tiny Qwen3 saved as a model
directory with SmolLM2's tokenizer and chat template."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orchard.core.trajectory import Agent, LLMCall, Outcome, Step, Trajectory
from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3
from orchard.sandbox.client import AsyncOrchard
from tests.running_server import remove_live_sandboxes

PAGEKIT = "orchard__pagekit-112"


def evaluate(directory: Path, *, model: str = "oracle", config: GatewayConfig | None = None,
             tasks: list[str] | None = None, **options: Any) -> Path:
    """A react run on swe-mini into `directory`/run (its home beside it); returns the run directory."""
    home, run = directory / "home", directory / "run"
    home.mkdir(parents=True)

    async def main() -> None:
        async with AsyncOrchard(home=home) as orchard:
            await run_eval(harness="react", model=model, suite="swe-mini", out_dir=run,
                           gateway_config=config or eval_gateway_config(model), task_ids=tasks or [PAGEKIT],
                           orchard_client=orchard, **options)
    try:
        asyncio.run(main())
    finally:
        remove_live_sandboxes(home)
    return run


def scripted_config(url: str) -> GatewayConfig:
    """The scripted server behind the gateway, asked for token ids as a vLLM policy route would be."""
    return GatewayConfig(models={"scripted": ModelRoute(
        model="openai/scripted", api_base=f"{url}/v1", api_key="unused",
        params={"extra_body": {"return_token_ids": True}})})


def tiny_model_dir(directory: Path) -> Path:
    """A random tiny Qwen3 (SmolLM2's vocabulary) and SmolLM2's tokenizer, saved as a model directory."""
    tokenizer = smollm2_tokenizer()
    tiny_qwen3(tokenizer).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def chat_trajectory(replies: list[str], *, resolved: bool | None = True, error: str | None = None,
                    rollout_key: str = "rollout-1", harness: str = "react", model: str = "teacher",
                    copied: set[int] = frozenset()) -> Trajectory:
    """A plain-text conversation (system, user, one agent step per reply), each reply recorded as a model call
    whose request is the conversation so far: the shape every harness records, with known text."""
    steps = [Step(step_id=1, source="system", message="You fix bugs."),
             Step(step_id=2, source="user", message="Fix it.")]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."},
                                      {"role": "user", "content": "Fix it."}]
    calls = []
    for index, reply in enumerate(replies):
        call_id = f"call-{index}"
        calls.append(LLMCall(id=call_id, model=model, request_messages=list(messages),
                             response={"choices": [{"index": 0, "finish_reason": "stop",
                                                    "message": {"role": "assistant", "content": reply}}]}))
        step_id = len(steps) + 1
        steps.append(Step(step_id=step_id, source="agent", message=reply, llm_call_ids=[call_id],
                          is_copied_context=step_id in copied))
        messages.append({"role": "assistant", "content": reply})
        steps.append(Step(step_id=step_id + 1, source="user", message="Go on."))
        messages.append({"role": "user", "content": "Go on."})
    outcome = None if resolved is None and error is None else Outcome(
        resolved=bool(resolved), reward=1.0 if resolved else 0.0, error=error)
    return Trajectory(agent=Agent(name=harness, version="1", model_name=model), steps=steps, llm_calls=calls,
                      task_id="task-1", rollout_key=rollout_key, outcome=outcome)
