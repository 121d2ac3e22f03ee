"""OpenAI chat messages (with tools, tool calls and tool results) as messages a plain chat template can
render. SmolLM2's template knows only `role` and string `content`: no tools, no tool calls, no `tool` role.
So, as Qwen2.5's template (Hermes format) does:

- the tools are described in the system prompt, with the instruction to answer
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (tool_parsing.py reads that back);
- an assistant message's tool calls become `<tool_call>` blocks after its content;
- tool results become a user turn of `<tool_response>` blocks (consecutive results share one turn).

A template that handles tools itself (it mentions `tools`) gets the messages and tools as they are, with
only the content normalised to text."""

from __future__ import annotations

import json
from typing import Any

# SmolLM2's template adds this system prompt when there is none; with tools one is needed to hold them.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def template_supports_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def render_for_template(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                        native_tools: bool) -> tuple[list[dict[str, str]], list[dict[str, Any]] | None]:
    """(messages, tools) to give `apply_chat_template`: tools stay separate only if `native_tools`."""
    if native_tools:
        return [_native(message) for message in messages], tools or None
    rendered: list[dict[str, str]] = []
    previous_role = None
    for message in messages:
        role = _role(message)
        if role == "tool":
            block = f"<tool_response>\n{content_text(message.get('content'))}\n</tool_response>"
            if previous_role == "tool":
                rendered[-1]["content"] += "\n" + block
            else:
                rendered.append({"role": "user", "content": block})
        elif role == "assistant":
            rendered.append({"role": "assistant", "content": _assistant_text(message)})
        else:
            rendered.append({"role": role, "content": content_text(message.get("content"))})
        previous_role = role
    if tools:
        rendered = _with_tools_in_system_prompt(rendered, tools)
    return rendered, None


def content_text(content: Any) -> str:
    """A message's content as text: a string as is, OpenAI content parts joined (non-text parts named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type", "text") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                texts.append(f"[{part.get('type', 'content')} omitted: this model reads text only]")
        return "\n".join(texts)
    return str(content)


def _role(message: dict[str, Any]) -> str:
    role = str(message.get("role", "user"))
    return {"developer": "system", "function": "tool"}.get(role, role)


def _native(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "role": _role(message), "content": content_text(message.get("content"))}


def _assistant_text(message: dict[str, Any]) -> str:
    parts = [content_text(message.get("content")).strip()]
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        arguments: Any = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass  # keep the text the model (or harness) wrote
        parts.append("<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments})
                     + "\n</tool_call>")
    return "\n".join(part for part in parts if part)


def _with_tools_in_system_prompt(messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    block = TOOLS_PROMPT.format(tools="\n".join(json.dumps(tool) for tool in tools))
    if messages and messages[0]["role"] == "system":
        system = messages[0]["content"].rstrip()
        return [{"role": "system", "content": f"{system}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": f"{DEFAULT_SYSTEM_PROMPT}\n\n{block}"}, *messages]
