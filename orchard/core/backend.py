"""The backend contract: how an orchestrator starts, checks and removes sandboxes on some substrate
(this machine's namespaces, Kubernetes Pods, Docker containers). Pydantic and protocols only, no I/O.

Backends only do lifecycle (the control plane). Exec and files go straight to the in-sandbox agent at the
`agent_url` the backend reports. A backend must be able to rediscover its sandboxes after a restart
(`list_live`) so that the orchestrator can re-adopt live ones and remove orphans.

A backend is a plug-in: a class registered under its name in the entry-point group `orchard.backends`
(built-ins too, see pyproject.toml), with a typed `Config` (a `BackendConfig` whose `backend` field is its
name, so configs form a discriminated union) and the `capabilities` it can enforce. The orchestrator
refuses a spec that asks for more than those, naming the backend and what it lacks: a limit or network
mode is never silently weakened. See docs/writing-a-backend.md."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Mapping, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import NetworkMode, SandboxSpec, StartupTimings

ENTRY_POINT_GROUP = "orchard.backends"

ImageKind = Literal["host", "rootfs", "oci"]
LimitName = Literal["cpu", "memory_mb", "disk_mb", "max_processes"]
LIMIT_NAMES: tuple[LimitName, ...] = ("cpu", "memory_mb", "disk_mb", "max_processes")
IMAGE_KIND_MEANING = {"host": "'host' (this machine's root, read-only)", "rootfs": "a root file system directory",
                      "oci": "an OCI image reference"}


def image_kind(image: str) -> ImageKind:
    """What kind of image a spec's `image` names: `host`, a directory path (`rootfs`), else an OCI image."""
    if image == "host":
        return "host"
    return "rootfs" if image.startswith("/") else "oci"


class BackendCapabilities(BaseModel):
    """What a backend can enforce. `limits`: the spec limits it enforces when they are set (an unset limit
    needs no capability). `image_kinds`: the kinds of `image` it runs (see `image_kind`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    network_modes: frozenset[NetworkMode]
    limits: frozenset[LimitName]
    image_kinds: frozenset[ImageKind]
    # `network.gateway`: the backend relays MODEL_GATEWAY_URL inside to its config's `model_gateway`
    # (False when none is configured).
    model_gateway: bool = False
    # `spec.bundles`: it mounts built harness bundles read-only at HARNESS_MOUNT_ROOT/<name>.
    harness_bundles: bool = False
    # `spec.services`: it runs task services under a user of their own that the commands cannot signal or
    # read (the agent's POST /services).
    services: bool = False

    def lacks(self, spec: SandboxSpec) -> list[str]:
        """What `spec` asks for that these capabilities do not have, one phrase each (empty: all there)."""
        missing = []
        if spec.network.mode not in self.network_modes:
            missing.append(f"network mode {spec.network.mode!r} (it has: {_listed(self.network_modes)})")
        for limit in LIMIT_NAMES:
            if getattr(spec, limit) is not None and limit not in self.limits:
                missing.append(f"the {limit} limit (it enforces: {_listed(self.limits) or 'no limits'}; "
                               f"set {limit} to null to run without it)")
        if spec.network.gateway and not self.model_gateway:
            missing.append("the model gateway (network.gateway, or mode 'model'): none is configured for it; set "
                           "`model_gateway` in its config (`orchard serve --model-gateway ...`)")
        if spec.bundles and not self.harness_bundles:
            missing.append(f"harness bundles (it cannot mount {', '.join(spec.bundles)})")
        if spec.services and not self.services:
            missing.append("task services kept apart from the commands (spec.services; the local backend as root "
                           "has them)")
        kind = image_kind(spec.image)
        if kind not in self.image_kinds:
            runs = ", ".join(IMAGE_KIND_MEANING[k] for k in sorted(self.image_kinds))
            missing.append(f"images of kind {kind!r} like {spec.image!r} (it runs: {runs})")
        return missing

    def check(self, spec: SandboxSpec, backend_name: str) -> None:
        """Raise InvalidRequest naming the backend and everything `spec` needs that it lacks."""
        missing = self.lacks(spec)
        if missing:
            raise InvalidRequest(f"the {backend_name} backend cannot honour this sandbox spec: it lacks "
                                 + "; ".join(missing) + ". Change the spec or use a backend that has it "
                                 "(`orchard backends` lists each backend's capabilities)")


def _listed(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


_Config = TypeVar("_Config", bound="BackendConfig")


class BackendConfig(BaseModel):
    """A backend's typed configuration. Subclasses narrow `backend` to their name (`Literal["docker"]`),
    which makes the registered configs one discriminated union (a JSON config file names its backend)."""

    model_config = ConfigDict(extra="forbid")
    backend: str
    model_gateway: str | None = Field(
        default=None, description="the model gateway that sandboxes with network.gateway reach: "
                                  "unix:/PATH of its socket for backends on this machine, http://HOST:PORT "
                                  "where sandboxes run elsewhere (see docs/networking.md)")
    # True when the sandboxes run on the orchestrator's own machine: its cores, memory and disk are then
    # the default maxima of a spec (orchard/sandbox/server/spec_limits.py).
    runs_here: ClassVar[bool] = False

    @classmethod
    def from_env(cls: type[_Config], home: Path, environ: Mapping[str, str]) -> _Config:
        """The defaults for an orchestrator whose state lives under `home`, from the environment where the
        backend reads it (e.g. ORCHARD_K8S_*). The base takes nothing from either."""
        return cls()


class BackendSandbox(BaseModel):
    """What a backend knows of one sandbox. `handle` is backend-private state (pids, paths, pod name)
    persisted by the orchestrator so that `delete`/`is_alive` work after a restart."""

    id: str
    agent_url: str
    handle: dict = Field(default_factory=dict)
    timings: StartupTimings | None = Field(
        default=None, description="what `create` measured of its own stages (backend_create_ms, agent_start_ms, "
                                  "first_health_ms; total_ms its whole create); the orchestrator adds the rest")


@runtime_checkable
class Backend(Protocol):
    """One substrate's sandboxes. Registered classes also have `Config: ClassVar[type[BackendConfig]]`
    and `from_config(config) -> Backend` (see `BackendPlugin`)."""

    name: str
    capabilities: BackendCapabilities

    async def create(self, sandbox_id: str, spec: SandboxSpec, token: str, *, owner: str = "") -> BackendSandbox:
        """Start the sandbox and return once its agent answers /health. Raises InvalidRequest for a bad
        spec (nothing is left behind) and BackendError when the substrate fails. `owner` is informational
        (recorded where the substrate keeps labels)."""
        ...

    async def delete(self, sandbox: BackendSandbox) -> None:
        """Remove every process, mount, container and file the sandbox made. Idempotent."""
        ...

    async def is_alive(self, sandbox: BackendSandbox) -> bool: ...

    async def list_live(self) -> list[BackendSandbox]:
        """Sandboxes this backend is running, found from the substrate itself (not from our state)."""
        ...

    async def close(self) -> None:
        """Release the backend's own resources (not the sandboxes)."""
        ...


class BackendPlugin(Protocol):
    """What the entry point `orchard.backends: NAME = module:Class` must load."""

    name: ClassVar[str]
    Config: ClassVar[type[BackendConfig]]

    @classmethod
    def from_config(cls, config: BackendConfig) -> Backend: ...
