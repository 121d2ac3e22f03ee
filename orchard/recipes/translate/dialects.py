"""Cross-harness distillation, the conversation side: what each harness says around the tool calls — its
system and instance prompts (rendered with the harness's own templates), how a tool result goes back to the
model, what it says when a reply calls no tool — and how to read the task and a tool's result back out of a
recorded trajectory of that harness.

Outputs are carried between harnesses as `Observed` (the text a command or tool produced, its exit code):
react writes a bash result as `[exit code N]` + output, mini-swe-agent renders its observation template
(its config's, e.g. the JSON of `mini.yaml`). The prompts come from each harness's default configuration:
ReActConfig's templates, and mini-swe-agent's package config through the package's own agent and model
classes (so a different package version renders its own text)."""

from __future__ import annotations

import json
import platform
import re
from abc import ABC, abstractmethod
from typing import Any

from jinja2 import StrictUndefined, Template

from orchard.core.trajectory import ObservationResult, Trajectory
from orchard.recipes.translate.actions import UntranslatableCall
from orchard.recipes.translate.captured import CAPTURED_HARNESSES, CapturedDialect
from orchard.recipes.translate.conversation import Dialect, Observed, TaskText, _first_user_message, _text

REACT_EXIT = re.compile(r"\A\[exit code (-?\d+)(?: \(output truncated by the sandbox\))?\]\n", re.S)
REACT_TIMEOUT = re.compile(r"\n\[the command timed out after [\d.]+ s and was killed\]\Z")
TAGGED = re.compile(r"<returncode>(-?\d+)</returncode>\s*<output>\n?(.*)</output>\s*\Z", re.S)


class _TemplatedDialect(ABC):
    """A harness whose prompts this process renders (react, mini-swe-agent): a system and a task message."""

    ends_on_reply = False
    tool_definitions: list[dict[str, Any]]

    @abstractmethod
    def prompts(self, task_id: str, instruction: str, workdir: str) -> tuple[str, str]:
        """The system and the task message, as the harness renders them."""

    def initial_messages(self, task_id: str, instruction: str, workdir: str) -> tuple[list[dict[str, Any]],
                                                                                      list[dict[str, Any]]]:
        system, instance = self.prompts(task_id, instruction, workdir)
        return [{"role": "system", "content": system}, {"role": "user", "content": instance}], self.tool_definitions


def _sentinel_regex(rendered: str, sentinels: dict[str, str]) -> re.Pattern[str]:
    """A template rendered with a sentinel for each variable, as a regex that captures each variable."""
    pattern = re.escape(rendered)
    for name, sentinel in sentinels.items():
        escaped = re.escape(sentinel)
        group = f"(?P<{name}>.*?)"
        pattern = pattern.replace(escaped, group, 1).replace(escaped, f"(?P={name})")
    return re.compile(r"\A" + pattern + r"\Z", re.S)


# --- react ------------------------------------------------------------------------------------------

class ReactDialect(_TemplatedDialect):
    name = "react"

    def __init__(self) -> None:
        from orchard.harnesses.react import ReActConfig, ReActHarness
        from orchard.harnesses.react.tools import TOOL_DEFINITIONS

        self.config = ReActConfig()
        self.version = ReActHarness.version
        self.tool_definitions = TOOL_DEFINITIONS

    def prompts(self, task_id: str, instruction: str, workdir: str) -> tuple[str, str]:
        from orchard.harnesses.react.prompts import render

        variables = {"instruction": instruction, "workdir": workdir, "task_id": task_id}
        return render(self.config.system_template, **variables), render(self.config.instance_template, **variables)

    def read_task(self, trajectory: Trajectory) -> TaskText:
        from orchard.harnesses.react.prompts import render

        sentinels = {"instruction": "\x00I\x00", "workdir": "\x00W\x00", "task_id": "\x00T\x00"}
        regex = _sentinel_regex(render(self.config.instance_template, **sentinels), sentinels)
        match = regex.match(_first_user_message(trajectory))
        if not match:
            raise UntranslatableCall("the react trajectory's task message is not the default instance template's")
        return TaskText(match.group("instruction"), match.groupdict().get("workdir"))

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = _text(result)
        is_error = bool(result and result.extra.get("is_error"))
        if function_name == "bash":
            timed_out = REACT_TIMEOUT.search(text)
            if timed_out:
                return Observed(text[:timed_out.start()], -1)
            match = REACT_EXIT.match(text)
            if match:
                return Observed(text[match.end():], int(match.group(1)))
        if function_name == "view" and not is_error and not text.endswith(" is empty"):
            text += "\n"  # react joins the numbered lines; cat -n ends each with a newline
        return Observed(text, 1 if is_error else 0)

    def result_text(self, function_name: str, observed: Observed) -> str:
        from orchard.harnesses.react.tools import truncate_middle

        if function_name == "submit":
            return "Submitted."
        text = f"[exit code {observed.returncode}]\n{observed.output}"
        return truncate_middle(text, self.config.max_observation_chars)

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call_id, "content": self.result_text(name, observed)}
                for call_id, name, observed in calls]

    def no_tool_call_message(self) -> str:
        from orchard.harnesses.react.harness import NO_TOOL_CALL_MESSAGE

        return NO_TOOL_CALL_MESSAGE


# --- mini-swe-agent ---------------------------------------------------------------------------------

class MiniSweAgentDialect(_TemplatedDialect):
    name = "mini-swe-agent"

    def __init__(self, system_info: dict[str, str] | None = None) -> None:
        from minisweagent.agents.default import DefaultAgent

        from orchard.harnesses.mini_swe_agent import MiniSweAgentHarness
        from orchard.harnesses.mini_swe_agent.environment import OrchardSandboxEnvironment
        from orchard.harnesses.mini_swe_agent.model import GatewayModel

        harness = MiniSweAgentHarness()
        self.version = harness.version
        self.tool_definitions = [dict(tool) for tool in _mini_tools(harness.mode)]
        uname = platform.uname()
        info = system_info or {"system": uname.system, "node": uname.node, "release": uname.release,
                               "version": uname.version, "machine": uname.machine, "processor": uname.machine}
        # the package's own objects, never run: they render its templates with its variables
        self.model = GatewayModel(client=None, bridge=None, **{**(harness.config.get("model") or {}),
                                                                 "model_name": "translation", "mode": harness.mode})
        environment = OrchardSandboxEnvironment(sandbox=None, bridge=None, system_info=info,
                                                **(harness.config.get("environment") or {}))
        self.agent = DefaultAgent(self.model, environment, **harness.agent_config)

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
        regex = _sentinel_regex(self._render(self.agent.config.instance_template, **sentinel), sentinel)
        match = regex.match(_first_user_message(trajectory))
        if not match:
            raise UntranslatableCall("the mini-swe-agent trajectory's task message is not the default config's")
        native = trajectory.extra.get("mini_swe_agent") or {}
        workdir = ((native.get("info") or {}).get("config") or {}).get("environment", {}).get("cwd")
        return TaskText(match.group("task"), workdir or None)

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = _text(result)
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


def _mini_tools(mode: str) -> list[dict[str, Any]]:
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    if mode != "toolcall":
        raise UntranslatableCall("translation writes mini-swe-agent's tool-calling mode (its default)")
    return [BASH_TOOL]


DIALECTS = {"react": ReactDialect, "mini-swe-agent": MiniSweAgentDialect}


def dialect(harness: str) -> Dialect:
    if harness in CAPTURED_HARNESSES:
        return CapturedDialect(harness)
    try:
        return DIALECTS[harness]()
    except KeyError:
        raise UntranslatableCall(f"cannot translate to or from harness {harness!r}; translation knows "
                                 f"{', '.join(sorted([*DIALECTS, *CAPTURED_HARNESSES]))}") from None
