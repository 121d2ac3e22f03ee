"""An evaluation's configuration: everything that decides what a rollout does, and so the key a run is
resumed by. Two runs whose configurations differ in anything — a harness option such as `--max-steps`,
the harness's version, sampling, the suite's content, a timeout, the pass threshold — are different
experiments: resuming one into the other's output directory is refused, naming what differs. Which tasks are
selected, how many attempts each gets and how many run at once are not part of it (a resumed run may add
tasks and attempts).

The configuration is written as OUT/config.json beside the results."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.errors import InvalidRequest, OrchardError, first_problem
from orchard.core.harness import SamplingParams
from orchard.core.task_suite import TaskSuite

M = TypeVar("M", bound=BaseModel)

CONFIG_FILE = "config.json"


class TrialTimeouts(BaseModel):
    """A trial's deadline and its phases' own limits, in seconds. Every phase runs under its own limit and
    under what is left of `trial_s`; the agent is told its deadline (`ModelConfig.deadline`), which leaves
    `patch_s + verify_s` of the trial for taking and grading its patch when the trial is long enough. Waiting
    for a free grading slot is not counted (that is the scheduler's doing, not the trial's)."""

    model_config = ConfigDict(extra="forbid")

    trial_s: float = Field(default=3600, gt=0, allow_inf_nan=False, description="the whole trial")
    environment_s: float = Field(default=600, gt=0, allow_inf_nan=False, description="sandbox + task setup")
    harness_setup_s: float = Field(default=600, gt=0, allow_inf_nan=False, description="the harness's setup")
    agent_s: float = Field(default=1800, gt=0, allow_inf_nan=False, description="the agent's run")
    patch_s: float = Field(default=120, gt=0, allow_inf_nan=False, description="taking the agent's diff")
    verify_s: float = Field(default=900, gt=0, allow_inf_nan=False, description="grading")


class EvalConfig(BaseModel):
    """The resume key of a run."""

    harness: str
    harness_version: str | None = None
    harness_options: dict[str, Any] = Field(default_factory=dict)
    model: str
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    suite: str = Field(description="the suite's name")
    suite_hash: str | None = Field(default=None, description="sha256 of every task of the suite, as loaded")
    timeouts: TrialTimeouts = Field(default_factory=TrialTimeouts)
    pass_threshold: float = Field(default=1.0, gt=0, le=1, description=(
        "a rollout is resolved when its reward is at least this (the suite's, or --pass-threshold)"))
    user_model: str | None = Field(default=None, description="the model playing the tasks' simulated users "
                                   "(--user-model); none: their scripts")

    def differences(self, other: EvalConfig) -> list[str]:
        """`field: this -> other` for every field that differs."""
        mine, theirs = self.model_dump(mode="json"), other.model_dump(mode="json")
        return [f"{name}: {json.dumps(mine[name])} -> {json.dumps(theirs[name])}"
                for name in EvalConfig.model_fields if mine[name] != theirs[name]]

    def key(self) -> dict[str, Any]:
        return EvalConfig.model_validate(self.model_dump()).model_dump(mode="json")


def suite_hash(suite: TaskSuite) -> str:
    """A digest of every task of the suite (instruction, environment with its files, grader): a task
    edited between two sessions of a run changes it."""
    digest = hashlib.sha256()
    for task in sorted(suite.tasks, key=lambda task: task.id):
        digest.update(task.model_dump_json().encode())
        digest.update(b"\n")
    return digest.hexdigest()


def read_config(out_dir: Path) -> EvalConfig | None:
    return read_model_file(Path(out_dir) / CONFIG_FILE, EvalConfig, "an Orchard run configuration")


def read_model_file(path: Path, model: type[M], what: str) -> M | None:
    """The JSON file `path` (one of a run's output files) as a `model`; None when it does not exist, an
    InvalidRequest naming `what` when it is something else."""
    try:
        return model.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError as exc:
        raise InvalidRequest(f"{path} is not {what} ({first_problem(exc, 'file')}); choose another output "
                             "directory") from None


def write_config(out_dir: Path, config: EvalConfig) -> None:
    atomic_write_bytes(Path(out_dir) / CONFIG_FILE, (json.dumps(config.key(), indent=2) + "\n").encode())


def harness_defaults(name: str) -> dict[str, Any]:
    """The options harness `name` runs with when given none (its `config`, as JSON), {} when it cannot say:
    `--max-steps 50` where 50 is the default is the same configuration as no `--max-steps`."""
    from orchard.core.harness import get_harness

    try:
        config = getattr(get_harness(name), "config", None)
    except OrchardError:  # it needs options, or is not installed: compare the options as given
        return {}
    return config.model_dump(mode="json") if isinstance(config, BaseModel) else {}


def check_same_config(previous: EvalConfig, config: EvalConfig, out_dir: Path, *,
                      harness_defaults: dict[str, Any] | None = None) -> None:
    """Refuse to resume a run of another configuration into `out_dir`. Harness options are compared resolved
    (over `harness_defaults`, the harness's options when given none), so a default given explicitly is no
    difference."""
    if harness_defaults and previous.harness == config.harness:
        previous, config = (c.model_copy(update={"harness_options": {**harness_defaults, **c.harness_options}})
                            for c in (previous, config))
    differences = previous.differences(config)
    if differences:
        raise InvalidRequest(
            f"{out_dir} holds a run with another configuration, so its results cannot be merged with this one's "
            f"({'; '.join(differences)}). Resume it with the same settings, or choose another --out")
