"""The part of a dialect (orchard/core/dialect.py) that harnesses which render their own prompts share (they run
inside the sandbox: Kimi-CLI, OpenHands): their first messages and tools are the capture of their first
request for the task (orchard/core/captured_prompts.py), the task is their first user message, and a reply
without tool calls ends their run (no nudge). Each harness adds its tools and its framing of tool results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchard.core.actions import UntranslatableCall
from orchard.core.captured_prompts import load_prompt
from orchard.core.dialect import Observed, TaskText, first_user_message
from orchard.core.trajectory import Trajectory


class CapturedPromptDialect:
    """`name` and `version` are the harness's; `home` the Orchard home whose cache holds the captures
    (default: $ORCHARD_HOME). `workdir` is the task's, once `initial_messages` was asked."""

    ends_on_reply = True  # a reply without tool calls ends the run
    captures_prompt = True

    def __init__(self, name: str, version: str, home: Path | None = None) -> None:
        self.name, self.version, self.home = name, version, home
        self.workdir = "/testbed"

    def initial_messages(self, task_id: str, instruction: str, workdir: str) -> tuple[list[dict[str, Any]],
                                                                                       list[dict[str, Any]]]:
        prompt = load_prompt(self.name, self.version, task_id, self.home)
        if prompt is None:
            raise UntranslatableCall(
                f"no captured prompt of {self.name} {self.version} for task {task_id!r}: capture it first "
                "(orchard.recipes.translate.captured.capture_prompts; `orchard train sft --target-harness` does)")
        if prompt.instruction.strip() != instruction.strip():
            raise UntranslatableCall(f"task {task_id!r}: the rollout's task text is not the one {self.name}'s prompt "
                                     "was captured with (another version of the suite?); capture it again")
        self.workdir = workdir
        return [dict(m) for m in prompt.messages], prompt.tools

    def read_task(self, trajectory: Trajectory) -> TaskText:
        return TaskText(first_user_message(trajectory).strip(), None)

    def result_parts(self, function_name: str, observed: Observed) -> list[dict[str, str]]:
        """A tool's output as the content parts the harness sends."""
        raise NotImplementedError

    def result_text(self, function_name: str, observed: Observed) -> str:
        return "".join(part["text"] for part in self.result_parts(function_name, observed))

    def result_message(self, call_id: str, function_name: str, observed: Observed) -> dict[str, Any]:
        return {"role": "tool", "content": self.result_parts(function_name, observed), "tool_call_id": call_id}

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        return [self.result_message(call_id, name, observed) for call_id, name, observed in calls]

    def no_tool_call_message(self) -> str | None:
        return None
