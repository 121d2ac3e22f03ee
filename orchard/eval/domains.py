"""Domains: what kind of work a task is — `swe` (a repository fixed, graded by its tests), `claw` (a personal
assistant's world: the Claw world's services, claw-bench's and Claw-Eval's tasks), `tau2`, `terminal`
(Harbor's tasks), `other` — and the harness × model matrix grouped by them.

A task's domain comes from what it already says (`task_domain`): `metadata["domain"]` when the task names one,
else the world or dialect it comes from, else its grader (SWE tests: `swe`). The evaluator records each task's
domain in the run's settings (`EvalSettings.task_domains`), so a report reads it without loading the suite.

**The matrix per domain** (`domain_rows`): one row per domain × harness configuration × model configuration
(the parts that make the report's rows and columns: the harness with its version, options and timeouts; the
model with its sampling settings). A row pools the tasks of that domain over every suite its runs ran — a
task is its suite (name and content hash) and id, so claw-mini's and claw-bench's tasks are all `claw` tasks
— and, like a cell (orchard.eval.matrix), counts a task's rollouts as its attempts: the rate is the mean over
tasks of each one's resolved ÷ attempts (each resolved at its own suite's pass threshold), with its Wilson
interval, and pass@k and pass^k are the means over its tasks for k up to the row's K. Runs written before
domains were recorded have none, and are left out of it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from orchard.core.task import SWETestsGrader, Task
from orchard.eval.cells import harness_text, model_text
from orchard.eval.estimators import CONFIDENCE, Interval, PassK, mean_pass_k, wilson_interval
from orchard.eval.matrix import TaskAttempts
from orchard.eval.results import EvalResults

# a task's dialect or world (its metadata key) -> its domain
WORLD_DOMAINS = {"claw": "claw", "claw-bench": "claw", "claw_bench": "claw", "claw-eval": "claw",
                 "claw_eval": "claw", "tau2": "tau2", "harbor": "terminal", "swebench": "swe"}
OTHER = "other"


def task_domain(task: Task) -> str:
    """The task's domain: `metadata["domain"]` when it names one, else that of its world or dialect (a
    metadata key such as `claw`, or `metadata["dialect"]`), else `swe` for a task graded by SWE tests, else
    `other`."""
    metadata = task.metadata
    named = metadata.get("domain")
    if isinstance(named, str) and named.strip():
        return named.strip()
    for key in metadata:
        if key in WORLD_DOMAINS:
            return WORLD_DOMAINS[key]
    dialect = metadata.get("dialect")
    if isinstance(dialect, str) and dialect in WORLD_DOMAINS:
        return WORLD_DOMAINS[dialect]
    if isinstance(task.grader, SWETestsGrader):
        return "swe"
    return OTHER


class DomainRow(BaseModel):
    """One domain's tasks run by one harness configuration with one model configuration."""

    domain: str
    harness: str = Field(description="the harness, its version and options")
    model: str = Field(description="the model and its sampling settings")
    suites: list[str] = Field(description="the suites its tasks came from")
    finished: int = Field(description="tasks with at least one attempt")
    attempts: int
    resolved: int
    errors: int = Field(description="rollouts that ended in an error (not attempts)")
    resolve_rate: float | None
    interval: Interval | None
    k: int = 1
    pass_k: list[PassK] = Field(default_factory=list, description="k = 1..k: the means over the tasks")
    per_task: list[TaskAttempts] = Field(default_factory=list, description="task ids as suite/task")


def domain_rows(runs: Sequence[EvalResults], *, confidence: float = CONFIDENCE) -> list[DomainRow]:
    """The matrix per domain: a row per domain × harness × model, domains in the order the runs first name
    them, then the harnesses and models in that order."""
    groups: dict[tuple[str, str, str], list[tuple[EvalResults, list[Any]]]] = {}
    for run in runs:
        domains = run.settings.task_domains
        if not domains:
            continue
        config = run.settings.config()
        harness = json.dumps([config.harness, config.harness_version, config.harness_options,
                              config.timeouts.model_dump()], sort_keys=True)
        model = json.dumps([config.model, config.sampling.model_dump()], sort_keys=True)
        by_domain: dict[str, list[Any]] = {}
        for task_id in run.settings.task_ids:
            by_domain.setdefault(domains.get(task_id, OTHER), [])
        for task in run.tasks:
            by_domain.setdefault(domains.get(task.task_id, OTHER), []).append(task)
        for domain, tasks in by_domain.items():
            groups.setdefault((domain, harness, model), []).append((run, tasks))
    order = {domain: index for index, domain in enumerate(dict.fromkeys(key[0] for key in groups))}
    rows = []
    for (domain, _, _), members in sorted(groups.items(), key=lambda item: order[item[0][0]]):
        by_task: dict[str, TaskAttempts] = {}
        errors = 0
        for run, tasks in members:
            for task in tasks:
                # a task's rollouts are numbered errors included: those that are not attempts were errors
                errors += task.attempt - len(task.attempts)
                if not task.attempts:
                    continue
                key = f"{run.settings.suite}/{task.task_id}"
                entry = by_task.setdefault(key, TaskAttempts(task_id=key, attempts=0, resolved=0))
                entry.attempts += len(task.attempts)
                entry.resolved += task.resolved_attempts
                entry.rewards += [attempt.reward for attempt in task.attempts]
        counts = [(entry.attempts, entry.resolved) for entry in by_task.values()]
        rate = sum(entry.rate for entry in by_task.values()) / len(by_task) if by_task else None
        k = max([run.settings.attempts for run, _ in members] + [min((n for n, _ in counts), default=1)])
        config = members[0][0].settings.config()
        rows.append(DomainRow(
            domain=domain, harness=harness_text(config), model=model_text(config),
            suites=list(dict.fromkeys(run.settings.suite for run, _ in members)), finished=len(by_task),
            attempts=sum(n for n, _ in counts), resolved=sum(c for _, c in counts), errors=errors,
            resolve_rate=rate,
            interval=wilson_interval(rate * len(by_task), len(by_task), confidence=confidence)
            if rate is not None else None,
            k=k, pass_k=[mean_pass_k(counts, j) for j in range(1, k + 1)] if counts else [],
            per_task=list(by_task.values())))
    return rows
