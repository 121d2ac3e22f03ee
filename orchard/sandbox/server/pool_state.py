"""One warm pool as its orchestrator runs it (pools.py manages them, pool_claim.py claims from them), and
what a claim needs of the manager: apart, so that neither of those two modules imports the other."""

from __future__ import annotations

from collections import deque
from typing import Protocol

from orchard.core.pool import PoolSpec, PoolStatus
from orchard.sandbox.server.service_face import ServiceFace


class PoolState:
    """One configured pool as it runs: its idle members (id, when started on the monotonic clock)."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.key = spec.template
        self.idle: deque[tuple[str, float]] = deque()
        self.starting = 0
        self.target = spec.min_ready
        self.claims = self.misses = self.started = self.failed = self.drained = self.evicted = 0
        self.failures_in_a_row = 0
        self.next_start = 0.0
        self.last_error: str | None = None
        self.retired = False

    def status(self) -> PoolStatus:
        return PoolStatus(name=self.spec.name, template=self.key, min_ready=self.spec.min_ready,
                          max_size=self.spec.size_cap, target=self.target, idle=len(self.idle),
                          starting=self.starting, claims=self.claims, misses=self.misses, started=self.started,
                          failed=self.failed, drained=self.drained, evicted=self.evicted,
                          last_error=self.last_error)


class PoolHost(Protocol):
    """The pool manager as a claim sees it."""

    service: ServiceFace

    def poke(self) -> None:
        """Wake the refill loop (a member was taken or a miss may raise the target)."""

    def discard(self, pool: PoolState, sandbox_id: str, reason: str) -> None:
        """Delete an unclaimed member in the background."""
