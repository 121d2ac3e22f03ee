"""Replay a trajectory's tool calls with its own harness's tools in a fresh task sandbox, and take the
working-tree diff as the evaluator takes it (`orchard.eval.patch`). It checks a translation: a translated
trajectory, replayed by the target harness's tools, must leave the same diff as the source. What each call
printed comes back too, to use as the translated trajectory's observations.

react's calls run through its `SandboxTools`; mini-swe-agent's through its `Environment` on the sandbox (the
package's synchronous protocol, in a thread, bridged to this event loop as the harness runs it). A call
that submits ends the replay, as it ends the run. Kimi-CLI and OpenHands have no tools in this process:
their rollouts are replayed with react's tools, each call as one that does exactly what their own tool did
to the files (orchard/recipes/credit/replay.py; a call that cannot be is refused before a sandbox starts). A translation
into them is checked by running the harness itself (harness_replay.replay_in_harness)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from orchard.core.task import Task
from orchard.core.trajectory import Step, ToolCall, Trajectory
from orchard.eval.patch import extract_patch, snapshot_base
from orchard.eval.task_sandbox import create_task_sandbox
from orchard.sandbox.client import AsyncOrchard


@dataclass
class ReplayResult:
    patch: str
    observations: dict[str, str] = field(default_factory=dict)  # tool_call_id -> what the tool printed
    calls_run: int = 0
    patches: dict[int, str] = field(default_factory=dict)  # step_id -> the diff after that step (diff_after)


class _ReactRunner:
    def __init__(self, sandbox: Any, workdir: str) -> None:
        from orchard.harnesses.react.config import ReActConfig
        from orchard.harnesses.react.tools import SandboxTools, truncate_middle

        config = ReActConfig()
        self.tools = SandboxTools(sandbox, workdir, command_timeout_s=config.command_timeout_s)
        self.limit, self.truncate = config.max_observation_chars, truncate_middle

    async def run(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        result = await self.tools.call(name, arguments)
        return self.truncate(result.content, self.limit), result.submitted


class _MiniRunner:
    def __init__(self, sandbox: Any, workdir: str) -> None:
        from orchard.harnesses.mini_swe_agent import MiniSweAgentHarness
        from orchard.harnesses.mini_swe_agent.bridge import LoopBridge
        from orchard.harnesses.mini_swe_agent.environment import OrchardSandboxEnvironment
        from orchard.recipes.translate.conversation import Observed
        from orchard.recipes.translate.dialects import MiniSweAgentDialect

        harness = MiniSweAgentHarness()
        self.bridge = LoopBridge(asyncio.get_running_loop())
        self.environment = OrchardSandboxEnvironment(sandbox=sandbox, bridge=self.bridge, system_info={},
                                                     **{**(harness.config.get("environment") or {}), "cwd": workdir})
        self.dialect, self.observed = MiniSweAgentDialect(), Observed

    async def run(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        from minisweagent.exceptions import Submitted

        from orchard.harnesses.mini_swe_agent.bridge import run_in_thread

        try:
            output = await run_in_thread(lambda: self.environment.execute({"command": arguments.get("command", "")}),
                                         self.bridge, name="replay")
        except Submitted:
            return "", True
        observed = self.observed(output["output"], output["returncode"])
        return self.dialect.result_text(name, observed), False


class _ExactRunner:
    """A Kimi-CLI or OpenHands rollout's calls, each run as its exact react call
    (orchard.recipes.credit.replay.exact_plan)."""

    def __init__(self, sandbox: Any, workdir: str, plan: dict[str, Any]) -> None:
        self.react, self.plan = _ReactRunner(sandbox, workdir), plan

    async def run_call(self, call: ToolCall) -> tuple[str, bool]:
        from orchard.recipes.credit.replay import REFUSED, UnreplayableCall

        exact = self.plan[call.tool_call_id]
        if exact.call is None:
            return "", exact.submits
        text, _ = await self.react.run(*exact.call)
        if REFUSED in text:
            raise UnreplayableCall(f"call {call.tool_call_id} ({call.function_name}): {text.strip()}")
        return text, exact.submits


RUNNERS = {"react": _ReactRunner, "mini-swe-agent": _MiniRunner}


async def replay_patch(orch: AsyncOrchard, task: Task, trajectory: Trajectory, *,
                       diff_after: Callable[[Step], bool] | None = None) -> ReplayResult:
    """Run `trajectory`'s tool calls with its harness's tools in a fresh sandbox of `task` and return the
    diff they leave against the state after setup. `diff_after(step)`: also take the diff after each agent
    step for which it is true (`ReplayResult.patches`, by step_id); a step that submits ends the replay."""
    from orchard.recipes.credit.replay import EXACT_HARNESSES, exact_plan

    workdir = task.environment.workdir
    runner_class = RUNNERS.get(trajectory.agent.name)
    plan = exact_plan(trajectory, workdir) if trajectory.agent.name in EXACT_HARNESSES else None
    if runner_class is None and plan is None:
        raise ValueError(f"no tool replay for harness {trajectory.agent.name!r} (it knows "
                         f"{', '.join([*RUNNERS, *EXACT_HARNESSES])}); replay_in_harness "
                         "(translate/harness_replay.py) runs any harness itself")
    sandbox = await create_task_sandbox(orch, task)
    try:
        base = await snapshot_base(sandbox, workdir)
        runner = _ExactRunner(sandbox, workdir, plan) if plan is not None else runner_class(sandbox, workdir)
        result = ReplayResult(patch="")
        for step in trajectory.steps:
            if step.source != "agent" or step.is_copied_context:
                continue
            submitted = False
            for call in step.tool_calls:
                if isinstance(runner, _ExactRunner):
                    text, submitted = await runner.run_call(call)
                else:
                    text, submitted = await runner.run(call.function_name, call.arguments)
                result.observations[call.tool_call_id] = text
                result.calls_run += 1
                if submitted:
                    break
            if submitted:
                break
            if diff_after is not None and diff_after(step):
                result.patches[step.step_id] = await extract_patch(sandbox, workdir, base)
        result.patch = await extract_patch(sandbox, workdir, base)
        return result
    finally:
        await sandbox.close()
