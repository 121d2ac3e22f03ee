"""How a rollout ended (`ExitStatus`) and how long each phase of its trial took (`PhaseRecord`).

Every harness sets `Trajectory.exit_status` when its loop stops; the evaluator sets it when the trial
stopped the harness (its deadline passed, the run was interrupted) or a phase around the agent failed.
The statuses fall in two classes, and only the first is an attempt of the agent:

- agent outcomes: the agent stopped by itself (`submitted`) or hit one of its own limits — a result that
  is graded and counts in the resolve rate;
- errors: the infrastructure failed (model API, sandbox, grader, task environment), the harness crashed,
  or the trial's deadline cut the agent off. Such a rollout is kept (partial steps included) but never
  counted as an attempt, and `orchard eval` runs it again when the run is resumed."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

ExitStatus = Literal[
    # agent outcomes: graded, counted as attempts
    "submitted",        # the agent said it was done
    "step_limit",       # the harness's limit on model calls
    "cost_limit",       # the harness's limit on cost
    "token_limit",      # the harness's limit on tokens
    "time_limit",       # the harness's own wall-time limit (not the trial's deadline)
    "budget_exhausted",  # the gateway refused further calls: the rollout's budget is spent
    "format_errors",    # the model kept answering in a form the harness could not parse
    "stopped",          # the agent ended without submitting (e.g. it stopped calling tools)
    # errors: not attempts, retried on resume
    "timeout",          # the trial's deadline passed while the agent ran
    "interrupted",      # the evaluation was stopped (Ctrl-C, kill) while the agent ran
    "model_error",      # the model API failed
    "sandbox_error",    # a sandbox failed (creation, exec, lost agent)
    "environment_error",  # the task's environment could not be set up (files, setup commands)
    "harness_error",    # the harness's own setup failed
    "agent_error",      # the harness crashed (a bug in the agent loop)
    "grader_error",     # grading could not run properly (the verdict is unknown)
]

EXIT_STATUSES: tuple[str, ...] = get_args(ExitStatus)
AGENT_OUTCOMES: frozenset[str] = frozenset(EXIT_STATUSES[:EXIT_STATUSES.index("timeout")])
ERROR_STATUSES: frozenset[str] = frozenset(EXIT_STATUSES) - AGENT_OUTCOMES


def is_agent_outcome(status: str | None) -> bool:
    """True when a rollout that ended with `status` is an attempt of the agent (graded, counted)."""
    return status in AGENT_OUTCOMES


PhaseName = Literal["environment", "harness_setup", "agent", "patch", "verify"]
PhaseResult = Literal["ok", "error", "timeout", "skipped"]


class PhaseRecord(BaseModel):
    """One phase of a trial: when it started, how long it took and how it ended."""

    model_config = ConfigDict(extra="forbid")

    name: PhaseName
    result: PhaseResult
    started_at: str | None = Field(default=None, description="ISO 8601")
    duration_s: float = Field(default=0.0, ge=0)
    timeout_s: float | None = Field(default=None, ge=0, description="the limit the phase ran under")
    error: str | None = None
