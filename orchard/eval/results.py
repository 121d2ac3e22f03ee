"""What an evaluation writes in its output directory, and how it is read back:

    OUT/config.json          the run's configuration, its resume key (orchard.eval.run_config)
    OUT/trajectories.jsonl   one graded Trajectory per finished rollout, appended as each finishes
    OUT/calls.jsonl          every model call as the gateway made it (the per-turn checkpoint)
    OUT/results.json         the run's settings, one row per task (its latest rollout), the summary

The trajectories are the record; results.json is derived from them and rewritten atomically after every
task, so both always agree on complete lines. A rollout whose outcome has an `error` did not happen properly
(its exit_status is an error: model, sandbox, grader, timeout...): it is shown separately and left out of the
resolve rate."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.jsonl import read_jsonl
from orchard.core.run_status import is_agent_outcome
from orchard.core.sandbox import STARTUP_STAGES, StartupTimings
from orchard.core.trajectory import Trajectory
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

    def config(self) -> EvalConfig:
        return EvalConfig.model_validate(self.model_dump(include=set(EvalConfig.model_fields)))


class TaskResult(BaseModel):
    task_id: str
    attempt: int = Field(ge=1, description="1 for the first rollout; errors are retried on resume")
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

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory, attempt: int) -> TaskResult:
        outcome = trajectory.outcome
        if outcome is None or outcome.error is not None or (
                trajectory.exit_status is not None and not is_agent_outcome(trajectory.exit_status)):
            status: TaskStatus = "error"
        else:
            status = "resolved" if outcome.resolved else "failed"
        metrics = trajectory.final_metrics
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
                   sandbox_startup=metrics.sandbox_startup if metrics else None)


class EvalSummary(BaseModel):
    total: int = Field(description="tasks selected")
    finished: int = Field(description="tasks with a resolved or failed rollout")
    resolved: int
    failed: int
    errors: int = Field(description="tasks whose latest rollout is an error")
    pending: int = Field(description="tasks never run (an interrupted run)")
    resolve_rate: float | None = Field(description="resolved / finished; errors are not attempts")
    by_exit_status: dict[str, int] = Field(default_factory=dict, description="tasks per exit_status")
    wall_time_s: float = Field(default=0.0, description="the run's elapsed time, summed over its sessions")
    task_time_s: float = Field(default=0.0, description="the tasks' own wall times, summed")
    total_tokens: int = 0
    cost_usd: float | None = None
    sandbox_startup_p50_ms: dict[str, float] = Field(
        default_factory=dict, description="the median of each start stage of the tasks' sandboxes (ms), over "
                                          "the tasks whose sandbox reported it; total_ms last")

    @classmethod
    def of(cls, tasks: list[TaskResult], total: int, elapsed_s: float = 0.0) -> EvalSummary:
        count = {status: sum(1 for r in tasks if r.status == status) for status in ("resolved", "failed", "error")}
        finished = count["resolved"] + count["failed"]
        costs = [r.cost_usd for r in tasks if r.cost_usd is not None]
        return cls(total=total, finished=finished, resolved=count["resolved"], failed=count["failed"],
                   errors=count["error"], pending=max(0, total - len(tasks)),
                   resolve_rate=count["resolved"] / finished if finished else None,
                   by_exit_status=dict(sorted(Counter(r.exit_status or "unknown" for r in tasks).items())),
                   wall_time_s=elapsed_s, task_time_s=sum(r.wall_time_s or 0.0 for r in tasks),
                   total_tokens=sum((r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in tasks),
                   cost_usd=sum(costs) if costs else None,
                   sandbox_startup_p50_ms=startup_medians([r.sandbox_startup for r in tasks if r.sandbox_startup]))


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


def build_results(run_id: str, settings: EvalSettings, started_at: str, trajectories: list[Trajectory], *,
                  interrupted: bool = False, elapsed_s: float = 0.0) -> EvalResults:
    latest = latest_by_task(trajectories)
    rows = [TaskResult.from_trajectory(*latest[task_id]) for task_id in settings.task_ids if task_id in latest]
    return EvalResults(run_id=run_id, settings=settings, started_at=started_at, updated_at=utc_now(),
                       interrupted=interrupted, elapsed_s=elapsed_s,
                       summary=EvalSummary.of(rows, len(settings.task_ids), elapsed_s), tasks=rows)


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
