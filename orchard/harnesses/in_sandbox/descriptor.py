"""What an in-sandbox adapter declares for one run, as data: the run it is given (`AgentRun`), how its agent
is started (`Launch`: files, command line, environment, stdin) and how the run ended (`Ending`)."""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.harness import ModelConfig
from orchard.core.harness_bundle import HarnessBundleSpec
from orchard.core.run_status import ExitStatus
from orchard.core.sandbox import ExecResult
from orchard.core.task import Task


class AgentRun(BaseModel):
    """One run of the agent: the task, the model as seen from inside the sandbox, the bundle it runs from
    and how long it may take."""

    model_config = ConfigDict(frozen=True)

    task: Task
    model: ModelConfig
    spec: HarnessBundleSpec
    time_limit_s: float | None = Field(description="the agent is killed with its process group after this; "
                                                   "None: no limit of its own")
    run_id: uuid.UUID = Field(default_factory=uuid.uuid4, description="names what this run writes, when the "
                                                                      "agent needs a fresh name per run")

    @property
    def workdir(self) -> str:
        return self.task.environment.workdir


class SandboxFile(BaseModel):
    """A file placed in the sandbox before the agent starts (its config, its prompt)."""

    path: str
    data: bytes
    mode: int | None = Field(default=None, description="e.g. 0o600 for a file holding the gateway's key")


class Launch(BaseModel):
    """How the agent is started: `files` are written, then `argv` runs in the task's workdir with `env`
    (on top of the sandbox's) and `stdin`, under the run's time limit."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    stdin: str | None = None
    files: list[SandboxFile] = Field(default_factory=list)


class Finished(BaseModel):
    """How the agent's command ended, and why its logs could not be read when the adapter's own stop fired
    (`unread`; the rollout is then the agent's timeout whatever the reading met)."""

    result: ExecResult
    unread: str | None = None


class Ending(BaseModel):
    """The trajectory's end: `exit_status`, and for an error the `Outcome(error=...)` that makes the rollout
    an error rather than an attempt; `notes` and `partial` (steps as far as the logs go) as the adapter says."""

    exit_status: ExitStatus
    error: str | None = None
    notes: str | None = None
    partial: bool = False
