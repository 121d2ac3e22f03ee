"""mini-swe-agent's native trajectory (`DefaultAgent.serialize()`: `info` + `messages`, each message with
an `extra`) -> Orchard's Trajectory. The native document is kept whole in `extra["mini_swe_agent"]`.

Message by message:
- `system` -> a system step; the first `user` (the rendered instance template) -> a user step.
- `assistant` -> an agent step: content, `reasoning_content`, tool calls (tool-calling mode), metrics from
  `extra.response.usage`, the response id in `extra["response_id"]`, the parsed commands in
  `extra["actions"]`.
- `tool` messages -> observation results of the preceding agent step, linked by `tool_call_id`; in text
  mode the `user` observation messages -> results with `source_call_id` None (ATIF's non-tool action).
- a format error (`user` with `extra.interrupt_type == "FormatError"`) -> a user step; the rejected
  response is in that step's `extra["rejected_response"]`.
- `exit` -> no step: the result of the last agent step's tool calls that got none (the submit command's:
  the submission), the typed `exit_status` (orchard.core.run_status), `extra["submission"]` (and `notes`
  for limits and errors)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from orchard.core.run_status import ExitStatus
from orchard.core.trajectory import (Agent, FinalMetrics, Metrics, Observation, ObservationResult, Step, ToolCall,
                                     Trajectory)
from orchard.harnesses.openai_client import Completion

NATIVE_KEY = "mini_swe_agent"

# The package's exit statuses -> the harness-independent ones Orchard's trajectories use.
EXIT_STATUSES: dict[str, ExitStatus] = {
    "Submitted": "submitted",
    "TimeExceeded": "time_limit",
    "RepeatedFormatError": "format_errors",
    "ModelCallFailed": "model_error",
    "SandboxCallFailed": "sandbox_error",
}


def convert_trajectory(native: dict[str, Any], *, agent: Agent, task_id: str, rollout_key: str | None,
                       wall_time_s: float) -> Trajectory:
    steps: list[Step] = []
    current: Step | None = None  # the agent step that observations attach to
    exit_extra: dict[str, Any] = {}
    responses: list[dict[str, Any]] = []
    for message in native.get("messages", []):
        role, extra = message.get("role"), message.get("extra") or {}
        step_id = len(steps) + 1
        if role == "exit":
            exit_extra = extra
            if current is not None:
                _answer_pending_calls(current, message)
        elif role == "assistant":
            responses.append(extra.get("response") or {})
            current = _agent_step(step_id, message, extra, agent.model_name)
            steps.append(current)
        elif role == "tool" and current is not None:
            _observe(current, message, source_call_id=message.get("tool_call_id"))
        elif role == "user" and extra.get("interrupt_type") == "FormatError":
            responses.append(extra.get("response") or {})
            steps.append(Step(step_id=step_id, source="user", message=_text(message.get("content")),
                              timestamp=_timestamp(extra.get("timestamp")),
                              extra={"interrupt_type": "FormatError", "rejected_response": extra.get("response")}))
            current = None
        elif role == "user" and current is not None and "returncode" in extra:
            _observe(current, message, source_call_id=None)  # text mode: the output of a parsed action
        else:
            steps.append(Step(step_id=step_id, source="system" if role == "system" else "user",
                              message=_text(message.get("content"))))
            current = None
    trajectory = Trajectory(agent=agent, task_id=task_id, rollout_key=rollout_key, steps=steps,
                            final_metrics=_final_metrics(native, responses, len(steps), wall_time_s))
    status = exit_status(native, exit_extra)
    trajectory.exit_status = status
    trajectory.extra.update({"submission": exit_extra.get("submission", ""), NATIVE_KEY: native})
    if status != "submitted":
        trajectory.notes = f"stopped: {exit_extra.get('exit_status', status)}" + (
            f" ({exit_extra['reason']})" if exit_extra.get("reason") else "")
    return trajectory


def exit_status(native: dict[str, Any], exit_extra: dict[str, Any]) -> ExitStatus:
    """The typed status of the package's exit message: `stopped` when the loop ended without one, and
    `agent_error` for a status this adapter does not know (a newer package's)."""
    native_status = exit_extra.get("exit_status", "")
    if exit_extra.get("limit") == "budget_exhausted":
        return "budget_exhausted"
    if native_status == "LimitsExceeded":
        agent_config = native.get("info", {}).get("config", {}).get("agent", {})
        calls = native.get("info", {}).get("model_stats", {}).get("api_calls", 0)
        step_limit = agent_config.get("step_limit") or 0
        return "step_limit" if 0 < step_limit <= calls else "cost_limit"
    if not native_status:
        return "stopped"
    return EXIT_STATUSES.get(native_status, "agent_error")


def _agent_step(step_id: int, message: dict[str, Any], extra: dict[str, Any], model_name: str | None) -> Step:
    response = extra.get("response") or {}
    step_extra: dict[str, Any] = {"actions": [action.get("command") for action in extra.get("actions", [])]}
    if response.get("id"):
        step_extra["response_id"] = response["id"]
    return Step(step_id=step_id, source="agent", timestamp=_timestamp(extra.get("timestamp")),
                model_name=model_name, message=_text(message.get("content")),
                reasoning_content=message.get("reasoning_content"),
                tool_calls=[ToolCall.from_openai(call) for call in message.get("tool_calls") or []],
                metrics=_metrics(response, extra.get("cost")), llm_call_count=1, extra=step_extra)


def _answer_pending_calls(step: Step, exit_message: dict[str, Any]) -> None:
    """The run ended inside this step (the submit command, or a limit): the calls that got no tool message
    get the exit as their result, so every tool call has one (the submission, or the exit status)."""
    answered = {result.source_call_id for result in (step.observation.results if step.observation else [])}
    extra = exit_message.get("extra") or {}
    content = _text(exit_message.get("content")) or str(extra.get("exit_status") or "exit")
    for call in step.tool_calls:
        if call.tool_call_id not in answered:
            if step.observation is None:
                step.observation = Observation()
            step.observation.results.append(ObservationResult(
                source_call_id=call.tool_call_id, content=content,
                extra={"exit_status": extra.get("exit_status")} if extra.get("exit_status") else {}))


def _observe(step: Step, message: dict[str, Any], *, source_call_id: str | None) -> None:
    known = {call.tool_call_id for call in step.tool_calls}
    extra = {key: value for key, value in (message.get("extra") or {}).items() if key in ("returncode",
                                                                                          "exception_info")}
    if source_call_id is not None and source_call_id not in known:
        extra["tool_call_id"] = source_call_id  # answers no call of this step: keep it, unlinked
        source_call_id = None
    if step.observation is None:
        step.observation = Observation()
    step.observation.results.append(ObservationResult(source_call_id=source_call_id,
                                                      content=_text(message.get("content")), extra=extra))


def _metrics(response: dict[str, Any], cost: Any) -> Metrics | None:
    if not response.get("choices"):
        return None
    metrics = Completion.from_body(response, "the recorded response").metrics()
    if metrics.cost_usd is None and isinstance(cost, (int, float)) and cost > 0:
        metrics.cost_usd = float(cost)
    return metrics


def _final_metrics(native: dict[str, Any], responses: list[dict[str, Any]], total_steps: int,
                   wall_time_s: float) -> FinalMetrics:
    metrics = [m for m in (_metrics(response, None) for response in responses) if m is not None]

    def total(name: str) -> Any:
        values = [getattr(m, name) for m in metrics if getattr(m, name) is not None]
        return sum(values) if values else None

    stats = native.get("info", {}).get("model_stats", {})
    cost = stats.get("instance_cost")
    known_cost = float(cost) if isinstance(cost, (int, float)) and cost > 0 else None
    return FinalMetrics(total_prompt_tokens=total("prompt_tokens"),
                        total_completion_tokens=total("completion_tokens"),
                        total_cached_tokens=total("cached_tokens"),
                        total_cost_usd=known_cost if known_cost is not None else total("cost_usd"),
                        total_steps=total_steps, wall_time_s=wall_time_s, n_llm_calls=stats.get("api_calls"))


def _text(content: Any) -> str:
    if isinstance(content, list):  # multimodal parts: their text
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _timestamp(epoch: Any) -> str | None:
    if not isinstance(epoch, (int, float)):
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()
