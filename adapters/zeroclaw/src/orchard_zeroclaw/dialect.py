"""ZeroClaw's dialect (orchard/core/dialect.py): its tools as neutral actions and back, the profile's prompt,
its framing of tool results, and the replay of its calls with the profile's own tools. `orchard train sft
--target-harness zeroclaw` translates other harnesses' rollouts into it, and credit assignment replays its
failed rollouts, through this.

| action  | ZeroClaw                                                                                   |
|---------|--------------------------------------------------------------------------------------------|
| Shell   | `shell(command)`                                                                           |
| View    | `file_read(path, offset, limit)`; a directory: react's listing through `shell`             |
| Create  | `file_write(path, content)` (it makes the parent directories); appending: through `shell`  |
| Replace | `file_edit(path, old_string, new_string)`                                                  |
| Edits   | `shell` with a python3 script                                                              |
| Insert  | `shell` with a python3 script                                                              |
| Submit  | a reply without tool calls (ZeroClaw's turn ends there)                                    |
| McpCall | `shell` with `mcp-call SERVER TOOL '<arguments>'` (the translated prompt lists no MCP tools); |
|         | its own `<server>__<tool>` calls read as McpCall                                           |

`glob_search`, `content_search`, the memory tools, `TodoWrite` and `delegate` have no action
(`UntranslatableCall`). A result is the tool's output (`(no output)` when empty) or `Error: <reason>`;
a shell failure shows no exit code (ZeroClaw's does not), so it is read back as exit code 1.

**Replay.** Each recorded call runs again with the profile's tools (profile/tools.py), as the profile ran it;
a `delegate` call replays the calls of its sub-agent's trajectory (`subagent_trajectories`, by the result's
reference) and answers what the sub-agent answered. A task's MCP tool is refused before a sandbox starts:
its effect is on the task's services, which a replay does not repeat."""

from __future__ import annotations

import json
from typing import Any

from orchard.core.actions import (Action, Create, McpCall, Replace, Shell, Submit, UnreplayableCall, UntranslatableCall,
                                  View)
from orchard.core.dialect import Observed, ReplayedCall, TaskText, first_user_message, observation_text
from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import ObservationResult, ToolCall, Trajectory
from orchard.harnesses.mcp.toolset import SEPARATOR as MCP_SEPARATOR
from orchard.util.shell_forms import shell_command

from orchard_zeroclaw.profile.config import ProfileConfig
from orchard_zeroclaw.profile.prompt import system_prompt, workdir_of
from orchard_zeroclaw.profile.schemas import main_tools, tool_names
from orchard_zeroclaw.profile.tools import NO_OUTPUT, ProfileTools, truncate_tool_result

ERROR_PREFIX = "Error: "


class ZeroClawDialect:
    """The dialect of a zeroclaw harness with `config`; `version` is the harness's."""

    name = "zeroclaw"
    ends_on_reply = True  # a reply without tool calls ends ZeroClaw's turn, and the run
    captures_prompt = False  # the profile renders its prompt in Orchard's process

    def __init__(self, config: ProfileConfig, *, version: str) -> None:
        self.config, self.version = config, version
        self.tool_definitions = main_tools(config.agents)

    # --- its tools ------------------------------------------------------------------------------------

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
        try:
            if name == "shell":
                return Shell(_text(arguments["command"]))
            if name == "file_read":
                offset, limit = arguments.get("offset"), arguments.get("limit")
                first = int(offset) if offset is not None else 1
                if first < 1 or (limit is not None and int(limit) < 1):
                    raise UntranslatableCall(f"zeroclaw file_read with offset {offset!r}, limit {limit!r}")
                if limit is not None:
                    return View(_text(arguments["path"]), (first, first + int(limit) - 1))
                return View(_text(arguments["path"]), (first, -1) if first > 1 else None)
            if name == "file_write":
                return Create(_text(arguments["path"]), _text(arguments["content"]))
            if name == "file_edit":
                return Replace(_text(arguments["path"]), _text(arguments["old_string"]),
                               _text(arguments["new_string"]))
            server, separator, tool = name.partition(MCP_SEPARATOR)
            if separator and server and tool:  # a task's MCP tool, as ZeroClaw names it
                return McpCall(server, tool, json.dumps(arguments))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, UntranslatableCall):
                raise
            raise UntranslatableCall(f"zeroclaw call {name} has invalid arguments {arguments!r}") from None
        raise UntranslatableCall(f"zeroclaw's tool {name!r} has no equivalent in the translation's actions")

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]] | None:
        if isinstance(action, Submit):
            return None  # ZeroClaw ends its turn with a reply that calls no tool
        if isinstance(action, Shell):
            return "shell", {"command": action.command}
        if isinstance(action, View) and not action.is_dir:
            if action.view_range is None:
                return "file_read", {"path": action.path}
            first, last = action.view_range
            return "file_read", {"path": action.path, "offset": first,
                                 **({} if last == -1 else {"limit": last - first + 1})}
        if isinstance(action, Create) and not action.append:
            return "file_write", {"path": action.path, "content": action.content}
        if isinstance(action, Replace):
            return "file_edit", {"path": action.path, "old_string": action.old, "new_string": action.new}
        return "shell", {"command": shell_command(action)}  # a listing, appending, several edits, an insert

    # --- its conversation -----------------------------------------------------------------------------

    def initial_messages(self, task_id: str, instruction: str,
                         workdir: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return ([{"role": "system", "content": system_prompt(workdir)}, {"role": "user", "content": instruction}],
                [dict(tool) for tool in self.tool_definitions])

    def read_task(self, trajectory: Trajectory) -> TaskText:
        system = next((step.message for step in trajectory.steps if step.source == "system"
                       and isinstance(step.message, str)), "")
        return TaskText(first_user_message(trajectory), workdir_of(system))

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = observation_text(result)
        if text.startswith(ERROR_PREFIX) or (result is not None and result.extra.get("is_error")):
            return Observed(text.removeprefix(ERROR_PREFIX), 1)
        return Observed("" if text == NO_OUTPUT else text, 0)

    def result_text(self, function_name: str, observed: Observed) -> str:
        text = (observed.output or NO_OUTPUT) if observed.returncode == 0 else ERROR_PREFIX + observed.output
        return truncate_tool_result(text, self.config.max_tool_result_chars)

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call_id, "content": self.result_text(name, observed)}
                for call_id, name, observed in calls]

    def no_tool_call_message(self) -> None:
        return None

    # --- its calls replayed ---------------------------------------------------------------------------

    def replay(self, trajectory: Trajectory, workdir: str) -> ZeroClawReplay:
        return ZeroClawReplay(self.config, trajectory, workdir)


class ZeroClawReplay:
    """Each call run by the profile's tools; a `delegate` call by its sub-agent's calls. Checked whole at
    construction: a call that cannot be replayed is refused before a sandbox starts."""

    def __init__(self, config: ProfileConfig, trajectory: Trajectory, workdir: str) -> None:
        self.config, self.workdir = config, workdir
        offered = set(tool_names(trajectory.agent.tool_definitions)) if trajectory.agent.tool_definitions else set()
        self.unknown_ok = offered  # a name the harness never offered was answered `Unknown tool`: no effect
        embedded = {sub.trajectory_id: sub for sub in trajectory.subagent_trajectories}
        self.delegated: dict[str, tuple[list[ToolCall], str]] = {}
        for step in _own_steps(trajectory):
            results = {r.source_call_id: r for r in (step.observation.results if step.observation else [])}
            for call in step.tool_calls:
                where = f"zeroclaw call {call.tool_call_id} ({call.function_name}, step {step.step_id})"
                if call.function_name == "delegate":
                    result = results.get(call.tool_call_id)
                    refs = [ref.trajectory_id for ref in (result.subagent_trajectory_ref if result else [])]
                    sub = embedded.get(refs[0]) if refs else None
                    if result is not None and sub is None and not observation_text(result).startswith(ERROR_PREFIX):
                        raise UnreplayableCall(f"{where}: its sub-agent's trajectory is not in the rollout")
                    calls = [c for s in _own_steps(sub) for c in s.tool_calls] if sub is not None else []
                    for inner in calls:
                        self._check(inner.function_name, f"{where}, its sub-agent's call {inner.tool_call_id}")
                    self.delegated[call.tool_call_id] = (calls, observation_text(result))
                else:
                    self._check(call.function_name, where)

    def _check(self, name: str, where: str) -> None:
        if name in ProfileTools.NAMES or name == "delegate" or name not in self.unknown_ok:
            return
        raise UnreplayableCall(f"{where}: a task's MCP tool ({name}) acts on the task's services, which a replay "
                               "does not repeat")

    async def run(self, sandbox: Sandbox, call: ToolCall) -> ReplayedCall:
        tools = ProfileTools(sandbox, self.workdir, self.config)
        if call.tool_call_id in self.delegated:
            calls, answered = self.delegated[call.tool_call_id]
            for inner in calls:
                await self._one(tools, inner)
            return ReplayedCall(answered, False)
        return ReplayedCall(await self._one(tools, call), False)

    async def _one(self, tools: ProfileTools, call: ToolCall) -> str:
        if call.function_name not in ProfileTools.NAMES:
            return f"Error: Unknown tool: {call.function_name}"
        return (await tools.call(call.function_name, call.arguments)).text


def _own_steps(trajectory: Trajectory) -> list:
    return [step for step in trajectory.steps if step.source == "agent" and not step.is_copied_context]


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value
