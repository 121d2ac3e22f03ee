"""How a trial's failures are classed, phase by phase (trial.py): a typed error status, or (None) the agent's
own failed attempt; and the trajectory's exit status and outcome made to agree."""

from __future__ import annotations

from orchard.core.errors import BackendError, InvalidRequest, SandboxLost, SandboxNotFound
from orchard.core.run_status import ExitStatus, is_agent_outcome
from orchard.core.trajectory import LLMCall, Outcome, Trajectory


def environment_status(exc: BaseException) -> ExitStatus:
    if isinstance(exc, (InvalidRequest, TimeoutError)):
        return "environment_error"  # the task's environment is broken (or its setup hangs)
    return "sandbox_error"


def harness_setup_status(exc: BaseException) -> ExitStatus:
    return "sandbox_error" if isinstance(exc, (SandboxLost, SandboxNotFound, BackendError)) else "harness_error"


def patch_status(exc: BaseException) -> ExitStatus | None:
    # None: the agent broke the repository or made a diff too large (or too slow) to take — its failed
    # attempt. A sandbox that fails meanwhile is an error.
    return None if isinstance(exc, (InvalidRequest, TimeoutError)) else "sandbox_error"


def grader_status(exc: BaseException) -> ExitStatus:
    return "grader_error"


def settle_exit_status(trajectory: Trajectory) -> None:
    """Make exit_status and outcome agree: an error outcome has an error status and vice versa."""
    error = trajectory.outcome.error if trajectory.outcome else None
    status = trajectory.exit_status
    if error is not None and (status is None or is_agent_outcome(status)):
        trajectory.exit_status = "agent_error"
    elif error is None and status is not None and not is_agent_outcome(status):
        trajectory.outcome = Outcome(error=f"{status}: the harness ended with this status")
    elif error is None and status is None:
        trajectory.exit_status = "stopped"


def blame_a_failed_model_call(trajectory: Trajectory, calls: list[LLMCall]) -> None:
    """A harness known only by its gateway records that failed right after its last model call failed: the
    model's error (`model_error`), what the harness said kept after it."""
    error = trajectory.outcome.error if trajectory.outcome else None
    if error is None or not calls or calls[-1].error is None or trajectory.exit_status == "timeout":
        return
    trajectory.exit_status = "model_error"
    trajectory.outcome = Outcome(error=f"the model call failed: {calls[-1].error}; {error}")
    trajectory.notes = trajectory.outcome.error


def counts(trajectory: Trajectory) -> bool:
    return trajectory.outcome is None or trajectory.outcome.error is None
