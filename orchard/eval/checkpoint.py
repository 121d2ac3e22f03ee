"""A trial's checkpoint in the run's directory, OUT/trials/<rollout key>.json, replaced atomically as the trial
goes: the phases so far (the one running marked as interrupted until it ends) and, once the agent's phase has
ended with a patch to grade, the agent's trajectory, that patch and the rollout's model calls.

What a resume does with it (orchard.eval.runner): a trial whose agent had finished goes straight to grading
in a fresh sandbox — the agent does not run again, so no model call is repeated and the sample graded is the
one the agent produced; any other trial stopped midway is recorded as `interrupted` with the phases it ran.
The file is removed once the trial's trajectory is recorded."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote, unquote

from pydantic import BaseModel, Field, ValidationError

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.run_status import PhaseRecord
from orchard.core.sandbox import StartupTimings
from orchard.core.trajectory import LLMCall, Trajectory

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "trials"
INTERRUPTED_PHASE = "interrupted: orchard eval stopped while this phase ran"


class TrialCheckpoint(BaseModel):
    rollout_key: str
    phases: list[PhaseRecord] = Field(default_factory=list)
    trajectory: Trajectory | None = Field(default=None, description="the agent's, once it ended with a patch")
    patch: str | None = Field(default=None, description="the patch to grade")
    llm_calls: list[LLMCall] = Field(default_factory=list, description="the rollout's calls, with the trajectory")
    elapsed_s: float = Field(default=0.0, description="the trial's time when the agent's result was kept")
    sandbox_cpu_s: float | None = None
    sandbox_startup: StartupTimings | None = None

    @property
    def to_grade(self) -> bool:
        """The agent's phase ended with a patch: a resume grades it instead of running the agent again."""
        return self.trajectory is not None and self.patch is not None


def checkpoint_path(out_dir: Path, rollout_key: str) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR / f"{quote(rollout_key, safe='')}.json"


def write_checkpoint(out_dir: Path, checkpoint: TrialCheckpoint) -> None:
    path = checkpoint_path(out_dir, checkpoint.rollout_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, checkpoint.model_dump_json().encode())


def read_checkpoint(out_dir: Path, rollout_key: str) -> TrialCheckpoint | None:
    return _read(checkpoint_path(out_dir, rollout_key))


def read_checkpoints(out_dir: Path) -> dict[str, TrialCheckpoint]:
    """Every readable checkpoint by rollout key."""
    directory = Path(out_dir) / CHECKPOINT_DIR
    found = (_read(path) for path in sorted(directory.glob("*.json")) if directory.is_dir())
    return {checkpoint.rollout_key: checkpoint for checkpoint in found if checkpoint is not None}


def _read(path: Path) -> TrialCheckpoint | None:
    """The checkpoint in `path`; None when there is none, or it cannot be read (logged: its trial runs again)."""
    try:
        checkpoint = TrialCheckpoint.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        log.warning("ignoring the unreadable trial checkpoint %s: %s", path, exc)
        return None
    return checkpoint if checkpoint.rollout_key == unquote(path.stem) else None


def remove_checkpoint(out_dir: Path, rollout_key: str) -> None:
    path = checkpoint_path(out_dir, rollout_key)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # the last one: nothing is left behind
    except OSError:
        pass
