"""mini-swe-agent's dialect (orchard/core/dialect.py): its one tool, `bash(command)`, as neutral actions and back
(every file action written as the shell command that does it, orchard/util/shell_forms.py; submitting is
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`), its prompts and observations rendered by the package's own
agent and model classes from the harness's config (so another package version renders its own text), and a
replay of its calls through its `Environment` on the sandbox. Translation reads and writes its
tool-calling mode (the default), not text mode."""

from __future__ import annotations

import asyncio
import json
import platform
import re
from functools import cached_property
from typing import Any

from jinja2 import StrictUndefined, Template
from minisweagent.agents.default import DefaultAgent
from minisweagent.exceptions import Submitted
from minisweagent.models.utils.actions_toolcall import BASH_TOOL

from orchard.core.actions import Action, Shell, Submit, UntranslatableCall
from orchard.core.dialect import Observed, ReplayedCall, TaskText, first_user_message, observation_text
from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import ObservationResult, ToolCall, Trajectory
from orchard.harnesses.mini_swe_agent.bridge import LoopBridge, run_in_thread
from orchard.harnesses.mini_swe_agent.environment import OrchardSandboxEnvironment
from orchard.harnesses.mini_swe_agent.model import GatewayModel
from orchard.harnesses.templated_dialect import TemplatedDialect, sentinel_regex
from orchard.util.shell_forms import SUBMIT_COMMAND, shell_command

TAGGED = re.compile(r"<returncode>(-?\d+)</returncode>\s*<output>\n?(.*)</output>\s*\Z", re.S)


class MiniSweAgentDialect(TemplatedDialect):
    """The dialect of `harness` (a MiniSweAgentHarness: its config, mode and version). The package's agent and
    model, which render the texts, are made on first use; `system_info` stands for the sandbox's `uname`."""

    name = "mini-swe-agent"

    def __init__(self, harness: Any, system_info: dict[str, str] | None = None) -> None:
        self.harness, self.version, self.system_info = harness, harness.version, system_info

    # --- its tool -------------------------------------------------------------------------------------

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
        if name != "bash" or not isinstance(arguments.get("command"), str):
            raise UntranslatableCall(f"mini-swe-agent has one tool, bash(command); not {name}({arguments!r})")
        command = arguments["command"]
        if command.strip() == SUBMIT_COMMAND:
            return Submit()
        return Shell(command)

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": shell_command(action)}

    # --- its conversation -----------------------------------------------------------------------------

    @cached_property
    def tool_definitions(self) -> list[dict[str, Any]]:  # type: ignore[override]
        if self.harness.mode != "toolcall":
            raise UntranslatableCall("translation writes mini-swe-agent's tool-calling mode (its default)")
        return [dict(BASH_TOOL)]

    @cached_property
    def model(self) -> GatewayModel:
        # the package's own objects, never run: they render its templates with its variables
        return GatewayModel(client=None, bridge=None, **{**(self.harness.config.get("model") or {}),
                                                           "model_name": "translation", "mode": self.harness.mode})

    @cached_property
    def agent(self) -> DefaultAgent:
        uname = platform.uname()
        info = self.system_info or {"system": uname.system, "node": uname.node, "release": uname.release,
                                    "version": uname.version, "machine": uname.machine, "processor": uname.machine}
        environment = OrchardSandboxEnvironment(sandbox=None, bridge=None, system_info=info,
                                                **(self.harness.config.get("environment") or {}))
        return DefaultAgent(self.model, environment, **self.harness.agent_config)

    def _render(self, template: str, **variables: Any) -> str:
        return Template(template, undefined=StrictUndefined).render(**self.agent.get_template_vars(**variables))

    def prompts(self, task_id: str, instruction: str, workdir: str) -> tuple[str, str]:
        return (self._render(self.agent.config.system_template, task=instruction, cwd=workdir),
                self._render(self.agent.config.instance_template, task=instruction, cwd=workdir))

    def read_task(self, trajectory: Trajectory) -> TaskText:
        if trajectory.agent.extra.get("mode", "toolcall") != "toolcall":
            raise UntranslatableCall("a mini-swe-agent trajectory in text mode (commands in the reply's text) is not "
                                     "translated; translation reads its tool-calling mode (the default)")
        sentinel = {"task": "\x00TASK\x00"}
        regex = sentinel_regex(self._render(self.agent.config.instance_template, **sentinel), sentinel)
        match = regex.match(first_user_message(trajectory))
        if not match:
            raise UntranslatableCall("the mini-swe-agent trajectory's task message is not the default config's")
        native = trajectory.extra.get("mini_swe_agent") or {}
        workdir = ((native.get("info") or {}).get("config") or {}).get("environment", {}).get("cwd")
        return TaskText(match.group("task"), workdir or None)

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = observation_text(result)
        returncode = result.extra.get("returncode") if result else None
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "returncode" in parsed:
            output = parsed.get("output")
            if output is None:  # the long form: head and tail only
                output = parsed.get("output_head", "") + parsed.get("output_tail", "")
            return Observed(output, int(parsed["returncode"]))
        tagged = TAGGED.search(text)
        if tagged:
            return Observed(tagged.group(2), int(tagged.group(1)))
        return Observed(text, int(returncode) if isinstance(returncode, int) else 0)

    def result_text(self, function_name: str, observed: Observed) -> str:
        (message,) = self.result_messages([("call", function_name, observed)])
        return message["content"]

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        actions = [{"command": "", "tool_call_id": call_id} for call_id, _, _ in calls]
        outputs = [{"output": observed.output, "returncode": observed.returncode, "exception_info": ""}
                   for _, _, observed in calls]
        messages = self.model.format_observation_messages({"extra": {"actions": actions}}, outputs,
                                                          self.agent.get_template_vars())
        return [{key: value for key, value in message.items() if key != "extra"} for message in messages]

    def no_tool_call_message(self) -> str:
        return Template(self.model.config.format_error_template, undefined=StrictUndefined).render(
            error="No tool calls found in the response. Every response MUST include at least one tool call.",
            actions=[], has_tool_calls=False, finish_reason="stop")

    # --- its calls replayed ---------------------------------------------------------------------------

    def replay(self, trajectory: Trajectory, workdir: str) -> MiniSweAgentReplay:
        return MiniSweAgentReplay(self, workdir)


class MiniSweAgentReplay:
    """Each call run through the harness's `Environment` on the sandbox (the package's synchronous protocol,
    in a thread, bridged to this event loop as the harness runs it); the submit command ends the replay."""

    def __init__(self, dialect: MiniSweAgentDialect, workdir: str) -> None:
        self.dialect, self.workdir = dialect, workdir
        self.sandbox: Sandbox | None = None
        self.environment: OrchardSandboxEnvironment | None = None
        self.bridge: LoopBridge | None = None

    async def run(self, sandbox: Sandbox, call: ToolCall) -> ReplayedCall:
        if self.environment is None or self.sandbox is not sandbox:
            self.sandbox, self.bridge = sandbox, LoopBridge(asyncio.get_running_loop())
            settings = self.dialect.harness.config.get("environment") or {}
            self.environment = OrchardSandboxEnvironment(sandbox=sandbox, bridge=self.bridge, system_info={},
                                                         **{**settings, "cwd": self.workdir})
        environment = self.environment
        try:
            output = await run_in_thread(lambda: environment.execute({"command": call.arguments.get("command", "")}),
                                         self.bridge, name="replay")
        except Submitted:
            return ReplayedCall("", True)
        observed = Observed(output["output"], output["returncode"])
        return ReplayedCall(self.dialect.result_text(call.function_name, observed), False)
