"""OpenHands events → an Orchard Trajectory, read from the JSON files the SDK persisted
(`events/event-NNNNN-<id>.json`, each one event with its `kind`), with no OpenHands code (it lives only in
the sandbox's bundle).

- `SystemPromptEvent` → the system step (its tools → `agent.tool_definitions`);
- `MessageEvent` from the user (or environment) → a user step; from the agent → an agent step (a reply
  without tool calls);
- `ActionEvent`s → agent steps, one per model response: the SDK makes one event per tool call, all carrying
  the response's `llm_response_id` and the first one its text (`thought`) and reasoning. The tool call is the
  model's own (`tool_call`: id, OpenHands' tool name, the arguments as the model wrote them), not the parsed
  action;
- `ObservationEvent`, `AgentErrorEvent`, `UserRejectObservation` → the result of the tool call they answer,
  with the text the model was shown for it (the driver records the SDK's own rendering in
  observations.jsonl; without it, the event's own text);
- every agent step keeps the response id in `extra["response_id"]`, which the evaluator maps to the
  gateway's record of the call; per-response token usage (from the driver's result) goes in its metrics.

Nothing is invented: a step exists only for an event, and events of kinds that are not part of the
conversation the model saw (state updates, condensations, errors) are counted in `extra["openhands"]`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orchard.core.run_status import ExitStatus
from orchard.core.trajectory import (Agent, Metrics, Observation, ObservationResult, Step, ToolCall,
                                     Trajectory)

FINISH_TOOL = "finish"
OBSERVATION_KINDS = ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation")


@dataclass
class ConvertedRun:
    steps: list[Step] = field(default_factory=list)
    tool_definitions: list[dict[str, Any]] = field(default_factory=list)
    ended: ExitStatus | None = None  # how the conversation ended, when it ran to its end
    error: str | None = None  # why it failed, when it did (the driver's result)
    error_kind: str | None = None  # "model" or "agent"
    counts: dict[str, int] = field(default_factory=dict)
    conversation_errors: list[str] = field(default_factory=list)
    native_logs: list[str] = field(default_factory=list)  # paths in the sandbox (set by the adapter)

    def trajectory(self, *, agent_name: str, agent_version: str, model: str, task_id: str | None,
                   rollout_key: str | None) -> Trajectory:
        extra: dict[str, Any] = {"openhands": {"event_counts": self.counts}}
        if self.conversation_errors:
            extra["openhands"]["conversation_errors"] = self.conversation_errors
        return Trajectory(agent=Agent(name=agent_name, version=agent_version, model_name=model,
                                      tool_definitions=self.tool_definitions),
                          steps=self.steps, task_id=task_id, rollout_key=rollout_key, extra=extra)


def convert_events(events: list[dict[str, Any]], observations: list[dict[str, Any]],
                   result: dict[str, Any] | None) -> ConvertedRun:
    """The run the events show; `observations` are the driver's rendered observation texts, `result` its
    final word (None when it did not get to write one)."""
    run = ConvertedRun()
    shown = {row.get("event_id"): row.get("text") for row in observations if isinstance(row, dict)}
    usage = (result or {}).get("usage") or {}
    by_call: dict[str, Step] = {}  # tool call id -> the agent step that made it
    current: Step | None = None  # the agent step of the response being read (ActionEvents of one response)
    last_agent_event: dict[str, Any] | None = None
    for event in events:
        kind = event.get("kind", "")
        run.counts[kind] = run.counts.get(kind, 0) + 1
        if kind == "SystemPromptEvent":
            run.tool_definitions = [_tool_definition(tool) for tool in event.get("tools") or []]
            text = shown.get(event.get("id")) or _text(event.get("system_prompt"))
            run.steps.append(Step(step_id=len(run.steps) + 1, source="system", message=text,
                                  timestamp=event.get("timestamp")))
            current = None
        elif kind == "MessageEvent":
            message = event.get("llm_message") or {}
            if event.get("source") == "agent":
                step = _agent_step(len(run.steps) + 1, event, text=_text(message.get("content")),
                                   reasoning=message.get("reasoning_content"), usage=usage)
                run.steps.append(step)
                last_agent_event = event
            else:
                text = shown.get(event.get("id")) or _text(message.get("content"))
                run.steps.append(Step(step_id=len(run.steps) + 1, source="user", message=text,
                                      timestamp=event.get("timestamp")))
            current = None
        elif kind == "ActionEvent":
            response_id = event.get("llm_response_id")
            if current is None or current.extra.get("response_id") != response_id:
                current = _agent_step(len(run.steps) + 1, event, text=_text(event.get("thought")),
                                      reasoning=event.get("reasoning_content"), usage=usage)
                run.steps.append(current)
            call = event.get("tool_call") or {}
            raw = call.get("arguments")
            raw = raw if isinstance(raw, str) else json.dumps(raw or {})
            tool_call = ToolCall(tool_call_id=call.get("id") or event.get("tool_call_id"),
                                 function_name=call.get("name") or event.get("tool_name"),
                                 arguments=_json_object(raw) or {}, raw_arguments=raw)
            current.tool_calls.append(tool_call)
            by_call[tool_call.tool_call_id] = current
            last_agent_event = event
        elif kind in OBSERVATION_KINDS:
            call_id = event.get("tool_call_id")
            step = by_call.get(call_id)
            if step is None:  # answers no call the conversation shows (cannot happen in a sane log): counted
                run.counts["unmatched_observations"] = run.counts.get("unmatched_observations", 0) + 1
                continue
            text = shown.get(event.get("id"))
            if text is None:
                text = _observation_text(kind, event)
            if step.observation is None:
                step.observation = Observation()
            step.observation.results.append(ObservationResult(source_call_id=call_id, content=text))
        elif kind == "ConversationErrorEvent":
            run.conversation_errors.append(f"{event.get('code')}: {event.get('detail')}")
    if result is not None and result.get("tools"):
        run.tool_definitions = [tool for tool in result["tools"] if isinstance(tool, dict)]
    run.ended = _ended(result, run, last_agent_event)
    if result is not None and result.get("error"):
        run.error, run.error_kind = str(result["error"]), str(result.get("error_kind") or "agent")
    return run


def _ended(result: dict[str, Any] | None, run: ConvertedRun,
           last_agent_event: dict[str, Any] | None) -> ExitStatus | None:
    """How a conversation that ran to its end ended, as an exit status."""
    if result is None or result.get("error"):
        return None
    status = result.get("status")
    if any(error.startswith("MaxIterationsReached") for error in run.conversation_errors):
        return "step_limit"
    if any(error.startswith("MaxBudgetReached") for error in run.conversation_errors):
        return "cost_limit"
    if status == "finished" and last_agent_event is not None and last_agent_event.get("kind") == "ActionEvent" \
            and last_agent_event.get("tool_name") == FINISH_TOOL:
        return "submitted"
    return "stopped"  # a reply without tool calls, or stuck in a loop


def _agent_step(step_id: int, event: dict[str, Any], *, text: str, reasoning: Any,
                usage: dict[str, Any]) -> Step:
    response_id = event.get("llm_response_id")
    tokens = usage.get(response_id) if response_id else None
    metrics = None
    if isinstance(tokens, dict):
        metrics = Metrics(prompt_tokens=tokens.get("prompt_tokens"), completion_tokens=tokens.get("completion_tokens"),
                          cached_tokens=tokens.get("cache_read_tokens"))
    return Step(step_id=step_id, source="agent", timestamp=event.get("timestamp"), message=text,
                reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
                metrics=metrics, extra={"response_id": response_id} if response_id else {})


def _observation_text(kind: str, event: dict[str, Any]) -> str:
    if kind == "AgentErrorEvent":
        return str(event.get("error") or "")
    if kind == "UserRejectObservation":
        return f"Action rejected: {event.get('rejection_reason') or ''}"
    return _text((event.get("observation") or {}).get("content"))


def _tool_definition(tool: Any) -> dict[str, Any]:
    """A tool of the system prompt event (the SDK's own description of it, without its parameters) as an
    OpenAI tool; the driver's result replaces these with the schemas the model was sent."""
    tool = tool if isinstance(tool, dict) else {}
    name = tool.get("title") or (tool.get("annotations") or {}).get("title") or tool.get("kind") or "unknown"
    return {"type": "function", "function": {"name": str(name), "description": str(tool.get("description") or "")}}


def _text(content: Any) -> str:
    """The text of an SDK content value: a TextContent, a list of them, or a string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or "")
    if isinstance(content, list):
        return "".join(_text(part) for part in content if not isinstance(part, dict) or part.get("type", "text") == "text")
    return ""


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
