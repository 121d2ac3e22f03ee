"""What the orchestrator's helpers (warm pools, upkeep, quarantine) use of `SandboxService`, as a protocol:
they depend on this page and the service depends on them, never both ways round."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from orchard.core.backend import Backend
from orchard.core.sandbox import SandboxInfo, SandboxPoolInfo, SandboxSpec
from orchard.sandbox.server.admission import Admission
from orchard.sandbox.server.models import ServiceRecord
from orchard.sandbox.server.spec_limits import SpecLimits
from orchard.sandbox.server.store import SandboxStore


class CreateInFlight:
    """A create() in progress: `ended` is set when it returns or fails. Tied to its event loop (the one
    place it can be awaited from)."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.loop = asyncio.get_running_loop()


class ServiceFace(Protocol):
    backend: Backend
    store: SandboxStore
    admission: Admission
    limits: SpecLimits
    me: ServiceRecord
    creating: dict[str, CreateInFlight]  # sandbox id → its create() in progress
    deleting: dict[str, asyncio.Task]    # sandbox id → the one task deleting it
    reap_interval_s: float
    finished_retention_s: float

    @property
    def closing(self) -> bool:
        """Whether the service is stopping (it takes no more creates)."""

    async def create(self, spec: SandboxSpec | dict, *, owner: str = "", idempotency_key: str | None = None,
                     pool: str | None = None, max_per_owner: int | None = None,
                     _pool_member: SandboxPoolInfo | None = None) -> SandboxInfo: ...

    async def remove(self, sandbox_id: str, reason: str | None, *, final_state: str = "deleted") -> Any: ...
