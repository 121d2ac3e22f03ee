"""Credit assignment on failed rollouts, the cheap hindsight proxies, each a value in 0..1 per agent step:

- `gold_files_opened`: the share of the files the gold patch changes that the agent's tool calls have named
  (viewed, cat'd, grepped, edited) by that step. Read from the trajectory alone.
- `diff_overlap`: how much of the gold patch the working tree holds after that step: the F1 of the changed
  lines (file, added/removed, the line's text stripped) of the agent's diff and of the gold patch.
- `tests_passing`: the share of the task's FAIL_TO_PASS tests that pass with the working tree of that step.

The diffs come from replaying the rollout's tool calls with its harness's own tools in a fresh task sandbox
(orchard.recipes.translate.replay.replay_patch: the replay its harness's dialect declares), taking the diff
after each agent step that could have changed a file (every step but those that only view or submit, as the
dialect reads its calls); a step after which nothing was taken has the diff of
the step before. Tests run in a fresh sandbox per distinct diff (the evaluator's grading steps: the diff,
the test patch, then FAIL_TO_PASS), cached by the diff's text, and only for at most `max_test_runs`
distinct diffs per rollout, spread evenly and always including the last; a step whose diff was not tested
takes the value of the last tested diff before it (0 before any)."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchard.core.actions import Submit, UntranslatableCall, View
from orchard.core.dialect import Dialect, harness_dialect
from orchard.core.task import SWETestsGrader, Task
from orchard.core.trajectory import Step, Trajectory
from orchard.eval import swe_tests
from orchard.eval.grading import GRADER_PYTHON, sandbox_runner
from orchard.eval.task_sandbox import create_task_sandbox
from orchard.recipes.translate.replay import replay_patch
from orchard.sandbox.client import AsyncOrchard

DIFF_FILE = re.compile(r"^diff --git a/(.*?) b/(.*)$")


@dataclass
class ProxyValues:
    """The proxies of one rollout, one value per agent step (in `step_ids` order)."""

    step_ids: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)
    test_runs: int = 0
    # whether the replay ended with the diff the run was graded on (None: the run recorded none)
    replay_matches_record: bool | None = None


def agent_steps(trajectory: Trajectory) -> list[Step]:
    return [step for step in trajectory.steps if step.source == "agent" and not step.is_copied_context]


def patch_files(patch: str) -> set[str]:
    files = set()
    for line in patch.splitlines():
        match = DIFF_FILE.match(line)
        if match:
            files.update(name for name in match.groups() if name != "/dev/null")
    return files


def changed_lines(patch: str) -> set[tuple[str, str, str]]:
    """(file, '+' or '-', the line's text stripped) for every changed line of a unified diff."""
    lines, current = set(), ""
    for line in patch.splitlines():
        match = DIFF_FILE.match(line)
        if match:
            current = match.group(2)
        elif line.startswith(("+++", "---")):
            continue
        elif line[:1] in ("+", "-") and line[1:].strip():
            lines.add((current, line[0], line[1:].strip()))
    return lines


def diff_overlap(patch: str, gold: str) -> float:
    """F1 of the changed lines of `patch` against `gold` (0 when either changes nothing)."""
    ours, theirs = changed_lines(patch), changed_lines(gold)
    common = len(ours & theirs)
    if not common:
        return 0.0
    precision, recall = common / len(ours), common / len(theirs)
    return 2 * precision * recall / (precision + recall)


def gold_files_opened(trajectory: Trajectory, gold: str) -> list[float]:
    """Per agent step: the share of the gold patch's files named in a tool call so far."""
    files = patch_files(gold)
    seen: set[str] = set()
    values = []
    for step in agent_steps(trajectory):
        for call in step.tool_calls:
            text = call.raw_arguments or str(call.arguments)
            seen.update(name for name in files if name in text)
        values.append(len(seen) / len(files) if files else 0.0)
    return values


def is_submit(dialect: Dialect, step: Step) -> bool:
    """Whether the step submits (the harness's submit tool or command), as its harness's `dialect` reads it."""
    for call in step.tool_calls:
        try:
            if isinstance(dialect.read_call(call.function_name, call.arguments, ""), Submit):
                return True
        except UntranslatableCall:
            continue
    return False


def may_change_files(dialect: Dialect, step: Step) -> bool:
    for call in step.tool_calls:
        try:
            action = dialect.read_call(call.function_name, call.arguments, "")
        except UntranslatableCall:
            return True
        if not isinstance(action, (View, Submit)):
            return True
    return False


async def sandbox_proxies(orch: AsyncOrchard, task: Task, trajectory: Trajectory, *, run_tests: bool = True,
                          max_test_runs: int = 6) -> ProxyValues:
    """All three proxies for one rollout of a SWE task with a reference patch."""
    grader = task.grader
    if not isinstance(grader, SWETestsGrader) or not grader.reference_patch:
        raise ValueError(f"task {task.id} has no SWE grader with a reference patch: no hindsight values")
    gold = grader.reference_patch
    steps = agent_steps(trajectory)
    result = ProxyValues(step_ids=[step.step_id for step in steps])
    result.values["gold_files_opened"] = gold_files_opened(trajectory, gold)
    dialect = harness_dialect(trajectory.agent.name)
    replay = await replay_patch(orch, task, trajectory, diff_after=lambda step: may_change_files(dialect, step))
    recorded = (trajectory.outcome.details.get("patch") if trajectory.outcome else None)
    result.replay_matches_record = None if recorded is None else recorded == replay.patch
    patches, last = [], ""
    for step in steps:
        last = replay.patches.get(step.step_id, last)
        patches.append(last)
    result.values["diff_overlap"] = [diff_overlap(patch, gold) for patch in patches]
    if run_tests and grader.fail_to_pass:
        passing, result.test_runs = await _tests_passing(orch, task, patches, max_test_runs)
        result.values["tests_passing"] = passing
    return result


def _chosen(distinct: Sequence[str], budget: int) -> list[str]:
    if len(distinct) <= budget:
        return list(distinct)
    if budget == 1:
        return [distinct[-1]]
    picks = {round(i * (len(distinct) - 1) / (budget - 1)) for i in range(budget)}
    return [distinct[i] for i in sorted(picks)]


async def _tests_passing(orch: AsyncOrchard, task: Task, patches: Sequence[str],
                         budget: int) -> tuple[list[float], int]:
    distinct = [p for i, p in enumerate(patches) if p.strip() and p not in patches[:i]]
    scores: dict[str, float] = {}
    for patch in _chosen(distinct, budget):
        scores[_key(patch)] = await fail_to_pass_share(orch, task, patch)
    values, current = [], 0.0
    for patch in patches:
        current = scores.get(_key(patch), current if patch.strip() else 0.0)
        values.append(current)
    return values, len(scores)


async def fail_to_pass_share(orch: AsyncOrchard, task: Task, patch: str) -> float:
    """The share of FAIL_TO_PASS tests that pass with `patch` applied in a fresh sandbox (after the test
    patch, as the grader applies them); 0 when the patch does not apply."""
    grader = task.grader
    assert isinstance(grader, SWETestsGrader)
    sandbox = await create_task_sandbox(orch, task)
    try:
        run = await swe_tests.evaluate_patch(
            sandbox_runner(sandbox), task.environment.workdir, patch, test_patch=grader.test_patch,
            fail_to_pass=grader.fail_to_pass, pass_to_pass=[], python=GRADER_PYTHON, label="replayed prefix",
            timeout=grader.timeout_s, test_command=shlex.split(grader.test_command) if grader.test_command else None)
    finally:
        await sandbox.close()
    if run.error:
        return 0.0
    return sum(run.outcomes.get(test) == swe_tests.PASSED for test in grader.fail_to_pass) / len(grader.fail_to_pass)


def _key(patch: str) -> str:
    return hashlib.blake2b(patch.encode(), digest_size=16).hexdigest()
