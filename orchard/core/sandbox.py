"""The sandbox contract: what a sandbox is asked to be (`SandboxSpec`), what running a command returns
(`ExecResult`), and the `Sandbox` protocol every backend's sandbox speaks. Pydantic only, no I/O."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    import asyncio

NetworkMode = Literal["none", "allowlist", "open"]

# Inside a sandbox with `network.gateway`, the orchestrator's model gateway answers here (plain HTTP on the
# sandbox's own loopback, relayed by its agent), so a harness is configured with an ordinary OpenAI base URL.
MODEL_GATEWAY_HOST = "127.0.0.1"
MODEL_GATEWAY_PORT = 4000
MODEL_GATEWAY_URL = f"http://{MODEL_GATEWAY_HOST}:{MODEL_GATEWAY_PORT}"
# Harness bundles named in `SandboxSpec.bundles` are mounted read-only at HARNESS_MOUNT_ROOT/<name>.
HARNESS_MOUNT_ROOT = "/.orchard/harness"
MAX_BUNDLES = 16
BUNDLE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"

# Limits on a spec's strings: past them a sandbox cannot be made anyway (the kernel refuses a path
# component over 255 bytes, one environment string of 128 KiB or more), so they are refused up front.
MAX_IMAGE_CHARS = 1024
MAX_WORKDIR_CHARS = 1024
MAX_PATH_COMPONENT_BYTES = 255
MAX_ENV_VARS = 1024
MAX_ENV_ENTRY_BYTES = 128 * 1024 - 1  # "NAME=VALUE" plus its NUL must fit the kernel's MAX_ARG_STRLEN
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 1024
# The shortest TTL or heartbeat timeout: anything less is deleted before it could be used (and 1e-320 is
# zero to every clock), so it is a mistake, refused rather than taken as "delete at once".
MIN_TIMEOUT_S = 1.0

# Environment variables the sandbox's agent (or the bundled interpreter and dynamic loader that start it)
# reads: a spec setting them would replace the agent's token file or the code it runs. Orchard sets the
# ones it needs itself; a spec may not.
RESERVED_ENV_PREFIXES = ("ORCHARD_AGENT_",)
RESERVED_ENV_NAMES = frozenset({"PYTHONHOME", "PYTHONPATH", "LD_PRELOAD", "LD_AUDIT"})


def normal_workdir(path: str) -> str:
    """`path` with repeated slashes and `.` components dropped: `//.orchard/` is `/.orchard`. pathlib keeps
    a leading `//` as a root of its own, so without this `//dev/shm` passed every check made for
    `/dev/shm`. `..` is kept, for the backend to refuse."""
    return "/" + "/".join(part for part in path.split("/") if part not in ("", "."))


def reserved_env_reason(name: str) -> str | None:
    """Why `name` may not be set by a sandbox spec, or None when it may."""
    if name.startswith(RESERVED_ENV_PREFIXES):
        return "ORCHARD_AGENT_* variables configure the sandbox's agent (its token file, its limits)"
    if name in ("PYTHONHOME", "PYTHONPATH"):
        return "the agent's bundled Python needs its own; set it per command (exec's env) instead"
    if name in RESERVED_ENV_NAMES:
        return "the dynamic loader would load it into the agent itself; set it per command (exec's env) instead"
    return None


class NetworkPolicy(BaseModel):
    """Egress a sandbox gets. `none` (default): loopback only. `allowlist`: only `allow` (IP[:port] or
    CIDR). `open`: the host's network. `gateway`: besides that, the orchestrator's model gateway answers at
    MODEL_GATEWAY_URL inside (and nothing else is added). `mode: "model"` is shorthand for model-only
    networking, `{"mode": "none", "gateway": true}`."""

    model_config = ConfigDict(extra="forbid")
    mode: NetworkMode = "none"
    allow: list[str] = Field(default_factory=list, max_length=256)
    gateway: bool = Field(default=False, description=f"the model gateway at {MODEL_GATEWAY_URL} inside")

    @model_validator(mode="before")
    @classmethod
    def _model_mode(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("mode") == "model":
            if data.get("gateway") is False:
                raise ValueError("network mode 'model' means the model gateway and no other egress; it cannot "
                                 "have gateway: false")
            return {**data, "mode": "none", "gateway": True}
        return data

    @model_validator(mode="after")
    def _allow_only_with_allowlist(self) -> "NetworkPolicy":
        if self.allow and self.mode != "allowlist":
            raise ValueError("network.allow is only used with mode 'allowlist'")
        return self


class SandboxSpec(BaseModel):
    """What to run. `image` is a backend-specific reference: for the local backend `host` (the host's root,
    read-only, plus a writable workdir) or the path of a rootfs directory; for Kubernetes an OCI image."""

    # Non-finite numbers are refused: JSON has no infinity, so one would be stored as null and every later
    # read of the sandbox (listing, the reaper, a restart) would fail.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    image: str = Field(default="host", min_length=1, max_length=MAX_IMAGE_CHARS)
    cpu: float | None = Field(default=None, gt=0, description="CPU cores (quota), None = unlimited")
    memory_mb: int | None = Field(default=None, gt=0, description="memory limit in MiB")
    disk_mb: int | None = Field(default=None, gt=0, description="size of the writable workdir in MiB")
    max_processes: int | None = Field(default=512, gt=0, description="process/thread count limit")
    timeout_s: float = Field(default=3600, gt=0, description=f"TTL: deleted this long after creation (at least "
                                                             f"{MIN_TIMEOUT_S:g} s)")
    heartbeat_timeout_s: float | None = Field(
        default=None, gt=0, description=f"also deleted when no heartbeat came for this long (None = off; at "
                                        f"least {MIN_TIMEOUT_S:g} s)")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_VARS)
    workdir: str = Field(default="/workspace", max_length=MAX_WORKDIR_CHARS)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    bundles: list[str] = Field(default_factory=list, max_length=MAX_BUNDLES,
                               description=f"harness bundles mounted read-only at {HARNESS_MOUNT_ROOT}/<name>")
    services: bool = Field(default=False, description="the sandbox runs task services under a user of their own, "
                           "out of its commands' reach (docs/services.md); refused where the backend cannot")

    @field_validator("bundles")
    @classmethod
    def _bundle_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.match(BUNDLE_NAME_PATTERN, name):
                raise ValueError(f"bundle name {name[:80]!r} is not valid: lowercase letters, digits, '.', '_' "
                                 "and '-', starting with a letter or digit, at most 63 characters")
        if len(set(v)) != len(v):
            raise ValueError("bundles lists a bundle more than once")
        return v

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, v: str) -> str:
        if not v.startswith("/") or "\x00" in v:
            raise ValueError("workdir must be an absolute path")
        long = [part for part in v.split("/") if len(part.encode()) > MAX_PATH_COMPONENT_BYTES]
        if long:
            raise ValueError(f"workdir has a path component of {len(long[0].encode())} bytes; the limit is "
                             f"{MAX_PATH_COMPONENT_BYTES}")
        return normal_workdir(v)

    @field_validator("timeout_s", "heartbeat_timeout_s")
    @classmethod
    def _long_enough(cls, v: float | None) -> float | None:
        if v is not None and v < MIN_TIMEOUT_S:
            raise ValueError(f"{v:g} s is under the minimum of {MIN_TIMEOUT_S:g} s: the sandbox would be deleted "
                             f"before it could be used; ask for at least {MIN_TIMEOUT_S:g}")
        return v

    @field_validator("env")
    @classmethod
    def _usable_env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not name or "=" in name or "\x00" in name or "\x00" in value:
                raise ValueError(f"{name!r} is not a valid variable: names must be non-empty without '=' or "
                                 "NUL, values without NUL")
            reason = reserved_env_reason(name)
            if reason:
                raise ValueError(f"{name} is reserved and cannot be set: {reason}")
            size = len(name.encode()) + 1 + len(value.encode())
            if size > MAX_ENV_ENTRY_BYTES:
                raise ValueError(f"{name} is {size} bytes as NAME=VALUE; one variable must stay under 128 KiB")
        return v

    @field_validator("labels")
    @classmethod
    def _short_labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if len(key) > MAX_LABEL_KEY_CHARS or len(value) > MAX_LABEL_VALUE_CHARS:
                raise ValueError(f"label {key[:40]!r}... is too long: keys up to {MAX_LABEL_KEY_CHARS} "
                                 f"characters, values up to {MAX_LABEL_VALUE_CHARS}")
        return v


class ExecRequest(BaseModel):
    """One command. A string runs under `/bin/sh -c`; a list is exec'd as argv."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    command: str | list[str]
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    stdin: str | None = None
    timeout: float | None = Field(default=None, gt=0, description="seconds; the process group is killed")
    max_output_bytes: int = Field(default=1_000_000, gt=0, description="cap per stream")

    @field_validator("command")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
            raise ValueError("command must not be empty")
        return v


class ExecResult(BaseModel):
    exit_code: int | None = Field(description="None when the command was killed by a timeout")
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class ExecEvent(BaseModel):
    """One frame of a streamed exec: output (`stdout`/`stderr` with `data`) or the final `exit`."""

    kind: Literal["stdout", "stderr", "exit"]
    data: str = ""
    result: ExecResult | None = None


class FileInfo(BaseModel):
    path: str
    name: str
    exists: bool = True
    is_dir: bool = False
    is_symlink: bool = False
    size: int = 0
    mode: int = 0
    mtime: float = 0.0


class ServiceStart(BaseModel):
    """A task service to start in a sandbox made with `services=True` (the agent's `POST /services`)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    command: str = Field(min_length=1, description="a shell command line, run in the service's state directory")
    env: dict[str, str] = Field(default_factory=dict)
    seed_dir: str | None = Field(default=None, description="copied into the state directory before it starts")
    port: int | None = Field(default=None, ge=1, le=65535, description="ready once this port listens inside")
    health_check: str | None = Field(default=None, pattern=r"^/\S*$",
                                     description="then once a GET of this path on the port answers 2xx")


class ServiceStatus(BaseModel):
    """A service as the agent reports it (`GET /services`)."""

    name: str
    pid: int
    running: bool
    exit_code: int | None = None
    state_dir: str
    log: str = Field(default="", description="its stdout and stderr, the last 256 KiB")
    log_dropped_bytes: int = 0
    port: int | None = None
    health_check: str | None = None
    ready: bool = Field(default=False, description="its port listened and its health check passed, as last waited for")
    not_ready: str | None = Field(default=None, description="why it was not ready yet when last checked")


class SessionResult(BaseModel):
    """Output of one command in a persistent shell session (stdout and stderr interleaved)."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0


SandboxState = Literal["creating", "ready", "deleting", "deleted", "lost"]

STARTUP_STAGES = ("admission_wait_ms", "pool_claim_ms", "backend_create_ms", "agent_start_ms", "first_health_ms")


class StartupTimings(BaseModel):
    """Where a sandbox's start went, in milliseconds, stage by stage. A stage the sandbox did not go through,
    or that its backend cannot tell apart, is None; the stages never overlap, so their sum is at most
    `total_ms` (the rest is the orchestrator's own work: records, tokens, the spec's checks)."""

    model_config = ConfigDict(allow_inf_nan=False)
    admission_wait_ms: float | None = Field(
        default=None, ge=0, description="waiting for a free place under the orchestrator's caps or create rate")
    pool_claim_ms: float | None = Field(
        default=None, ge=0, description="claiming a pre-started sandbox from a warm pool (None: not pooled)")
    backend_create_ms: float | None = Field(
        default=None, ge=0, description="the backend making the sandbox: local, namespaces and bubblewrap "
                                        "spawned; kubernetes, the Pod created until it runs with an IP; docker, "
                                        "the container created and started")
    agent_start_ms: float | None = Field(
        default=None, ge=0, description="from the sandbox existing until its agent listens (None where the "
                                        "backend only sees the first health answer)")
    first_health_ms: float | None = Field(
        default=None, ge=0, description="until the agent's first /health answered ok")
    total_ms: float = Field(ge=0, description="the whole create as the orchestrator saw it, request to ready")

    def stages_ms(self) -> float:
        """The stages' sum (those known)."""
        return sum(getattr(self, name) or 0.0 for name in STARTUP_STAGES)


class SandboxPoolInfo(BaseModel):
    """How a sandbox relates to a warm pool (`SandboxInfo.pool`). `idle`: a pre-started member waiting to be
    claimed (never listed to users); `claimed`: handed out from the pool, with a fresh token and the
    caller's env and labels; neither: made by a normal create because the pool could not serve it,
    `fallback_reason` says why."""

    name: str = Field(description="the pool")
    template: str = Field(description="the template key of the spec (orchard/core/pool.py: template_key)")
    idle: bool = False
    claimed: bool = False
    fallback_reason: str | None = None


class SandboxInfo(BaseModel):
    """What the orchestrator knows about a sandbox; `agent_url` + `token` let clients talk to it directly."""

    model_config = ConfigDict(allow_inf_nan=False)
    id: str
    state: SandboxState
    spec: SandboxSpec
    backend: str
    agent_url: str | None = None
    token: str | None = None
    owner: str = ""
    created_at: float
    expires_at: float
    last_heartbeat: float
    error: str | None = None
    startup: StartupTimings | None = Field(
        default=None, description="where its start went, stage by stage (None until it is ready)")
    pool: SandboxPoolInfo | None = Field(
        default=None, description="its warm pool: an idle member, claimed from one, or made cold because the "
                                  "pool could not serve it (None: no pool was involved; see docs/pools.md)")


class SandboxList(BaseModel):
    """`GET /v1/sandboxes`: the sandboxes that match, as the orchestrator answers and its clients read it."""

    sandboxes: list[SandboxInfo]


@runtime_checkable
class ShellSession(Protocol):
    """A named, stateful shell: cwd and environment persist between `run` calls."""

    name: str

    async def run(self, command: str, *, timeout: float | None = None) -> SessionResult: ...
    async def interrupt(self) -> None: ...
    async def close(self) -> None: ...


@runtime_checkable
class PortForwarding(Protocol):
    """A local address (`host`, `port`) whose connections reach `remote_port` inside a sandbox."""

    host: str
    port: int
    remote_port: int

    @property
    def address(self) -> str: ...
    def url(self, scheme: str = "http", path: str = "") -> str: ...
    def close(self) -> None: ...


# What a client takes from a sandbox at most, unless asked for more: a sandbox is untrusted and must not be
# able to exhaust its client's memory (read_file) or disk (download). Over the cap is PayloadTooLarge.
READ_FILE_MAX_BYTES = 64 << 20
DOWNLOAD_MAX_BYTES = 1 << 30


@runtime_checkable
class Sandbox(Protocol):
    """What every backend's sandbox offers. Paths are inside the sandbox; relative ones are under workdir."""

    id: str

    async def exec(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult: ...

    def exec_stream(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[ExecEvent]: ...

    async def read_file(self, path: str, *, max_bytes: int = READ_FILE_MAX_BYTES) -> bytes: ...
    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...
    async def stat(self, path: str) -> FileInfo: ...
    async def list_dir(self, path: str) -> list[FileInfo]: ...
    async def upload(self, local_path: str | Path, remote_path: str) -> None: ...
    async def download(self, remote_path: str, local_path: str | Path, *,
                       max_bytes: int = DOWNLOAD_MAX_BYTES) -> None: ...
    async def shell(self, name: str = "default", *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> ShellSession: ...
    async def cpu_seconds(self) -> float | None:
        """CPU time every process of the sandbox has used so far (approximate: 10 ms ticks; None when
        unknown)."""
        ...
    async def start_service(self, service: ServiceStart) -> ServiceStatus:
        """Start a task service under the services' own user (a sandbox made with `services=True`)."""
        ...
    async def services(self) -> list[ServiceStatus]:
        """The services started in the sandbox, whether each still runs, and its log."""
        ...
    async def wait_services(self, names: list[str] | None = None, *, timeout: float = 30.0) -> list[ServiceStatus]:
        """Wait until the services named (all for None) are ready, one of them ends, or `timeout` passes;
        their statuses then (`ready`, `not_ready`, `running`)."""
        ...
    async def exec_as_service(self, command: str | list[str], *, env: dict[str, str] | None = None,
                              timeout: float | None = None) -> ExecResult:
        """Run a command as the services' user (a grader reading their state)."""
        ...
    async def attach(self, command: str | list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                     timeout: float | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start `command` with its stdin and stdout as a stream pair (a long-lived program to talk to)."""
        ...
    async def listening_ports(self) -> list[int]:
        """The TCP ports a server listens on inside the sandbox that `open_port` can reach."""
        ...
    async def wait_for_port(self, port: int, *, timeout: float = 30.0) -> None:
        """Wait until a server listens on `port` inside (without connecting); PortClosed after `timeout`."""
        ...
    async def open_port(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to `port` inside the sandbox (through its agent): PortClosed when nothing
        listens there."""
        ...
    def forward_port(self, port: int, *, host: str = "127.0.0.1", local_port: int = 0) -> PortForwarding:
        """A local address whose connections reach `port` inside the sandbox; closed with the client."""
        ...
    async def close(self) -> None: ...


class SandboxFactory(Protocol):
    """What makes ready sandboxes from a spec: the SDK client (`AsyncOrchard`, on any backend), or any other
    source. The evaluator and its graders need nothing more; closing a sandbox it made deletes it."""

    async def create(self, spec: SandboxSpec) -> Sandbox: ...
