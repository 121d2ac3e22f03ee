"""Reading the OpenAI `tools` a harness offers: which one runs shell commands (and under which argument),
which one submits, and arguments that satisfy a tool's required parameters.

Harnesses name their tools differently (`bash(command)` in mini-swe-agent, `bash(cmd)`, `execute_bash`,
`shell`, `terminal`, ...), so a shell tool is recognised by its name or description and its one string
argument, not by an exact name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHELL_TOOL_NAMES = ("bash", "shell", "execute_bash", "run_bash", "terminal", "run_shell", "run_command",
                    "execute_command", "exec", "sh", "cmd")
SHELL_WORDS = ("bash", "shell", "command", "terminal")
COMMAND_ARGUMENT_NAMES = ("command", "cmd", "script", "commands", "code", "input")
SUBMIT_TOOL_NAMES = ("submit", "finish", "done", "task_complete", "complete_task", "submit_answer",
                     "final_answer", "submit_solution", "attempt_completion")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def properties(self) -> dict[str, Any]:
        properties = self.parameters.get("properties")
        return properties if isinstance(properties, dict) else {}

    @property
    def required(self) -> list[str]:
        required = self.parameters.get("required")
        return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []


@dataclass(frozen=True)
class ShellTool:
    name: str
    argument: str  # the parameter that takes the command text

    def arguments(self, command: str) -> dict[str, Any]:
        return {self.argument: command}


def tool_specs(tools: list[dict[str, Any]] | None) -> list[ToolSpec]:
    """The function tools of a request (`{"type": "function", "function": {...}}`, or the bare function)."""
    specs = []
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = function.get("name")
        if not isinstance(name, str) or not name:
            continue
        parameters = function.get("parameters")
        specs.append(ToolSpec(name=name, description=str(function.get("description") or ""),
                              parameters=parameters if isinstance(parameters, dict) else {}))
    return specs


def find_shell_tool(specs: list[ToolSpec]) -> ShellTool | None:
    """The tool that runs a shell command: a known name first, else one whose description talks about
    shell commands; either way it must take a string argument for the command."""
    by_name = sorted((spec for spec in specs if spec.name.lower() in SHELL_TOOL_NAMES),
                     key=lambda spec: SHELL_TOOL_NAMES.index(spec.name.lower()))
    described = [spec for spec in specs if spec not in by_name and spec.name.lower() not in SUBMIT_TOOL_NAMES
                 and any(word in f"{spec.name} {spec.description}".lower() for word in SHELL_WORDS)]
    for spec in [*by_name, *described]:
        argument = _command_argument(spec)
        if argument is not None:
            return ShellTool(name=spec.name, argument=argument)
    return None


# What a harness's submit tool may require: the run's summary or answer. A tool of a submit name that requires
# anything else belongs to the task, not to the harness: the Claw world's todo service's `complete_task(task_id)`,
# which kimi-cli offers under its bare name, marks a todo item done and does not end the run.
SUBMIT_ARGUMENTS = frozenset({"summary", "message", "result", "answer", "final_answer", "output", "text", "content",
                              "response", "reason", "explanation", "status", "note"})


def find_submit_tool(specs: list[ToolSpec]) -> ToolSpec | None:
    """The harness's tool that ends the run: one of SUBMIT_TOOL_NAMES that requires no more than a summary."""
    for name in SUBMIT_TOOL_NAMES:
        for spec in specs:
            if spec.name.lower() == name and set(spec.required) <= SUBMIT_ARGUMENTS:
                return spec
    return None


def required_arguments(spec: ToolSpec, text: str) -> dict[str, Any]:
    """Arguments for `spec` that fill each required parameter: `text` for strings, a neutral value for
    the other JSON types (a submit tool that wants a summary gets `text`)."""
    neutral = {"boolean": True, "integer": 0, "number": 0, "array": [], "object": {}, "null": None}
    arguments: dict[str, Any] = {}
    for name in spec.required:
        schema = spec.properties.get(name) if isinstance(spec.properties.get(name), dict) else {}
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            arguments[name] = schema["enum"][0]
        else:
            arguments[name] = text if kind == "string" else neutral.get(kind, text)
    return arguments


def _command_argument(spec: ToolSpec) -> str | None:
    strings = [name for name, schema in spec.properties.items()
               if isinstance(schema, dict) and schema.get("type", "string") == "string"]
    for name in COMMAND_ARGUMENT_NAMES:
        if name in strings:
            return name
    required_strings = [name for name in spec.required if name in strings]
    if len(required_strings) == 1:
        return required_strings[0]
    if len(strings) == 1:
        return strings[0]
    if not spec.properties and spec.name.lower() in SHELL_TOOL_NAMES:
        return "command"  # an untyped shell tool: the usual argument name
    return None
