"""The Harness protocol, the model configuration a harness is given, and the registry that finds harnesses
by name.

Every harness, built in or third-party, is registered as a Python entry point in the group
`orchard.harnesses` (`name = "package.module:HarnessClass"`), so `orchard eval --harness NAME` finds both
the same way and nothing is imported by name. The entry point's target is a Harness class or factory,
called with the options given to `get_harness`."""

from __future__ import annotations

import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory

ENTRY_POINT_GROUP = "orchard.harnesses"
BUILTIN_DISTRIBUTION = "orchard"
ROLLOUT_KEY_HEADER = "X-Orchard-Rollout-Key"


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

    def headers(self) -> dict[str, str]:
        return {ROLLOUT_KEY_HEADER: self.rollout_key} if self.rollout_key else {}


@runtime_checkable
class Harness(Protocol):
    """Runs an agent on a task inside a sandbox and returns what happened.

    `run` returns the trajectory with `agent.name == name`, `agent.version == version`, `task_id` and the
    model calls made; grading is the evaluator's job, so `outcome` stays None. When the model API or the
    sandbox fails mid-run, `run` still returns the steps so far, with `outcome = Outcome(error=...)`: such
    a rollout is an error, not a failed attempt."""

    name: str
    version: str

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory: ...


class HarnessInfo(BaseModel):
    name: str
    source: Literal["builtin", "plugin"]
    distribution: str | None = Field(description="the installed package that registers it")
    version: str | None = Field(description="that package's version")
    target: str = Field(description="the entry point's `module:attr`")


def list_harnesses() -> list[HarnessInfo]:
    """Every registered harness; nothing is imported."""
    infos = [_info(entry) for entry in entry_points(group=ENTRY_POINT_GROUP)]
    return sorted(infos, key=lambda info: (info.name, info.distribution or ""))


def get_harness(name: str, /, **options: Any) -> Harness:
    """The harness registered as `name`, created with `options` (its class's or factory's arguments)."""
    matches = [entry for entry in entry_points(group=ENTRY_POINT_GROUP) if entry.name == name]
    if not matches:
        available = sorted({entry.name for entry in entry_points(group=ENTRY_POINT_GROUP)})
        raise InvalidRequest(
            f"unknown harness {name!r}; available: {', '.join(available) or 'none'} (a plugin adds one by "
            f"registering an entry point in the {ENTRY_POINT_GROUP!r} group)")
    if len(matches) > 1:
        owners = ", ".join(sorted(f"{_distribution(entry)} ({entry.value})" for entry in matches))
        raise PluginError(f"harness {name!r} is registered by more than one package: {owners}; "
                          "uninstall all but one")
    entry = matches[0]
    where = f"harness {name!r} ({entry.value}, from {_distribution(entry)})"
    try:
        target = entry.load()
    except Exception as exc:  # a plugin's import can fail in any way; report which plugin and why
        raise PluginError(f"{where} failed to import: {type(exc).__name__}: {exc}") from exc
    harness = _instantiate(target, options, where)
    _check(harness, name, where)
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


def _check(harness: Any, name: str, where: str) -> None:
    if not isinstance(harness, Harness) or not inspect.iscoroutinefunction(harness.run):
        raise PluginError(f"{where} is not a Harness: it needs `name`, `version` and `async def run(task, "
                          f"sandbox, model)`; got {type(harness).__name__}")
    if harness.name != name:
        raise PluginError(f"{where} calls itself {harness.name!r}; its entry point name and its `name` must "
                          "match, since trajectories record the name")


def _distribution(entry: EntryPoint) -> str | None:
    return entry.dist.name if entry.dist is not None else None


def _info(entry: EntryPoint) -> HarnessInfo:
    distribution = _distribution(entry)
    return HarnessInfo(
        name=entry.name,
        source="builtin" if distribution == BUILTIN_DISTRIBUTION else "plugin",
        distribution=distribution,
        version=entry.dist.version if entry.dist is not None else None,
        target=entry.value)
