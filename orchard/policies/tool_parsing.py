"""Tool calls from a model's raw text, for models without a tool-calling API of their own (the embedded
SmolLM2). Small models follow the requested format loosely, so three forms are accepted, first match wins:

1. Hermes/Qwen blocks: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one call per block; the
   closing tag may be missing at the end of the text, JSON may sit in a ```json fence);
2. a bare JSON object (or list of them) naming an offered tool: `{"name": "bash", "arguments": {...}}`,
   also `{"function": {"name", "arguments"}}` and `"parameters"` for `"arguments"`;
3. a ```bash / ```sh / ```shell block, as a call of the offered shell tool with the block as its command
   (also an unlabelled block whose first line names the shell, as `bash` or `#bash`: SmolLM2-135M writes
   those when asked to run a command).

What is not a tool call stays as the message's content."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from orchard.policies.tool_specs import find_shell_tool, tool_specs

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|(?=<tool_call>)|$)", re.DOTALL)
_JSON_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)
_FENCE = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)(?:\n```|$)", re.DOTALL)
SHELL_FENCE_LABELS = frozenset({"bash", "sh", "shell", "console", "zsh"})
SHELL_FIRST_LINES = frozenset({"bash", "#bash", "# bash", "sh", "#sh", "shell", "$"})


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def openai(self, call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


def parse_model_output(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """Split generated text into content and tool calls. With no tools offered nothing is a tool call."""
    specs = tool_specs(tools)
    if not specs:
        return ParsedOutput(content=text)
    offered = {spec.name for spec in specs}
    parsers = (_tagged_calls, lambda t: _bare_json_calls(t, offered), lambda t: _shell_block_call(t, specs))
    for parse in parsers:
        calls, rest = parse(text)
        if calls:
            return ParsedOutput(content=rest.strip() or None, tool_calls=calls)
    return ParsedOutput(content=text)


def _tagged_calls(text: str) -> tuple[list[ParsedToolCall], str]:
    calls: list[ParsedToolCall] = []
    rest = text
    for match in _TOOL_CALL_BLOCK.finditer(text):
        found = _calls_in_json(_unfenced(match.group(1)), offered=None)
        if found:
            calls.extend(found)
            rest = rest.replace(match.group(0), "", 1)
    return calls, rest


def _bare_json_calls(text: str, offered: set[str]) -> tuple[list[ParsedToolCall], str]:
    """The first JSON value in the text that is a call (or list of calls) of an offered tool."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        calls = _calls_from_value(value, offered)
        if calls:
            return calls, _without_fence_around(text, match.start(), end)
    return [], text


def _shell_block_call(text: str, specs) -> tuple[list[ParsedToolCall], str]:
    shell = find_shell_tool(specs)
    if shell is None:
        return [], text
    for match in _FENCE.finditer(text):
        command = _shell_command(match.group(1).lower(), match.group(2))
        if command:
            call = ParsedToolCall(name=shell.name, arguments=json.dumps(shell.arguments(command)))
            return [call], text[:match.start()] + text[match.end():]
    return [], text


def _shell_command(label: str, body: str) -> str | None:
    """The command in a fenced block, if the block is a shell command."""
    if label in SHELL_FENCE_LABELS:
        return body.strip() or None
    first, _, rest = body.strip().partition("\n")
    if label == "" and first.strip().lower() in SHELL_FIRST_LINES:
        return rest.strip() or None
    return None


def _calls_in_json(body: str, offered: set[str] | None) -> list[ParsedToolCall]:
    try:
        value = json.loads(body)
    except ValueError:
        try:  # trailing text after the object (a model that keeps talking inside the block)
            value, _ = json.JSONDecoder().raw_decode(body.lstrip())
        except ValueError:
            return []
    return _calls_from_value(value, offered)


def _calls_from_value(value: Any, offered: set[str] | None) -> list[ParsedToolCall]:
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_object(item) for item in items]
    if not calls or any(call is None for call in calls):
        return []
    if offered is not None and any(call.name not in offered for call in calls):
        return []  # JSON that merely looks like a call (data the model printed), not a call of these tools
    return calls  # type: ignore[return-value]


def _call_from_object(item: Any) -> ParsedToolCall | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(name=name.strip(), arguments=json.dumps(arguments))


def _unfenced(body: str) -> str:
    match = _JSON_FENCE.match(body.strip())
    return match.group(1) if match else body


def _without_fence_around(text: str, start: int, end: int) -> str:
    """`text` less the JSON at [start, end) and a ```json fence directly around it."""
    before, after = text[:start], text[end:]
    fence = re.search(r"```(?:json)?\s*$", before)
    if fence and re.match(r"\s*```", after):
        before = before[:fence.start()]
        after = after[re.match(r"\s*```", after).end():]
    return before + after
