"""`orchard eval validate`: check a suite through the evaluator's own grader, in sandboxes. A SWE task: the
gold patch must resolve it and the empty patch must not (its FAIL_TO_PASS tests fail while its PASS_TO_PASS
tests pass). A task with a script grader and a reference solution (the task-directory dialects: Harbor's
solve.sh, claw-bench's): in one fresh sandbox the solution, run as the oracle runs it, must resolve it at the
suite's pass threshold; in another a no-op (nothing done) must not (a no-op that still earns a reward below
the threshold is valid, and said: `noop_partial_credit`) — unless the task says doing nothing is right
(`metadata["noop_resolves"]`: tau2's refusals), when a no-op that resolves it is said, not a problem
(`noop_resolves_by_design`). A task that cannot run is listed with the reason."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel, Field

from orchard.core.backend import BackendConfig
from orchard.core.errors import OrchardError
from orchard.core.sandbox import SandboxFactory
from orchard.core.task import NOOP_RESOLVES, ScriptGrader, ServicesGrader, SWETestsGrader, Task
from orchard.core.task_suite import TaskSuite
from orchard.core.trajectory import Outcome
from orchard.eval.grading import grade_swe_patch
from orchard.eval.image_build.prepare import prepare_task_images
from orchard.eval.script_validation import validate_script_task
from orchard.eval.suites import LOAD_ERROR_KEY, load_suite, select_tasks
from orchard.eval.swe_tests import PASSED
from orchard.sandbox.client import AsyncOrchard


class TaskValidation(BaseModel):
    task_id: str
    problems: list[str] = Field(default_factory=list)
    gold_resolved: bool | None = None  # the gold patch, or the reference solution
    empty_resolved: bool | None = None  # the empty patch, or a no-op
    gold_reward: float | None = None
    empty_reward: float | None = None
    duration_s: float = 0.0
    not_runnable: bool = False  # the suite says it cannot run (its problem is the reason)

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def noop_partial_credit(self) -> bool:
        """A no-op that is not resolved yet earns some reward: checks that pass with nothing done."""
        return not self.empty_resolved and bool(self.empty_reward)

    noop_resolves_by_design: bool = False  # the task says doing nothing is right, and a no-op resolved it


async def validate_suite(suite: str | Path | TaskSuite, task_ids: list[str] | None = None, *, parallel: int = 4,
                         orchard_url: str | None = None,
                         backend: BackendConfig | str | None = None) -> list[TaskValidation]:
    loaded = load_suite(suite)
    tasks = await prepare_task_images(select_tasks(loaded, task_ids), backend=backend, orchard_url=orchard_url)
    slots = asyncio.Semaphore(max(1, parallel))
    async with AsyncOrchard(orchard_url, backend=backend) as orch:

        async def one(task: Task) -> TaskValidation:
            async with slots:
                return await validate_task(orch, task, pass_threshold=loaded.pass_threshold)

        return list(await asyncio.gather(*(one(task) for task in tasks)))


async def validate_task(orch: SandboxFactory, task: Task, *, pass_threshold: float = 1.0) -> TaskValidation:
    started = time.monotonic()
    result = TaskValidation(task_id=task.id)
    load_error = task.metadata.get(LOAD_ERROR_KEY)
    if load_error:  # e.g. its repository is missing: grading it would only report git's complaint
        result.problems.append(str(load_error))
        result.not_runnable = True
        return result
    grader = task.grader
    if isinstance(grader, (ScriptGrader, ServicesGrader)) and grader.reference_solution:
        solved, noop, problems = await validate_script_task(orch, task, pass_threshold)
        result.gold_resolved, result.gold_reward = (solved.resolved, solved.reward) if solved else (None, None)
        result.empty_resolved, result.empty_reward = (noop.resolved, noop.reward) if noop else (None, None)
        result.noop_resolves_by_design = bool(noop and noop.resolved and task.metadata.get(NOOP_RESOLVES))
        result.problems += problems
        result.duration_s = time.monotonic() - started
        return result
    if not isinstance(grader, SWETestsGrader) or not grader.reference_patch:
        result.problems.append("neither a SWE task with a reference (gold) patch nor a script-graded task with a "
                               "reference solution: nothing to validate")
        return result
    try:
        gold, empty = await asyncio.gather(grade_swe_patch(orch, task, grader.reference_patch, label="gold patch"),
                                           grade_swe_patch(orch, task, "", label="empty patch"))
    except OrchardError as exc:
        result.problems.append(f"grading failed: {exc.code}: {exc}")
        return result
    result.gold_resolved, result.empty_resolved = gold.resolved, empty.resolved
    result.problems += _problems(grader, gold, empty)
    result.duration_s = time.monotonic() - started
    return result


def _problems(grader: SWETestsGrader, gold: Outcome, empty: Outcome) -> list[str]:
    problems = [f"{label}: {outcome.details['patch_error']}" for label, outcome in (("gold", gold), ("empty", empty))
                if "patch_error" in outcome.details]
    if problems:
        return problems
    gold_tests, empty_tests = gold.details["tests"], empty.details["tests"]
    for test_id in grader.fail_to_pass:
        if gold_tests[test_id] != PASSED:
            problems.append(f"FAIL_TO_PASS {test_id} is {gold_tests[test_id]} with the gold patch")
        if empty_tests[test_id] == PASSED:
            problems.append(f"FAIL_TO_PASS {test_id} already passes without the fix")
    for test_id in grader.pass_to_pass:
        for label, tests in (("gold", gold_tests), ("empty", empty_tests)):
            if tests[test_id] != PASSED:
                problems.append(f"PASS_TO_PASS {test_id} is {tests[test_id]} with the {label} patch")
    if problems and all(outcome == "missing" for outcome in empty_tests.values()):
        problems.append("no test reported at all; the test run said:\n" + empty.details["log_tail"][-1500:])
    return problems
