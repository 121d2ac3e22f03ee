"""The harness × model matrix of a cross-harness study: per suite, harness and model the resolve rate with a
bootstrap confidence interval, mean steps, tokens and wall time per attempt, and the errors apart.

**The interval** is a seeded percentile bootstrap over tasks: the cell's finished tasks (resolved or failed;
errors are not attempts and are left out) are resampled with replacement `resamples` times (10,000), each
resample's resolve rate is computed, and the interval runs from the (1 − confidence)/2 to the
(1 + confidence)/2 quantile of those rates (nearest rank). The seed is fixed, so the same runs always give
the same interval. It says how much the rate could move had the suite held other tasks like these; it says
nothing about a model's sampling noise on the same task (one rollout per task). At 0 % or 100 % every
resample gives the same rate and the interval collapses to a point: read it then as "too few tasks to
tell" (with n tasks all resolved, the true rate can still be as low as about 1 − 3/n).

**Harness against harness.** Each cell after the first of its model and suite also gets its difference to
that first cell (`versus`): the mean of (this cell's outcome − the first cell's) over the tasks both
attempted, with a paired percentile bootstrap interval (the tasks resampled, each keeping its two outcomes).
An interval that excludes 0 says the harnesses differ on tasks like these."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from orchard.eval.results import EvalResults

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 0


class Interval(BaseModel):
    low: float
    high: float
    confidence: float = CONFIDENCE


def bootstrap_interval(outcomes: Sequence[bool], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                       seed: int = SEED) -> Interval | None:
    """The percentile bootstrap interval of the mean of `outcomes` (one bool per task: resolved or not);
    None when there are none."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    n = len(outcomes)
    if n == 0:
        return None
    resolved = sum(1 for outcome in outcomes if outcome)
    if resolved in (0, n):
        return Interval(low=resolved / n, high=resolved / n, confidence=confidence)
    rng = random.Random(seed)
    p = resolved / n
    # Resampling n tasks with replacement and counting the resolved ones is n draws of "resolved with
    # probability k/n": the same distribution, without building the resampled lists.
    rates = sorted(sum(1 for _ in range(n) if rng.random() < p) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = rates[max(0, math.ceil(tail * resamples) - 1)]
    high = rates[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return Interval(low=low, high=high, confidence=confidence)


class Difference(BaseModel):
    """This cell's resolve rate minus the baseline cell's, over the tasks both attempted (paired)."""

    baseline: str = Field(description="the baseline cell's harness")
    tasks: int = Field(description="tasks both cells attempted")
    delta: float
    interval: Interval


def paired_difference(outcomes: dict[str, bool], baseline: dict[str, bool], *, confidence: float = CONFIDENCE,
                      resamples: int = RESAMPLES, seed: int = SEED) -> tuple[int, float, Interval] | None:
    """(tasks, mean difference, its percentile bootstrap interval) of `outcomes` − `baseline` over the tasks
    both have: the tasks are resampled with replacement, each keeping its pair of outcomes, so a task's own
    difficulty cancels out (a paired comparison needs far fewer tasks than two separate intervals suggest).
    None when they share no task."""
    shared = [task for task in outcomes if task in baseline]
    if not shared:
        return None
    n = len(shared)
    differences = [int(outcomes[task]) - int(baseline[task]) for task in shared]
    delta = sum(differences) / n
    rng = random.Random(seed)
    # Only tasks where the two differ move the mean: draw each resampled task's difference by its frequency.
    up, down = differences.count(1) / n, differences.count(-1) / n
    means = []
    for _ in range(resamples):
        total = 0
        for _ in range(n):
            draw = rng.random()
            total += 1 if draw < up else (-1 if draw < up + down else 0)
        means.append(total / n)
    means.sort()
    tail = (1 - confidence) / 2
    low = means[max(0, math.ceil(tail * resamples) - 1)]
    high = means[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return n, delta, Interval(low=low, high=high, confidence=confidence)


class MatrixRow(BaseModel):
    """One cell of the matrix: every run of this harness and model on this suite, their tasks together."""

    suite: str
    harness: str
    model: str
    tasks: int = Field(description="tasks selected")
    finished: int = Field(description="attempts: tasks whose latest rollout was resolved or failed")
    resolved: int
    failed: int
    errors: int = Field(description="tasks whose latest rollout is an error (not an attempt)")
    pending: int = Field(description="tasks never run")
    resolve_rate: float | None = Field(description="resolved / finished")
    interval: Interval | None = Field(description="bootstrap confidence interval of resolve_rate")
    mean_steps: float | None = Field(description="per attempt (finished tasks only)")
    mean_tokens: float | None = Field(description="prompt + completion tokens per attempt")
    mean_wall_s: float | None = Field(description="a task's own wall time per attempt")
    wall_time_s: float = Field(description="the runs' elapsed time, summed")
    runs: list[int] = Field(default_factory=list, description="indices of the runs in this cell")
    versus: Difference | None = Field(default=None, description=(
        "the rate minus that of the suite's first harness with the same model, paired over shared tasks"))


def matrix_rows(runs: Sequence[EvalResults], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                seed: int = SEED) -> list[MatrixRow]:
    """One row per (suite, harness, model), in the order the runs first name them."""
    cells: dict[tuple[str, str, str], list[int]] = {}
    for index, run in enumerate(runs):
        settings = run.settings
        cells.setdefault((settings.suite, settings.harness, settings.model), []).append(index)
    rows = []
    outcomes: dict[tuple[str, str, str], dict[str, bool]] = {}
    for (suite, harness, model), indices in cells.items():
        members = [runs[index] for index in indices]
        tasks = [task for run in members for task in run.tasks]
        attempts = [task for task in tasks if task.status != "error"]
        resolved = sum(1 for task in attempts if task.status == "resolved")
        outcomes[(suite, harness, model)] = {task.task_id: task.status == "resolved" for task in attempts}
        rows.append(MatrixRow(
            suite=suite, harness=harness, model=model, tasks=sum(run.summary.total for run in members),
            finished=len(attempts), resolved=resolved, failed=len(attempts) - resolved,
            errors=sum(1 for task in tasks if task.status == "error"),
            pending=sum(run.summary.pending for run in members),
            resolve_rate=resolved / len(attempts) if attempts else None,
            interval=bootstrap_interval([task.status == "resolved" for task in attempts], confidence=confidence,
                                        resamples=resamples, seed=seed),
            mean_steps=_mean(task.steps for task in attempts),
            mean_tokens=_mean((task.prompt_tokens or 0) + (task.completion_tokens or 0) for task in attempts),
            mean_wall_s=_mean(task.wall_time_s for task in attempts if task.wall_time_s is not None),
            wall_time_s=sum(run.elapsed_s for run in members), runs=indices))
    for row in rows:
        first = next(other for other in rows if (other.suite, other.model) == (row.suite, row.model))
        if first is row:
            continue
        paired = paired_difference(outcomes[(row.suite, row.harness, row.model)],
                                   outcomes[(first.suite, first.harness, first.model)], confidence=confidence,
                                   resamples=resamples, seed=seed)
        if paired is not None:
            row.versus = Difference(baseline=first.harness, tasks=paired[0], delta=paired[1], interval=paired[2])
    return rows


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None
