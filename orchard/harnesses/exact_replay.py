"""Replaying the calls of a harness whose tools cannot run in Orchard's process (Kimi-CLI and OpenHands run
theirs inside the sandbox, from their bundle): each recorded call becomes one bash command, run in the
task's working directory, that does to the files exactly what that harness's own tool did, or nothing where
the tool changes no file. A file tool is written as a python3 script that repeats that tool's own steps
(`exact_script`); a script that meets what it cannot repeat (a file in an encoding the tool would have
detected) exits with `REFUSED_CODE` after printing `REFUSED`, and the replay is refused.

A dialect's `replay` builds the whole plan first (`exact_plan`: tool_call_id -> `ExactCall`), so a call that
cannot be replayed is refused (`UnreplayableCall`, naming it) before a sandbox starts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from orchard.core.actions import UnreplayableCall
from orchard.core.dialect import ReplayedCall
from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import ToolCall, Trajectory
from orchard.harnesses.shell_command import shell_argv
from orchard.util.shell_forms import heredoc_delimiter

REFUSED = "ORCHARD-REPLAY-REFUSED"
REFUSED_CODE = 97
COMMAND_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ExactCall:
    """What to run for one recorded call: a bash command, or None (the call changes no file); `submits`: the
    call ended the run."""

    command: str | None
    submits: bool = False


# plans one call: (tool name, arguments, the text of its recorded result) -> what to run
PlanCall = Callable[[str, dict[str, Any], str | None], ExactCall]


def exact_plan(trajectory: Trajectory, plan_call: PlanCall) -> dict[str, ExactCall]:
    """tool_call_id -> the exact call for every call of the trajectory's agent steps, in order;
    UnreplayableCall names the first call that cannot be replayed exactly."""
    harness = trajectory.agent.name
    plan: dict[str, ExactCall] = {}
    for step in trajectory.steps:
        if step.source != "agent" or step.is_copied_context:
            continue
        results = {r.source_call_id: _text(r.content) for r in (step.observation.results if step.observation else [])}
        for call in step.tool_calls:
            where = f"{harness} call {call.tool_call_id} ({call.function_name}, step {step.step_id})"
            try:
                plan[call.tool_call_id] = plan_call(call.function_name, call.arguments, results.get(call.tool_call_id))
            except UnreplayableCall as exc:
                raise UnreplayableCall(f"{where}: {exc}") from None
            except (KeyError, TypeError, ValueError):
                raise UnreplayableCall(f"{where}: invalid arguments {call.arguments!r}") from None
    return plan


class ExactReplay:
    """A `CallReplay` (orchard/core/dialect.py) running a plan's commands with bash in the working directory."""

    def __init__(self, plan: dict[str, ExactCall], workdir: str, *, command_timeout_s: float = COMMAND_TIMEOUT_S):
        self.plan, self.workdir, self.command_timeout_s = plan, workdir, command_timeout_s

    async def run(self, sandbox: Sandbox, call: ToolCall) -> ReplayedCall:
        exact = self.plan[call.tool_call_id]
        if exact.command is None:
            return ReplayedCall("", exact.submits)
        result = await sandbox.exec(shell_argv(exact.command), cwd=self.workdir, timeout=self.command_timeout_s)
        output = result.stdout + result.stderr
        if REFUSED in output:
            raise UnreplayableCall(f"call {call.tool_call_id} ({call.function_name}): {output.strip()}")
        if result.timed_out:
            return ReplayedCall(f"{output}\n[the command timed out after {self.command_timeout_s:g} s and was killed]",
                                exact.submits)
        return ReplayedCall(f"[exit code {result.exit_code}]\n{output}", exact.submits)


def exact_script(*lines: str) -> str:
    """`lines` as a python3 script in a quoted heredoc, with `fail(message)` (the tool's own error: exit 1)
    and `refuse(message)` (what the replay cannot repeat) defined, and os, re, sys imported."""
    script = "\n".join(["import os, re, sys",
                        "def fail(message):",
                        "    sys.exit(message)",
                        "def refuse(message):",
                        f"    print({REFUSED!r} + ': ' + message)",
                        f"    sys.exit({REFUSED_CODE})",
                        *lines])
    delimiter = heredoc_delimiter(script)
    return f"python3 - <<'{delimiter}'\n{script}\n{delimiter}"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable) and not isinstance(content, (bytes, dict)):
        return "".join(part.get("text", "") if isinstance(part, dict) else getattr(part, "text", None) or str(part)
                       for part in content)
    return ""
