"""`orchard eval validate` for a script- or services-graded task with a reference solution (task directories,
services' tasks): in a fresh sandbox the solution, run in the workdir as the oracle runs it, must resolve the
task at the pass threshold; in another fresh sandbox nothing is done (a no-op) and the task must not be
resolved. Both graded by the evaluator's own script grader, in parallel; every sandbox is deleted after."""

from __future__ import annotations

import asyncio

from orchard.core.errors import OrchardError
from orchard.core.sandbox import SandboxFactory
from orchard.core.task import NOOP_RESOLVES, ScriptGrader, ServicesGrader, Task
from orchard.core.trajectory import Outcome
from orchard.eval.grading import grade_script
from orchard.eval.service_grading import grade_services
from orchard.eval.task_sandbox import create_task_sandbox

SOLUTION_TIMEOUT_S = 600.0


class _SolutionFailed(Exception):
    pass


async def _graded(orch: SandboxFactory, task: Task, solution: str | None, pass_threshold: float) -> Outcome:
    sandbox = await create_task_sandbox(orch, task)
    try:
        if solution is not None:
            ran = await sandbox.exec(solution, cwd=task.environment.workdir, timeout=SOLUTION_TIMEOUT_S)
            if ran.exit_code != 0 or ran.timed_out:
                raise _SolutionFailed(f"the reference solution {'timed out' if ran.timed_out else 'failed'} "
                                      f"(exit {ran.exit_code}): {' '.join(ran.output.split())[-400:]}")
        if isinstance(task.grader, ServicesGrader):
            return await grade_services(sandbox, task, pass_threshold=pass_threshold)
        return await grade_script(sandbox, task, pass_threshold=pass_threshold)
    finally:
        await sandbox.close()


async def validate_script_task(orch: SandboxFactory, task: Task,
                               pass_threshold: float) -> tuple[Outcome | None, Outcome | None, list[str]]:
    """(the solution's outcome, the no-op's, the problems); an outcome is None where it could not be had."""
    grader = task.grader
    assert isinstance(grader, (ScriptGrader, ServicesGrader)) and grader.reference_solution
    runs = await asyncio.gather(_graded(orch, task, grader.reference_solution, pass_threshold),
                                _graded(orch, task, None, pass_threshold), return_exceptions=True)
    outcomes: list[Outcome | None] = []
    problems: list[str] = []
    for label, run in zip(("solution", "no-op"), runs):
        if isinstance(run, Outcome):
            outcomes.append(run)
            continue
        outcomes.append(None)
        if isinstance(run, _SolutionFailed):
            problems.append(str(run))
        elif isinstance(run, OrchardError):
            problems.append(f"{label}: {run.code}: {run}")
        else:
            raise run
    solved, noop = outcomes
    if solved is not None and not solved.resolved:
        said = " ".join(str(solved.details.get("output_tail", "")).split())[-400:]
        problems.append(f"the reference solution does not resolve it: reward {solved.reward:g} (the pass threshold "
                        f"is {pass_threshold:g}); the verifier said: {said}")
    if noop is not None and noop.resolved and not task.metadata.get(NOOP_RESOLVES):
        problems.append(f"a no-op already resolves it: reward {noop.reward:g} (the pass threshold is "
                        f"{pass_threshold:g})")
    return solved, noop, problems
