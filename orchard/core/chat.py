"""Trajectories as OpenAI chat messages + tools: the row format SFT trainers (e.g. TRL) take.

system/user steps become system/user messages; an agent step becomes one assistant message (with
`reasoning_content` and `tool_calls`) followed by its observation: a `tool` message per result that answers
a tool call (same `tool_call_id`), a `user` message for results of non-tool actions (environment feedback,
as text-action harnesses such as mini-swe-agent deliver it). Steps marked `is_copied_context` were already
seen in an earlier context and are left out unless asked for: ATIF says they must not be trained on."""

from __future__ import annotations

import json
from typing import Any

from orchard.core.trajectory import Content, Step, Trajectory


def to_chat_messages(trajectory: Trajectory, *, include_copied_context: bool = False) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for step in trajectory.steps:
        if step.is_copied_context and not include_copied_context:
            continue
        messages.extend(_step_messages(step))
    return messages


def chat_tools(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The tools the harness offered, as OpenAI tool schemas."""
    return [dict(tool) for tool in trajectory.agent.tool_definitions]


def to_chat_sample(trajectory: Trajectory, *, include_copied_context: bool = False) -> dict[str, Any]:
    """`{"messages": [...], "tools": [...]}`: one SFT dataset row."""
    return {"messages": to_chat_messages(trajectory, include_copied_context=include_copied_context),
            "tools": chat_tools(trajectory)}


def _step_messages(step: Step) -> list[dict[str, Any]]:
    if step.source != "agent":
        main = {"role": step.source, "content": _chat_content(step.message)}
        feedback_role = step.source
    else:
        main = {"role": "assistant", "content": _chat_content(step.message)}
        if step.reasoning_content is not None:
            main["reasoning_content"] = step.reasoning_content
        if step.tool_calls:
            main["tool_calls"] = [
                {"id": call.tool_call_id, "type": "function",
                 "function": {"name": call.function_name,
                              "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
                for call in step.tool_calls]
        feedback_role = "user"
    messages = [main]
    for result in step.observation.results if step.observation else []:
        content = _chat_content(result.content if result.content is not None else "")
        if result.source_call_id is not None:
            messages.append({"role": "tool", "tool_call_id": result.source_call_id, "content": content})
        else:
            messages.append({"role": feedback_role, "content": content})
    return messages


def _chat_content(content: Content) -> str | list[dict[str, Any]]:
    """ATIF content parts -> OpenAI content parts. An image's `path` is passed through as its URL: a
    relative file path must be resolved (or inlined as a data: URL) by whoever reads the files."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.type == "text":
            parts.append({"type": "text", "text": part.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": part.source.path}})
    return parts
