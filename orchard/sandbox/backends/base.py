"""The backend protocol: how the orchestrator starts, checks and removes sandboxes on some substrate.

Backends only do lifecycle (the control plane). Exec and files go straight to the in-sandbox agent at the
`agent_url` the backend reports. A backend must be able to rediscover its sandboxes after a restart
(`list_live`) so the orchestrator can re-adopt live ones and remove orphans."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from orchard.core.sandbox import SandboxSpec


class BackendSandbox(BaseModel):
    """What a backend knows of one sandbox. `handle` is backend-private state (pids, paths, pod name)
    persisted by the orchestrator so that `delete`/`is_alive` work after a restart."""

    id: str
    agent_url: str
    handle: dict = Field(default_factory=dict)


class Backend(Protocol):
    name: str

    async def create(self, sandbox_id: str, spec: SandboxSpec, token: str, *, owner: str = "") -> BackendSandbox:
        """Start the sandbox and return once its agent answers /health. Raises InvalidRequest for a bad
        spec (nothing is left behind) and BackendError when the substrate fails. `owner` is informational
        (the Kubernetes backend records it on the Pod)."""
        ...

    async def delete(self, sandbox: BackendSandbox) -> None:
        """Remove every process, mount and file the sandbox made. Idempotent."""
        ...

    async def is_alive(self, sandbox: BackendSandbox) -> bool: ...

    async def list_live(self) -> list[BackendSandbox]:
        """Sandboxes this backend is running, found from the substrate itself (not from our state)."""
        ...

    async def close(self) -> None:
        """Release the backend's own resources (not the sandboxes)."""
        ...
