"""What an evaluation writes in its output directory, and how it is read back:

    OUT/config.json          the run's configuration, its resume key (orchard.eval.run_config)
    OUT/trajectories.jsonl   one graded Trajectory per finished rollout, appended as each finishes
    OUT/calls.jsonl          every model call as the gateway made it (the per-turn checkpoint)
    OUT/results.json         the run's settings, one row per task (its latest rollout), the summary

The trajectories are the record; results.json is derived from them and rewritten atomically after every
task, so both always agree on complete lines. A rollout whose outcome has an `error` did not happen properly
(its exit_status is an error: model, sandbox, grader, timeout...): it is shown separately and left out of the
resolve rate. The other rollouts of a task are its **attempts** (resolved or failed): a run with `attempts`
K gives each task K of them, and a task's row lists them all (`TaskResult.attempts`), so pass@k and pass^k
(orchard.eval.estimators) are computed from the row without the trajectories."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.jsonl import read_jsonl
from orchard.core.run_status import is_agent_outcome
from orchard.core.sandbox import STARTUP_STAGES, StartupTimings
from orchard.core.trajectory import Trajectory
from orchard.eval.estimators import PassK, mean_pass_k, task_pass_k
from orchard.eval.run_config import EvalConfig, read_model_file

RESULTS_FILE = "results.json"
TRAJECTORIES_FILE = "trajectories.jsonl"

TaskStatus = Literal["resolved", "failed", "error"]


class EvalSettings(EvalConfig):
    """What was run: the configuration (a resumed run must have the same), plus the tasks selected and how
    many ran at once (which a resumed run may change)."""

    suite_path: str | None = None
    task_ids: list[str] = Field(description="the tasks selected for this run, in order")
    parallel: int = 1
    attempts: int = Field(default=1, ge=1, description="finished attempts (resolved or failed) each task gets; "
                                                       "a resumed run may ask for more")
    error_retries: int = Field(default=0, ge=0, description="rollouts per task a session may run to replace "
                                                           "errored ones")
    task_domains: dict[str, str] = Field(default_factory=dict, description=(
        "each selected task's domain (orchard.eval.domains: swe, claw, ...), for the matrix per domain; empty in "
        "runs written before domains were recorded"))

    def config(self) -> EvalConfig:
        return EvalConfig.model_validate(self.model_dump(include=set(EvalConfig.model_fields)))


class Attempt(BaseModel):
    """One attempt of a task: a rollout with an agent outcome (errors are not attempts)."""

    rollout: int = Field(ge=1, description="the rollout's number (its rollout key's last part; errors count)")
    status: Literal["resolved", "failed"]
    reward: float | None = None
    steps: int = 0
    tokens: int = Field(default=0, description="prompt + completion tokens")
    wall_time_s: float | None = None


class TaskResult(BaseModel):
    """A task of a run: its latest rollout (status, exit status, accounting) and every attempt it had."""

    task_id: str
    attempt: int = Field(ge=1, description="the latest rollout's number: 1 for the first; errors count too")
    rollout_key: str | None
    status: TaskStatus
    exit_status: str | None = Field(default=None, description="how the rollout ended (orchard.core.run_status)")
    partial: bool = Field(default=False, description="the agent was cut off; its steps are those recorded")
    reward: float | None = None
    error: str | None = None
    steps: int = 0
    n_llm_calls: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    wall_time_s: float | None = None
    sandbox_cpu_s: float | None = None
    sandbox_startup: StartupTimings | None = Field(
        default=None, description="where the start of the task's sandbox went, stage by stage (ms)")
    attempts: list[Attempt] = Field(default_factory=list, description=(
        "the task's attempts in this run (its resolved or failed rollouts), in order; errors are not attempts"))

    @model_validator(mode="before")
    @classmethod
    def _attempts_of_an_older_row(cls, data):
        """A row written before attempts were listed (or built by hand) is one rollout: an attempt unless an
        error."""
        if isinstance(data, dict) and "attempts" not in data and data.get("status") in ("resolved", "failed"):
            tokens = (data.get("prompt_tokens") or 0) + (data.get("completion_tokens") or 0)
            data = {**data, "attempts": [{"rollout": data.get("attempt", 1), "status": data["status"],
                                          "reward": data.get("reward"), "steps": data.get("steps", 0),
                                          "tokens": tokens, "wall_time_s": data.get("wall_time_s")}]}
        return data

    @property
    def resolved_attempts(self) -> int:
        return sum(1 for attempt in self.attempts if attempt.status == "resolved")

    def pass_k(self, k: int) -> PassK:
        """This task's pass@k and pass^k from its attempts (None where it has fewer than k)."""
        return task_pass_k(len(self.attempts), self.resolved_attempts, k)

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory, attempt: int,
                        attempts: list[Attempt] | None = None) -> TaskResult:
        """The row of a task whose latest rollout is `trajectory`, its `attempt`-th; `attempts`: all of the
        task's attempts (default: this rollout's, when it is one)."""
        status = rollout_status(trajectory)
        metrics = trajectory.final_metrics
        outcome = trajectory.outcome
        if attempts is None:
            attempts = [attempt_of(trajectory, attempt)] if status != "error" else []
        return cls(task_id=trajectory.task_id or "", attempt=attempt, rollout_key=trajectory.rollout_key,
                   status=status, exit_status=trajectory.exit_status, partial=trajectory.partial,
                   reward=outcome.reward if outcome else None,
                   error=(outcome.error if outcome else "the rollout was never graded"),
                   steps=len(trajectory.steps), n_llm_calls=len(trajectory.llm_calls),
                   prompt_tokens=metrics.total_prompt_tokens if metrics else None,
                   completion_tokens=metrics.total_completion_tokens if metrics else None,
                   cost_usd=metrics.total_cost_usd if metrics else None,
                   wall_time_s=metrics.wall_time_s if metrics else None,
                   sandbox_cpu_s=metrics.sandbox_cpu_s if metrics else None,
                   sandbox_startup=metrics.sandbox_startup if metrics else None, attempts=attempts)


def rollout_status(trajectory: Trajectory) -> TaskStatus:
    """resolved, failed (the agent's outcomes: attempts), or error (anything else: not an attempt)."""
    outcome = trajectory.outcome
    if outcome is None or outcome.error is not None or (
            trajectory.exit_status is not None and not is_agent_outcome(trajectory.exit_status)):
        return "error"
    return "resolved" if outcome.resolved else "failed"


def attempt_of(trajectory: Trajectory, rollout: int) -> Attempt:
    """The attempt a rollout with an agent outcome is (its status must not be an error)."""
    status = rollout_status(trajectory)
    assert status != "error", "an errored rollout is not an attempt"
    metrics = trajectory.final_metrics
    tokens = ((metrics.total_prompt_tokens or 0) + (metrics.total_completion_tokens or 0)) if metrics else 0
    return Attempt(rollout=rollout, status=status, reward=trajectory.outcome.reward if trajectory.outcome else None,
                   steps=len(trajectory.steps), tokens=tokens, wall_time_s=metrics.wall_time_s if metrics else None)


class EvalSummary(BaseModel):
    total: int = Field(description="tasks selected")
    finished: int = Field(description="tasks with at least one attempt (a resolved or failed rollout)")
    resolved: int = Field(description="resolved attempts (with one attempt per task: resolved tasks)")
    failed: int = Field(description="failed attempts")
    attempts: int = Field(default=0, description="resolved + failed: the attempts of every task")
    attempts_per_task: int = Field(default=1, description="the attempts each task is to get (--attempts)")
    short: int = Field(default=0, description="tasks run that have fewer attempts than attempts_per_task")
    errors: int = Field(description="tasks whose latest rollout is an error")
    error_rollouts: int = Field(default=0, description="rollouts that ended in an error (not attempts)")
    pending: int = Field(description="tasks never run (an interrupted run)")
    resolve_rate: float | None = Field(description="the mean over finished tasks of each one's resolved ÷ "
                                                   "attempts (with one attempt per task: resolved / finished); "
                                                   "errors are not attempts")
    pass_k: list[PassK] = Field(default_factory=list, description=(
        "pass@k and pass^k for k = 1..attempts_per_task, the mean over the tasks (None while a task has fewer "
        "than k attempts)"))
    by_exit_status: dict[str, int] = Field(default_factory=dict, description="tasks per exit_status")
    wall_time_s: float = Field(default=0.0, description="the run's elapsed time, summed over its sessions")
    task_time_s: float = Field(default=0.0, description="the tasks' own wall times, summed")
    total_tokens: int = 0
    cost_usd: float | None = None
    sandbox_startup_p50_ms: dict[str, float] = Field(
        default_factory=dict, description="the median of each start stage of the tasks' sandboxes (ms), over "
                                          "the tasks whose sandbox reported it; total_ms last")

    @classmethod
    def of(cls, tasks: list[TaskResult], total: int, elapsed_s: float = 0.0, *, attempts_per_task: int = 1,
           error_rollouts: int | None = None) -> EvalSummary:
        counts = [(len(r.attempts), r.resolved_attempts) for r in tasks if r.attempts]
        resolved = sum(c for _, c in counts)
        attempts = sum(n for n, _ in counts)
        errors = sum(1 for r in tasks if r.status == "error")
        costs = [r.cost_usd for r in tasks if r.cost_usd is not None]
        return cls(total=total, finished=len(counts), resolved=resolved, failed=attempts - resolved,
                   attempts=attempts, attempts_per_task=attempts_per_task,
                   short=sum(1 for r in tasks if len(r.attempts) < attempts_per_task), errors=errors,
                   error_rollouts=errors if error_rollouts is None else error_rollouts,
                   pending=max(0, total - len(tasks)),
                   resolve_rate=sum(c / n for n, c in counts) / len(counts) if counts else None,
                   pass_k=[mean_pass_k(counts, k) for k in range(1, attempts_per_task + 1)] if counts else [],
                   by_exit_status=dict(sorted(Counter(r.exit_status or "unknown" for r in tasks).items())),
                   wall_time_s=elapsed_s, task_time_s=sum(r.wall_time_s or 0.0 for r in tasks),
                   total_tokens=sum((r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in tasks),
                   cost_usd=sum(costs) if costs else None,
                   sandbox_startup_p50_ms=startup_medians([r.sandbox_startup for r in tasks if r.sandbox_startup]))

    @property
    def errored_rollouts(self) -> int:
        """Rollouts that ended in an error (a summary written before they were counted: its tasks in error)."""
        return max(self.error_rollouts, self.errors)


def startup_medians(timings: list[StartupTimings]) -> dict[str, float]:
    """The median of each stage over the sandboxes that reported it (stages none reported are left out)."""
    medians = {}
    for stage in (*STARTUP_STAGES, "total_ms"):
        values = [getattr(t, stage) for t in timings if getattr(t, stage) is not None]
        if values:
            medians[stage] = statistics.median(values)
    return medians


class EvalResults(BaseModel):
    run_id: str
    settings: EvalSettings
    started_at: str
    updated_at: str
    interrupted: bool = False
    elapsed_s: float = Field(default=0.0, description="time spent running, over every session of the run")
    summary: EvalSummary
    tasks: list[TaskResult] = Field(default_factory=list, description="one per task run, in suite order")

    @property
    def label(self) -> str:
        """`react (step_limit=5) × oracle (temperature=0.2) on swe-mini`: with the options that tell it apart."""
        from orchard.eval.cells import harness_text, model_text  # cells sits on run_config, as results does

        config = self.settings.config()
        return f"{harness_text(config)} × {model_text(config)} on {self.settings.suite}"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def latest_by_task(trajectories: list[Trajectory]) -> dict[str, tuple[Trajectory, int]]:
    """Each task's latest rollout and how many rollouts it had (its attempt number)."""
    latest: dict[str, tuple[Trajectory, int]] = {}
    for trajectory in trajectories:
        if trajectory.task_id is None:
            continue
        previous = latest.get(trajectory.task_id)
        latest[trajectory.task_id] = (trajectory, (previous[1] if previous else 0) + 1)
    return latest


def attempts_by_task(trajectories: list[Trajectory]) -> dict[str, list[Attempt]]:
    """Each task's attempts (its rollouts with an agent outcome) in the order they finished, each numbered as
    its rollout key numbers it (attempts run side by side may finish out of order), else by its position among
    the task's rollouts."""
    rollouts: dict[str, int] = {}
    attempts: dict[str, list[Attempt]] = {}
    for trajectory in trajectories:
        if trajectory.task_id is None:
            continue
        number = rollouts[trajectory.task_id] = rollouts.get(trajectory.task_id, 0) + 1
        suffix = (trajectory.rollout_key or "").rpartition(":")[2]
        if rollout_status(trajectory) != "error":
            attempts.setdefault(trajectory.task_id, []).append(
                attempt_of(trajectory, int(suffix) if suffix.isdigit() and int(suffix) > 0 else number))
    return attempts


def build_results(run_id: str, settings: EvalSettings, started_at: str, trajectories: list[Trajectory], *,
                  interrupted: bool = False, elapsed_s: float = 0.0) -> EvalResults:
    latest = latest_by_task(trajectories)
    attempts = attempts_by_task(trajectories)
    rows = [TaskResult.from_trajectory(*latest[task_id], attempts.get(task_id, []))
            for task_id in settings.task_ids if task_id in latest]
    selected = set(settings.task_ids)
    error_rollouts = sum(1 for t in trajectories if t.task_id in selected and rollout_status(t) == "error")
    summary = EvalSummary.of(rows, len(settings.task_ids), elapsed_s, attempts_per_task=settings.attempts,
                             error_rollouts=error_rollouts)
    return EvalResults(run_id=run_id, settings=settings, started_at=started_at, updated_at=utc_now(),
                       interrupted=interrupted, elapsed_s=elapsed_s, summary=summary, tasks=rows)


def read_results(out_dir: Path) -> EvalResults | None:
    return read_model_file(Path(out_dir) / RESULTS_FILE, EvalResults, "an Orchard results file")


def read_trajectories(out_dir: Path) -> list[Trajectory]:
    path = Path(out_dir) / TRAJECTORIES_FILE
    return read_jsonl(path) if path.exists() else []


def write_results(out_dir: Path, results: EvalResults) -> None:
    """Replace results.json atomically: readers see the old file or the new one, never half of one."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = json.dumps(results.model_dump(mode="json"), indent=2) + "\n"
    atomic_write_bytes(out_dir / RESULTS_FILE, document.encode())
