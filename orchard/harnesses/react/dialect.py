"""react's dialect (orchard/core/dialect.py): its tools as neutral actions and back, its prompts (rendered from
its config's templates), its framing of tool results, and a replay of its calls with its own tools.

| action  | react                                                                             |
|---------|-----------------------------------------------------------------------------------|
| Shell   | `bash(command)`                                                                   |
| View    | `view(path, view_range)`, a directory too                                         |
| Create  | `create(path, content)` (it makes the directory); appending: through `bash`       |
| Replace | `str_replace(path, old_str, new_str)`                                             |
| Edits   | `bash` with a python3 script                                                      |
| Insert  | `bash` with a python3 script                                                      |
| Submit  | `submit(summary)`                                                                 |

A bash result is `[exit code N]` and the output (or the output and a timeout line), a view the numbered
lines; a reply without a tool call gets the harness's reminder. The replay runs each call with react's
`SandboxTools`, as the harness runs it."""

from __future__ import annotations

import json
import re
from typing import Any

from orchard.core.actions import Action, Create, McpCall, Replace, Shell, Submit, UntranslatableCall, View
from orchard.core.dialect import Observed, ReplayedCall, TaskText, first_user_message, observation_text
from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import ObservationResult, ToolCall, Trajectory
from orchard.harnesses.mcp.toolset import SEPARATOR as MCP_SEPARATOR
from orchard.harnesses.react.config import ReActConfig
from orchard.harnesses.react.prompts import render
from orchard.harnesses.react.tools import TOOL_DEFINITIONS, SandboxTools, truncate_middle
from orchard.harnesses.templated_dialect import TemplatedDialect, sentinel_regex
from orchard.util.shell_forms import shell_command

EXIT = re.compile(r"\A\[exit code (-?\d+)(?: \(output truncated by the sandbox\))?\]\n", re.S)
TIMEOUT = re.compile(r"\n\[the command timed out after [\d.]+ s and was killed\]\Z")


class ReactDialect(TemplatedDialect):
    """The dialect of a react harness with `config`; `version` and `no_tool_call_message` are the harness's."""

    name = "react"

    def __init__(self, config: ReActConfig, *, version: str, no_tool_call_message: str) -> None:
        self.config, self.version, self.nudge = config, version, no_tool_call_message
        self.tool_definitions = TOOL_DEFINITIONS

    # --- its tools ------------------------------------------------------------------------------------

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
        try:
            if name == "bash":
                return Shell(arguments["command"])
            if name == "view":
                view_range = arguments.get("view_range")
                return View(arguments["path"], tuple(view_range) if view_range else None,
                            is_dir=_looks_like_listing(arguments["path"], result))
            if name == "create":
                overwrites = (True if result.startswith("Overwrote ") else False if result.startswith("Created ")
                              else None)
                return Create(arguments["path"], arguments["content"], overwrites=overwrites)
            if name == "str_replace":
                return Replace(arguments["path"], arguments["old_str"], arguments["new_str"])
            if name == "submit":
                return Submit(arguments.get("summary"))
            server, separator, tool = name.partition(MCP_SEPARATOR)
            if separator and server and tool:  # a task's MCP tool, as react offers it (docs/tools-mcp.md)
                return McpCall(server, tool, json.dumps(arguments))
        except (KeyError, TypeError):
            raise UntranslatableCall(f"react call {name} has invalid arguments {arguments!r}") from None
        raise UntranslatableCall(f"react has no tool {name!r}")

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
        if isinstance(action, Shell):
            return "bash", {"command": action.command}
        if isinstance(action, View):
            return "view", {"path": action.path,
                            **({"view_range": list(action.view_range)} if action.view_range else {})}
        if isinstance(action, Create) and not action.append:
            return "create", {"path": action.path, "content": action.content}
        if isinstance(action, Replace):
            return "str_replace", {"path": action.path, "old_str": action.old, "new_str": action.new}
        if not isinstance(action, Submit):  # appending, several edits, an insert: react's bash does them
            return "bash", {"command": shell_command(action)}
        return "submit", ({"summary": action.summary} if action.summary else {})

    # --- its conversation -----------------------------------------------------------------------------

    def prompts(self, task_id: str, instruction: str, workdir: str) -> tuple[str, str]:
        variables = {"instruction": instruction, "workdir": workdir, "task_id": task_id}
        return render(self.config.system_template, **variables), render(self.config.instance_template, **variables)

    def read_task(self, trajectory: Trajectory) -> TaskText:
        sentinels = {"instruction": "\x00I\x00", "workdir": "\x00W\x00", "task_id": "\x00T\x00"}
        regex = sentinel_regex(render(self.config.instance_template, **sentinels), sentinels)
        match = regex.match(first_user_message(trajectory))
        if not match:
            raise UntranslatableCall("the react trajectory's task message is not the default instance template's")
        return TaskText(match.group("instruction"), match.groupdict().get("workdir"))

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = observation_text(result)
        is_error = bool(result and result.extra.get("is_error"))
        if function_name == "bash":
            timed_out = TIMEOUT.search(text)
            if timed_out:
                return Observed(text[:timed_out.start()], -1)
            match = EXIT.match(text)
            if match:
                return Observed(text[match.end():], int(match.group(1)))
        if function_name == "view" and not is_error and not text.endswith(" is empty"):
            text += "\n"  # react joins the numbered lines; cat -n ends each with a newline
        return Observed(text, 1 if is_error else 0)

    def result_text(self, function_name: str, observed: Observed) -> str:
        if function_name == "submit":
            return "Submitted."
        text = f"[exit code {observed.returncode}]\n{observed.output}"
        return truncate_middle(text, self.config.max_observation_chars)

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call_id, "content": self.result_text(name, observed)}
                for call_id, name, observed in calls]

    def no_tool_call_message(self) -> str:
        return self.nudge

    # --- its calls replayed ---------------------------------------------------------------------------

    def replay(self, trajectory: Trajectory, workdir: str) -> ReactReplay:
        return ReactReplay(self.config, workdir)


class ReactReplay:
    """Each call run by react's own tools, as the harness runs it (truncated as it truncates)."""

    def __init__(self, config: ReActConfig, workdir: str) -> None:
        self.config, self.workdir = config, workdir

    async def run(self, sandbox: Sandbox, call: ToolCall) -> ReplayedCall:
        tools = SandboxTools(sandbox, self.workdir, command_timeout_s=self.config.command_timeout_s)
        result = await tools.call(call.function_name, call.arguments)
        return ReplayedCall(truncate_middle(result.content, self.config.max_observation_chars), result.submitted)


def _looks_like_listing(path: str, result: str) -> bool:
    """react's `view` shows a file as numbered lines (`     1\t...`) and a directory as a listing."""
    first = result.split("\n", 1)[0]
    return bool(first.strip()) and not re.match(r"\s*\d+\t", first) and not result.startswith("Error:") \
        and not result.endswith(" is empty")
