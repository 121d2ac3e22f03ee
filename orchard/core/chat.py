"""Trajectories as OpenAI chat messages + tools: the row format SFT trainers (e.g. TRL) take.

system/user steps become system/user messages; an agent step becomes one assistant message (with
`reasoning_content` and `tool_calls`) followed by its observation: a `tool` message per result that answers
a tool call (same `tool_call_id`), a `user` message for results of non-tool actions (environment feedback,
as text-action harnesses such as mini-swe-agent deliver it). Steps marked `is_copied_context` were already
seen in an earlier context and are left out unless asked for: ATIF says they must not be trained on.

Tool-call arguments are the text the model wrote (`ToolCall.raw_arguments`), byte for byte: a truncated or
otherwise malformed call stays malformed in the row, as it was in the model's output, and valid JSON keeps
its spacing and key order. Only calls recorded without their raw text (ATIF from other tools) are
serialized from the parsed `arguments`. `drop_malformed=True` leaves out a whole trajectory that has a
malformed call (no messages, no sample), not just that step: every later turn was conditioned on the
malformed call and on the tool's error about it, so a row without that step would teach the model turns
that answer something the row does not show."""

from __future__ import annotations

import json
from typing import Any

from orchard.core.trajectory import Content, Step, ToolCall, Trajectory


def to_chat_messages(trajectory: Trajectory, *, include_copied_context: bool = False,
                     drop_malformed: bool = False) -> list[dict[str, Any]]:
    """The trajectory's steps as chat messages; `[]` when `drop_malformed` and a step that would be included
    has a malformed tool call."""
    steps = [step for step in trajectory.steps if include_copied_context or not step.is_copied_context]
    if drop_malformed and any(_has_malformed_call(step) for step in steps):
        return []
    messages: list[dict[str, Any]] = []
    for step in steps:
        messages.extend(_step_messages(step))
    return messages


def has_malformed_tool_calls(trajectory: Trajectory, *, include_copied_context: bool = False) -> bool:
    """Whether a (trained-on) step has a tool call whose arguments the model did not write as a JSON object."""
    return any(_has_malformed_call(step) for step in trajectory.steps
               if include_copied_context or not step.is_copied_context)


def chat_tools(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The tools the harness offered, as OpenAI tool schemas."""
    return [dict(tool) for tool in trajectory.agent.tool_definitions]


def to_chat_sample(trajectory: Trajectory, *, include_copied_context: bool = False,
                   drop_malformed: bool = False) -> dict[str, Any] | None:
    """`{"messages": [...], "tools": [...]}`: one SFT dataset row; None when `drop_malformed` drops it."""
    if drop_malformed and has_malformed_tool_calls(trajectory, include_copied_context=include_copied_context):
        return None
    return {"messages": to_chat_messages(trajectory, include_copied_context=include_copied_context),
            "tools": chat_tools(trajectory)}


def _has_malformed_call(step: Step) -> bool:
    return any(not call.arguments_valid for call in step.tool_calls)


def _tool_call_message(call: ToolCall) -> dict[str, Any]:
    arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments,
                                                                                      ensure_ascii=False)
    return {"id": call.tool_call_id, "type": "function",
            "function": {"name": call.function_name, "arguments": arguments}}


def _step_messages(step: Step) -> list[dict[str, Any]]:
    if step.source != "agent":
        main = {"role": step.source, "content": _chat_content(step.message)}
        feedback_role = step.source
    else:
        main = {"role": "assistant", "content": _chat_content(step.message)}
        if step.reasoning_content is not None:
            main["reasoning_content"] = step.reasoning_content
        if step.tool_calls:
            main["tool_calls"] = [_tool_call_message(call) for call in step.tool_calls]
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
