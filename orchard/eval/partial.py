"""A rollout's steps rebuilt from the gateway's records alone, for when the harness could not return its
own trajectory: it was cut off by the trial's deadline, it crashed, or `orchard eval` itself was killed.

The gateway appends every model call to OUT/calls.jsonl as it finishes (the run's per-turn checkpoint), so
whatever happens, the turns the agent completed are on disk. Rebuilding invents nothing: the first call's
request gives the system and user steps; each call's response is one agent step (its text, reasoning and
tool calls with their arguments as the model wrote them); a call's tool results are the `tool` messages of
the next call's request, and other messages appended before it (e.g. a text-mode harness's observations)
become user steps. The turn in flight when the rollout stopped (its tool results never sent) has no
observation."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import (Agent, LLMCall, Metrics, Observation, ObservationResult, Step, ToolCall,
                                     Trajectory)

CALLS_FILE = "calls.jsonl"


def read_calls(out_dir: Path) -> dict[str, list[LLMCall]]:
    """Every recorded call in OUT/calls.jsonl by rollout key (an interrupted last line is skipped)."""
    path = Path(out_dir) / CALLS_FILE
    if not path.exists():
        return {}
    calls: dict[str, list[LLMCall]] = defaultdict(list)
    for call in read_jsonl(path, LLMCall):
        calls[call.rollout_key or ""].append(call)
    return dict(calls)


def trajectory_from_calls(calls: list[LLMCall], agent: Agent) -> Trajectory:
    """The steps `calls` show (see the module docstring), marked partial."""
    trajectory = Trajectory(agent=agent, partial=True)
    answered = [call for call in calls if call.error is None and call.response is not None]
    if not answered:
        return trajectory
    first = answered[0].request_messages or []
    for message in first:
        if message.get("role") in ("system", "user"):
            _append(trajectory, Step(step_id=trajectory.next_step_id, source=message["role"],
                                     message=_text(message.get("content"))))
    for index, call in enumerate(answered):
        step = _agent_step(trajectory.next_step_id, call)
        _append(trajectory, step)
        if index + 1 < len(answered):
            _observe(trajectory, step, call, answered[index + 1])
    return trajectory


def offered_tools(calls: list[LLMCall]) -> list[dict[str, Any]]:
    """The tools the first recorded request offered (OpenAI tool schemas), what `agent.tool_definitions`
    holds for a harness known only by its calls."""
    for call in calls:
        tools = (call.request_params or {}).get("tools")
        if isinstance(tools, list):
            return [tool for tool in tools if isinstance(tool, dict)]
    return []


def _agent_step(step_id: int, call: LLMCall) -> Step:
    message = ((call.response or {}).get("choices") or [{}])[0].get("message") or {}
    tool_calls = [ToolCall.from_openai(raw, default_id=f"call-{step_id}-{index}")
                  for index, raw in enumerate(message.get("tool_calls") or [])]
    return Step(step_id=step_id, source="agent", timestamp=call.started_at, model_name=call.model,
                message=_text(message.get("content")), reasoning_content=message.get("reasoning_content"),
                tool_calls=tool_calls, llm_call_ids=[call.id],
                metrics=Metrics(prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens,
                                cached_tokens=call.cached_tokens, cost_usd=call.cost_usd))


def _observe(trajectory: Trajectory, step: Step, call: LLMCall, following: LLMCall) -> None:
    """The tool results (and other new messages) `following` sent after `call`'s answer."""
    before, after = call.request_messages or [], following.request_messages or []
    appended = after[len(before) + 1:] if after[:len(before)] == before else [
        message for message in after if message.get("role") == "tool"]
    call_ids = {tool_call.tool_call_id for tool_call in step.tool_calls}
    results = []
    for message in appended:
        if message.get("role") == "tool" and message.get("tool_call_id") in call_ids:
            results.append(ObservationResult(source_call_id=message["tool_call_id"],
                                             content=_text(message.get("content"))))
        elif message.get("role") == "user":
            _flush(step, results)
            results = []
            _append(trajectory, Step(step_id=trajectory.next_step_id, source="user",
                                     message=_text(message.get("content"))))
    _flush(step, results)


def _flush(step: Step, results: list[ObservationResult]) -> None:
    if results:
        step.observation = step.observation or Observation()
        step.observation.results.extend(results)


def _append(trajectory: Trajectory, step: Step) -> None:
    trajectory.steps.append(step)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)
