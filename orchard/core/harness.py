"""The Harness protocol, the model configuration a harness is given, and the registry that finds harnesses
by name.

Every harness, built in or third-party, is registered as a Python entry point in the group
`orchard.harnesses` (`name = "package.module:HarnessClass"`), so `orchard eval --harness NAME` finds both
the same way and nothing is imported by name. The entry point's target is a Harness class or factory,
called with the options given to `get_harness`."""

from __future__ import annotations

import inspect
from importlib.metadata import EntryPoint, PackageNotFoundError, version as distribution_version
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from orchard.core.deadline import Deadline
from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.plugins import BUILTIN_DISTRIBUTION, PluginInfo, Registry, check_name
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory
from orchard.core.version import VERSION

ENTRY_POINT_GROUP = "orchard.harnesses"
ROLLOUT_KEY_HEADER = "X-Orchard-Rollout-Key"


def orchard_version() -> str:
    """The installed orchard's version (what built-in harnesses record), or the source tree's."""
    try:
        return distribution_version(BUILTIN_DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was not installed
        return VERSION


class SamplingParams(BaseModel):
    """OpenAI chat-completions sampling parameters; None leaves the server's default."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    seed: int | None = None
    stop: list[str] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict, description="provider-specific parameters")

    def request_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for an OpenAI-compatible `chat.completions.create` call."""
        kwargs = self.model_dump(exclude_none=True, exclude={"extra_body"})
        if self.extra_body:
            kwargs["extra_body"] = dict(self.extra_body)
        return kwargs


class ModelConfig(BaseModel):
    """Which model a harness drives and how to reach it: normally the Orchard gateway, which records
    every call under `rollout_key` (sent as the `X-Orchard-Rollout-Key` header)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="model name as the gateway/provider knows it")
    base_url: str | None = Field(default=None, description="OpenAI-compatible base URL, e.g. http://gw:4000/v1")
    api_key: SecretStr | None = Field(default=None, description="kept out of reprs and dumps")
    rollout_key: str | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    timeout_s: float = Field(default=600, gt=0, description="per model call")
    deadline: Deadline | None = Field(
        default=None,
        description="when the agent's time is up (orchard/core/deadline.py): the evaluator stops the harness "
                    "then, so a harness can wrap up before it (see `time_left_s`)")

    def headers(self) -> dict[str, str]:
        return {ROLLOUT_KEY_HEADER: self.rollout_key} if self.rollout_key else {}

    def time_left_s(self) -> float | None:
        """Seconds until `deadline` (never below 0), None without one."""
        return None if self.deadline is None else self.deadline.time_left_s()


@runtime_checkable
class Harness(Protocol):
    """Runs an agent on a task inside a sandbox and returns what happened.

    `run` returns the trajectory with `agent.name == name`, `agent.version == version`, `task_id` and the
    model calls made; grading is the evaluator's job, so `outcome` stays None. When the model API or the
    sandbox fails mid-run, `run` still returns the steps so far, with `outcome = Outcome(error=...)`: such
    a rollout is an error, not a failed attempt. `exit_status` (orchard.core.run_status) says how the loop
    ended: `submitted`, a limit such as `step_limit`, or an error status such as `model_error`.

    A harness may also define `async def setup(self, task, sandbox) -> None`: the evaluator calls it before
    `run`, as the trial's own timed phase (`harness_setup`), e.g. to install or start what the harness needs
    in the sandbox. When it raises, the rollout is a `harness_error`, not an attempt.

    A harness that runs *inside* the sandbox names its harness bundle, `bundle = "<name>"`: the evaluator
    mounts it, gives the sandbox the run's gateway at MODEL_GATEWAY_URL, and passes `model` as seen from
    inside (orchard/eval/in_sandbox.py).

    A harness may also define `def dialect(self) -> Dialect`: how it speaks (its tools as neutral actions, its
    prompts and result framing, the replay of its calls), so its rollouts take part in cross-harness
    distillation and credit assignment (orchard/core/dialect.py)."""

    name: str
    version: str

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory: ...


async def setup_harness(harness: Harness, task: Task, sandbox: Sandbox) -> bool:
    """Run the harness's optional `setup` phase; False when it has none."""
    setup = getattr(harness, "setup", None)
    if setup is None:
        return False
    if not inspect.iscoroutinefunction(setup):
        raise PluginError(f"harness {harness.name!r}: `setup` must be `async def setup(self, task, sandbox)`")
    await setup(task, sandbox)
    return True


HARNESSES = Registry("harness", ENTRY_POINT_GROUP, "docs/harness-adapters.md")


def list_harnesses(*, load: bool = False) -> list[PluginInfo]:
    """Every registered harness. With `load`, each is imported to read its own `version` (`detail`: the one
    its trajectories record and the evaluator's resume key holds); without, nothing is imported."""
    infos = []
    for entry in HARNESSES.entries():
        version, problem = None, None
        if load:
            try:
                version = str(entry.load().version)
            except Exception as exc:  # a plugin's import can fail in any way: listed with the reason
                problem = f"{type(exc).__name__}: {exc}"
        infos.append(HARNESSES.info(entry, detail=version, problem=problem))
    return sorted(infos, key=lambda info: (info.name, info.distribution or ""))


def get_harness(name: str, /, **options: Any) -> Harness:
    """The harness registered as `name` (or named by its import path `module:Class`), created with `options`
    (its class's or factory's arguments)."""
    target, entry = HARNESSES.load(name)
    where = HARNESSES.where(entry)
    harness = _instantiate(target, options, where)
    _check(harness, entry, where)
    return harness


def _instantiate(target: Any, options: dict[str, Any], where: str) -> Any:
    if isinstance(target, type) or (callable(target) and not isinstance(target, Harness)):
        try:
            inspect.signature(target).bind(**options)
        except TypeError as exc:
            raise InvalidRequest(f"{where} does not take options {sorted(options)}: {exc}") from None
        except ValueError:  # no introspectable signature: let the call itself decide
            pass
        return target(**options)
    if options:
        raise InvalidRequest(f"{where} is a ready-made instance and takes no options (got {sorted(options)})")
    return target


def _check(harness: Any, entry: EntryPoint, where: str) -> None:
    if not isinstance(harness, Harness) or not inspect.iscoroutinefunction(harness.run):
        raise PluginError(f"{where} is not a Harness: it needs `name`, `version` and `async def run(task, "
                          f"sandbox, model)`; got {type(harness).__name__}")
    check_name(HARNESSES, entry, harness.name)
