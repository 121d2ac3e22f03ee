"""Cross-harness distillation, what every harness's dialect shares (dialects.py, captured.py): the `Dialect`
protocol, a tool's output as carried between harnesses (`Observed`), the task read back out of a recorded
trajectory (`TaskText`), and reading a trajectory's first user message and a tool result's text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from orchard.core.trajectory import ObservationResult, Trajectory
from orchard.recipes.translate.actions import UntranslatableCall


@dataclass(frozen=True)
class Observed:
    output: str
    returncode: int = 0


@dataclass(frozen=True)
class TaskText:
    instruction: str
    workdir: str | None = None


class Dialect(Protocol):
    name: str
    version: str
    ends_on_reply: bool  # a reply without tool calls ends the run (no nudge follows it)

    def initial_messages(self, task_id: str, instruction: str, workdir: str) -> tuple[list[dict[str, Any]],
                                                                                      list[dict[str, Any]]]: ...
    def read_task(self, trajectory: Trajectory) -> TaskText: ...
    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed: ...
    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]: ...
    def result_text(self, function_name: str, observed: Observed) -> str: ...
    def no_tool_call_message(self) -> str | None: ...


def _first_user_message(trajectory: Trajectory) -> str:
    for step in trajectory.steps:
        if step.source == "user" and isinstance(step.message, str):
            return step.message
    raise UntranslatableCall(f"trajectory {trajectory.rollout_key!r} has no user step with the task")


def _text(result: ObservationResult | None) -> str:
    if result is None or result.content is None:
        return ""
    if isinstance(result.content, str):
        return result.content
    return "".join(part.text or "" for part in result.content)
