"""The sandbox contract: what a sandbox is asked to be (`SandboxSpec`), what running a command returns
(`ExecResult`), and the `Sandbox` protocol every backend's sandbox speaks. Pydantic only, no I/O."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NetworkMode = Literal["none", "allowlist", "open"]


class NetworkPolicy(BaseModel):
    """Egress a sandbox gets. `none` (default): loopback only. `allowlist`: only `allow` (host[:port] or
    CIDR). `open`: the host's network."""

    model_config = ConfigDict(extra="forbid")
    mode: NetworkMode = "none"
    allow: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _allow_only_with_allowlist(self) -> "NetworkPolicy":
        if self.allow and self.mode != "allowlist":
            raise ValueError("network.allow is only used with mode 'allowlist'")
        return self


class SandboxSpec(BaseModel):
    """What to run. `image` is a backend-specific reference: for the local backend `host` (the host's root,
    read-only, plus a writable workdir) or the path of a rootfs directory; for Kubernetes an OCI image."""

    model_config = ConfigDict(extra="forbid")
    image: str = "host"
    cpu: float | None = Field(default=None, gt=0, description="CPU cores (quota), None = unlimited")
    memory_mb: int | None = Field(default=None, gt=0, description="memory limit in MiB")
    disk_mb: int | None = Field(default=None, gt=0, description="size of the writable workdir in MiB")
    max_processes: int | None = Field(default=512, gt=0, description="process/thread count limit")
    timeout_s: float = Field(default=3600, gt=0, description="TTL: deleted this long after creation")
    heartbeat_timeout_s: float | None = Field(
        default=None, gt=0, description="also deleted when no heartbeat came for this long (None = off)")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/workspace"
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, v: str) -> str:
        if not v.startswith("/") or "\x00" in v:
            raise ValueError("workdir must be an absolute path")
        return v


class ExecRequest(BaseModel):
    """One command. A string runs under `/bin/sh -c`; a list is exec'd as argv."""

    model_config = ConfigDict(extra="forbid")
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


class SessionResult(BaseModel):
    """Output of one command in a persistent shell session (stdout and stderr interleaved)."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0


SandboxState = Literal["creating", "ready", "deleting", "deleted", "lost"]


class SandboxInfo(BaseModel):
    """What the orchestrator knows about a sandbox; `agent_url` + `token` let clients talk to it directly."""

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


@runtime_checkable
class ShellSession(Protocol):
    """A named, stateful shell: cwd and environment persist between `run` calls."""

    name: str

    async def run(self, command: str, *, timeout: float | None = None) -> SessionResult: ...
    async def interrupt(self) -> None: ...
    async def close(self) -> None: ...


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

    async def read_file(self, path: str) -> bytes: ...
    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...
    async def stat(self, path: str) -> FileInfo: ...
    async def list_dir(self, path: str) -> list[FileInfo]: ...
    async def upload(self, local_path: str | Path, remote_path: str) -> None: ...
    async def download(self, remote_path: str, local_path: str | Path) -> None: ...
    async def shell(self, name: str = "default", *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> ShellSession: ...
    async def close(self) -> None: ...
