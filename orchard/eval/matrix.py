"""The harness × model matrix of a cross-harness study: per cell the resolve rate with its confidence interval,
pass@k and pass^k, mean steps, tokens and wall time per attempt, and the errors apart.

**A cell is a configuration** (orchard.eval.cells): the suite's content, the harness with its version and
options, the model with its sampling settings, the timeouts — the runs' resolved configuration, their resume
key. Runs of the same configuration are one cell; runs that differ in anything are different cells.

**Tasks and attempts.** A cell's runs may each run a task: those rollouts are attempts of that one task
(the basis for pass@k), never more tasks. An attempt is a rollout with an agent outcome (resolved or
failed); errors are not attempts and are counted apart. A task's success rate is its resolved attempts over
its attempts, and **the cell's rate is the mean over its attempted tasks of their success rates**: each task
weighs the same however often it was run (with one attempt per task it is resolved ÷ attempts).

**Repeated attempts** (`orchard eval --attempts K`, or several runs of one configuration): per task n
attempts with c resolved give pass@k (at least one of k succeeds) and pass^k (all k succeed), unbiased
(orchard.eval.estimators); the cell's are the means over its tasks, for k = 1 up to the cell's K (the most
attempts its runs asked for, or the fewest any task has when every task has more). A k that some task has
fewer attempts for is "not computable" (None, the tasks short counted), never a mean over the other tasks.

**The interval** of the rate is a Wilson score interval with the tasks as the sample: p = the cell's rate,
n = its attempted tasks. Unlike a bootstrap it does not collapse at 0 % or 100 % (6 of 6 tasks resolved:
61 %–100 %, not 100 %–100 %). The tasks, not the attempts, are the sample because a task's attempts are not
independent draws (an easy task is resolved every time): counting 6 tasks × 10 attempts as 60 would make
the interval far too narrow. With one attempt per task it is exactly Wilson's interval for resolved ÷
tasks; with more it is conservative (as if a task's attempts all agreed).

**Harness against harness.** Each cell after the first of its suite and model (with the same sampling
settings) also gets its difference to that first cell (`versus`): the mean of (this cell's task rate − the
first cell's) over the tasks both attempted, with a paired percentile bootstrap interval (the tasks
resampled with replacement `resamples` times, 10,000, each keeping its two rates; the seed is fixed, so the
same runs always give the same interval). An interval that excludes 0 says the harnesses differ on tasks
like these; one of [+0%, +0%] (the harnesses agreed on every task) says no more than that: on these tasks
they did not differ. `bootstrap_interval` is the same resampling for one cell's rate."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, Field

from orchard.eval.cells import cell_key, harness_text, model_text, suite_key, suite_text
from orchard.eval.estimators import CONFIDENCE, Interval, PassK, mean_pass_k, task_pass_k, wilson_interval
from orchard.eval.results import EvalResults
from orchard.eval.run_config import EvalConfig

RESAMPLES = 10_000
SEED = 0


def bootstrap_interval(outcomes: Sequence[float], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                       seed: int = SEED) -> Interval | None:
    """The percentile bootstrap interval of the mean of `outcomes`, one per task: resolved or not (a bool),
    or the task's success rate over its attempts (0 to 1); None when there are none."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    n = len(outcomes)
    if n == 0:
        return None
    values = [float(outcome) for outcome in outcomes]
    if len(set(values)) == 1:
        return Interval(low=values[0], high=values[0], confidence=confidence)
    rng = random.Random(seed)
    if set(values) <= {0.0, 1.0}:
        p = sum(values) / n
        # Resampling n tasks with replacement and counting the resolved ones is n draws of "resolved with
        # probability k/n": the same distribution, without building the resampled lists.
        rates = sorted(sum(1 for _ in range(n) if rng.random() < p) / n for _ in range(resamples))
    else:
        rates = sorted(sum(values[int(rng.random() * n)] for _ in range(n)) / n for _ in range(resamples))
    return _percentiles(rates, confidence)


def _percentiles(sorted_means: list[float], confidence: float) -> Interval:
    tail, count = (1 - confidence) / 2, len(sorted_means)
    low = sorted_means[max(0, math.ceil(tail * count) - 1)]
    high = sorted_means[min(count - 1, math.ceil((1 - tail) * count) - 1)]
    return Interval(low=low, high=high, confidence=confidence)


class Difference(BaseModel):
    """This cell's resolve rate minus the baseline cell's, over the tasks both attempted (paired)."""

    baseline: str = Field(description="the baseline cell's harness, with its version and options")
    tasks: int = Field(description="tasks both cells attempted")
    delta: float
    interval: Interval


def paired_difference(outcomes: Mapping[str, float], baseline: Mapping[str, float], *,
                      confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                      seed: int = SEED) -> tuple[int, float, Interval] | None:
    """(tasks, mean difference, its percentile bootstrap interval) of `outcomes` − `baseline` over the tasks
    both have (per task: resolved or not, or its success rate over its attempts): the tasks are resampled
    with replacement, each keeping its pair, so a task's own difficulty cancels out (a paired comparison
    needs far fewer tasks than two separate intervals suggest). None when they share no task."""
    shared = [task for task in outcomes if task in baseline]
    if not shared:
        return None
    n = len(shared)
    differences = [float(outcomes[task]) - float(baseline[task]) for task in shared]
    delta = sum(differences) / n
    rng = random.Random(seed)
    means = []
    if set(differences) <= {-1.0, 0.0, 1.0}:
        # Only tasks where the two differ move the mean: draw each resampled task's difference by its frequency.
        up, down = differences.count(1) / n, differences.count(-1) / n
        for _ in range(resamples):
            total = 0
            for _ in range(n):
                draw = rng.random()
                total += 1 if draw < up else (-1 if draw < up + down else 0)
            means.append(total / n)
    else:
        means = [sum(differences[int(rng.random() * n)] for _ in range(n)) / n for _ in range(resamples)]
    means.sort()
    return n, delta, _percentiles(means, confidence)


class TaskAttempts(BaseModel):
    """One task of a cell: its attempts over the cell's runs."""

    task_id: str
    attempts: int
    resolved: int
    rewards: list[float | None] = Field(default_factory=list, description="each attempt's reward, in order")

    @property
    def rate(self) -> float:
        return self.resolved / self.attempts

    def pass_k(self, k: int) -> PassK:
        return task_pass_k(self.attempts, self.resolved, k)


class MatrixRow(BaseModel):
    """One cell of the matrix: every run of one configuration, a task's rollouts its attempts."""

    suite: str
    harness: str
    model: str
    config: EvalConfig = Field(description="the cell's identity: its runs' resolved configuration")
    tasks: int = Field(description="distinct tasks its runs selected")
    finished: int = Field(description="distinct tasks with at least one attempt (a resolved or failed rollout)")
    attempts: int = Field(description="resolved or failed rollouts, over all runs (a task's repeats included)")
    resolved: int = Field(description="resolved attempts")
    failed: int = Field(description="failed attempts")
    errors: int = Field(description="rollouts that ended in an error (not attempts)")
    pending: int = Field(description="tasks selected that no run of the cell ran")
    resolve_rate: float | None = Field(description="the mean over finished tasks of each one's resolved share of "
                                                   "its attempts")
    interval: Interval | None = Field(description="Wilson score interval of resolve_rate, the tasks the sample")
    k: int = Field(default=1, description="the attempts per task the pass@k and pass^k go up to")
    pass_k: list[PassK] = Field(default_factory=list, description="k = 1..k: the means over the tasks")
    per_task: list[TaskAttempts] = Field(default_factory=list, description="each finished task's attempts")
    mean_steps: float | None = Field(description="per attempt")
    mean_tokens: float | None = Field(description="prompt + completion tokens per attempt")
    mean_wall_s: float | None = Field(description="a task's own wall time per attempt")
    wall_time_s: float = Field(description="the runs' elapsed time, summed")
    runs: list[int] = Field(default_factory=list, description="indices of the runs in this cell")
    versus: Difference | None = Field(default=None, description=(
        "the rate minus that of the first cell of the same suite and model settings, paired over shared tasks"))

    @property
    def harness_text(self) -> str:
        return harness_text(self.config)

    @property
    def model_text(self) -> str:
        return model_text(self.config)

    @property
    def suite_text(self) -> str:
        return suite_text(self.config)

    @property
    def attempts_per_task(self) -> float | None:
        return self.attempts / self.finished if self.finished else None


def matrix_rows(runs: Sequence[EvalResults], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                seed: int = SEED) -> list[MatrixRow]:
    """One row per configuration (orchard.eval.cells), in the order the runs first name them."""
    cells: dict[str, list[int]] = {}
    for index, run in enumerate(runs):
        cells.setdefault(cell_key(run.settings.config()), []).append(index)
    rows = []
    rates: list[dict[str, float]] = []
    for indices in cells.values():
        members = [runs[index] for index in indices]
        config = members[0].settings.config()
        results = [task for run in members for task in run.tasks]
        attempts = [attempt for task in results for attempt in task.attempts]
        by_task: dict[str, TaskAttempts] = {}
        for task in results:
            if task.attempts:
                entry = by_task.setdefault(task.task_id, TaskAttempts(task_id=task.task_id, attempts=0, resolved=0))
                entry.attempts += len(task.attempts)
                entry.resolved += task.resolved_attempts
                entry.rewards += [attempt.reward for attempt in task.attempts]
        task_rates = {task_id: entry.rate for task_id, entry in by_task.items()}
        selected = set(task_id for run in members for task_id in run.settings.task_ids)
        ran = set(task.task_id for task in results)
        resolved = sum(entry.resolved for entry in by_task.values())
        rate = sum(task_rates.values()) / len(task_rates) if task_rates else None
        counts = [(entry.attempts, entry.resolved) for entry in by_task.values()]
        k = max([run.settings.attempts for run in members] + [min((n for n, _ in counts), default=1)])
        rates.append(task_rates)
        rows.append(MatrixRow(
            suite=config.suite, harness=config.harness, model=config.model, config=config,
            tasks=len(selected | ran), finished=len(task_rates), attempts=len(attempts), resolved=resolved,
            failed=len(attempts) - resolved, errors=sum(run.summary.errored_rollouts for run in members),
            pending=len(selected - ran), resolve_rate=rate,
            interval=wilson_interval(rate * len(task_rates), len(task_rates), confidence=confidence)
            if rate is not None else None,
            k=k, pass_k=[mean_pass_k(counts, j) for j in range(1, k + 1)] if counts else [],
            per_task=list(by_task.values()),
            mean_steps=_mean(attempt.steps for attempt in attempts),
            mean_tokens=_mean(attempt.tokens for attempt in attempts),
            mean_wall_s=_mean(attempt.wall_time_s for attempt in attempts if attempt.wall_time_s is not None),
            wall_time_s=sum(run.elapsed_s for run in members), runs=indices))
    for position, row in enumerate(rows):
        first = next(index for index, other in enumerate(rows) if _same_suite_and_model(other, row))
        if first == position:
            continue
        paired = paired_difference(rates[position], rates[first], confidence=confidence, resamples=resamples,
                                   seed=seed)
        if paired is not None:
            row.versus = Difference(baseline=rows[first].harness_text, tasks=paired[0], delta=paired[1],
                                    interval=paired[2])
    return rows


def _same_suite_and_model(one: MatrixRow, other: MatrixRow) -> bool:
    return (suite_key(one.config), one.model, one.config.sampling) == (
        suite_key(other.config), other.model, other.config.sampling)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None
