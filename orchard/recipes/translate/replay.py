"""Replay a trajectory's tool calls with its own harness's tools in a fresh task sandbox, and take the
working-tree diff as the evaluator takes it (`orchard.eval.patch`). It checks a translation: a translated
trajectory, replayed by the target harness's tools, must leave the same diff as the source. What each call
printed comes back too, to use as the translated trajectory's observations; credit assignment takes the
diff after each step (orchard/recipes/credit/proxies.py).

How a harness's calls are run again is its dialect's (`Dialect.replay`, orchard/core/dialect.py): react's
through its `SandboxTools`, mini-swe-agent's through its `Environment` on the sandbox; a harness whose tools
run only inside the sandbox (Kimi-CLI, OpenHands) replays each call as a command that does exactly what its
tool did to the files, and refuses one that cannot be before a sandbox starts. A call that submits ends the
replay, as it ends the run. A translation into such a harness can also be checked by running the harness
itself (harness_replay.replay_in_harness)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchard.core.dialect import harness_dialect
from orchard.core.task import Task
from orchard.core.trajectory import Step, Trajectory
from orchard.eval.patch import extract_patch, snapshot_base
from orchard.eval.task_sandbox import create_task_sandbox
from orchard.sandbox.client import AsyncOrchard


@dataclass
class ReplayResult:
    patch: str
    observations: dict[str, str] = field(default_factory=dict)  # tool_call_id -> what the tool printed
    calls_run: int = 0
    patches: dict[int, str] = field(default_factory=dict)  # step_id -> the diff after that step (diff_after)


async def replay_patch(orch: AsyncOrchard, task: Task, trajectory: Trajectory, *,
                       diff_after: Callable[[Step], bool] | None = None) -> ReplayResult:
    """Run `trajectory`'s tool calls with its harness's tools in a fresh sandbox of `task` and return the
    diff they leave against the state after setup. `diff_after(step)`: also take the diff after each agent
    step for which it is true (`ReplayResult.patches`, by step_id); a step that submits ends the replay.
    UntranslatableCall (UnreplayableCall) before any sandbox starts for a harness without a dialect or a
    call its dialect cannot replay."""
    workdir = task.environment.workdir
    replay = harness_dialect(trajectory.agent.name).replay(trajectory, workdir)
    sandbox = await create_task_sandbox(orch, task)
    try:
        base = await snapshot_base(sandbox, workdir)
        result = ReplayResult(patch="")
        for step in trajectory.steps:
            if step.source != "agent" or step.is_copied_context:
                continue
            submitted = False
            for call in step.tool_calls:
                output, submitted = await replay.run(sandbox, call)
                result.observations[call.tool_call_id] = output
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
