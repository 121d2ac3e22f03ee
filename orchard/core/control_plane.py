"""The control-plane contract: sandbox lifecycle as the SDK sees it, wherever the orchestrator runs (in
this process or behind `orchard serve`; orchard/sandbox/control.py has both). Exec and files never pass
through a control plane: they go straight to the sandbox's agent. Protocol only, no I/O."""

from __future__ import annotations

from typing import Protocol

from orchard.core.pool import PoolStatus
from orchard.core.sandbox import SandboxInfo, SandboxSpec


class ControlPlane(Protocol):
    """Sandbox lifecycle, wherever the orchestrator runs."""

    description: str

    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None,
                     pool: str | None = None) -> SandboxInfo:
        """A ready sandbox. The same `idempotency_key` again answers with the same sandbox (see
        docs/orchestrator.md); retries of the call itself reuse one key. `pool`: claim from that warm pool
        (by default from the pool whose template the spec has, if any; see docs/pools.md)."""
        ...

    async def pool_status(self) -> list[PoolStatus]: ...
    async def get(self, sandbox_id: str) -> SandboxInfo: ...
    async def list(self, *, owner: str | None = None,
                   labels: dict[str, str] | None = None) -> list[SandboxInfo]: ...
    async def wait_ready(self, sandbox_id: str, timeout: float = 60) -> SandboxInfo: ...
    async def heartbeat(self, sandbox_id: str) -> SandboxInfo: ...
    async def delete(self, sandbox_id: str) -> None: ...
    async def close(self) -> None: ...
