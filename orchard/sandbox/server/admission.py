"""Hard caps on creates: the most live sandboxes the orchestrator runs (`max_sandboxes`), the most one owner
runs (`max_sandboxes_per_owner`; the owner is the client's API key name unless it names one), and a create
rate (`max_creates_per_s`, with bursts of `create_burst`). Plus idempotency keys, so that retries of one
create never make two sandboxes.

A sandbox counts against the caps from the moment its record is inserted (before the backend makes
anything) until its record is `deleted` or `lost` (after the backend removed it): creating, ready and
being-deleted sandboxes all count, pool members too, so the backend never runs more than the cap. The check
and the insert are one SQLite transaction (`SandboxStore.admit`), which also serialises orchestrators that
share the store, so concurrent creates cannot overshoot; a crashed orchestrator's sandboxes keep counting
until their records are settled.

Over a cap a create waits up to `wait_s` for a place (polling the store, since the place may be freed by
another instance), then fails with `CapacityExceeded` (HTTP 429) naming the cap, the count and what to do.

Warm-pool members never starve other creates: a create waiting at the server cap is recorded in the store
(`waiting_creates`, seen by every instance sharing it); while any is, idle members are evicted for it
(`relieve`, i.e. `PoolManager.relieve`, and every instance's pool loop) and member starts are refused, so the
place an eviction frees goes to the waiting create. The place counts until the backend deleted the member."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.errors import BackendError, CapacityExceeded, IdempotencyConflict, InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.server.models import Admitted, AdmissionRules, SandboxRecord
from orchard.sandbox.server.store import SandboxStore

# How often a waiting create looks at the store again (a place may be freed by another instance).
POLL_S = 0.05
MAX_IDEMPOTENCY_KEY_CHARS = 200


class CreateCaps(BaseModel):
    """The orchestrator's hard caps (None: no cap). Set with `orchard serve --max-sandboxes ...` or
    `Orchard(caps=CreateCaps(...))` for the embedded orchestrator."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_sandboxes: int | None = Field(default=None, ge=1, description="most live sandboxes in all")
    max_sandboxes_per_owner: int | None = Field(default=None, ge=1,
                                                description="most live sandboxes of one owner (client key)")
    max_creates_per_s: float | None = Field(default=None, gt=0, description="most creates a second, sustained")
    create_burst: int | None = Field(default=None, ge=1,
                                     description="creates allowed at once above the rate (default: one "
                                                 "second's worth, at least 1)")
    wait_s: float = Field(default=10.0, ge=0, le=3600,
                          description="how long a create over a cap waits for a place before it gets 429")

    @property
    def burst(self) -> float:
        if self.create_burst is not None:
            return float(self.create_burst)
        return max(1.0, self.max_creates_per_s or 1.0)


class CapsStats(BaseModel):
    """`GET /v1/stats`: what counts against the caps now, and the caps."""

    live: int = Field(description="sandboxes counting against the caps: creating, ready or being deleted")
    by_owner: dict[str, int] = Field(description="live sandboxes per owner")
    waiting: int = Field(description="creates of this instance waiting for a place under a cap (member starts "
                                     "included)")
    waiting_at_server_cap: int = Field(default=0, description="creates waiting for a place under max_sandboxes, "
                                       "on every instance sharing the store (member starts excluded): idle pool "
                                       "members are evicted for them and member starts wait")
    pool_members: int = Field(default=0, description="live sandboxes that are unclaimed warm-pool members (idle, "
                                                     "starting or being evicted)")
    caps: CreateCaps


def spec_fingerprint(spec: SandboxSpec) -> str:
    """A hash of the whole spec: a key reused with any other spec is a conflict."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Admission:
    """Admits new sandboxes into `store` under `caps`; `live_states` are the states that count. `closing`
    says when the orchestrator is stopping: a waiting create then gives up instead of using a closed store."""

    def __init__(self, store: SandboxStore, caps: CreateCaps | None, live_states: tuple[str, ...], *,
                 closing: Callable[[], bool] = lambda: False, relieve: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.relieve = relieve
        self.caps = caps or CreateCaps()
        self.live_states = live_states
        self.closing = closing
        self.waiting = 0

    async def admit(self, record: SandboxRecord, *, idempotency_key: str | None = None,
                    max_per_owner: int | None = None) -> Admitted:
        """Insert `record` once the caps allow it, waiting up to `caps.wait_s`; `max_per_owner`: a cap of the
        caller's own on its owner (an owner API key's), on top of the server's. Returns `admitted`, or
        `existing` with the sandbox an earlier create with this key made. Raises IdempotencyConflict for a
        key used with another spec, CapacityExceeded when no place came in time. No await follows a
        successful insert, so a cancelled caller never leaves an admitted record it does not know about."""
        if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS:
            raise InvalidRequest(f"an idempotency key must have 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")
        caps = self.caps
        member = record.info.pool is not None and record.info.pool.idle  # a pool member's start
        rules = AdmissionRules(
            live_states=self.live_states, max_sandboxes=caps.max_sandboxes,
            max_per_owner=self.owner_cap(max_per_owner), rate_per_s=caps.max_creates_per_s, rate_burst=caps.burst,
            idempotency_key=idempotency_key,
            fingerprint=spec_fingerprint(record.info.spec) if idempotency_key is not None else None,
            yield_to_waiting=member)
        started = time.monotonic()
        deadline = started + caps.wait_s
        waiting = at_server_cap = False
        try:
            while True:
                if self.closing():  # checked right before the insert: nothing awaits in between
                    raise BackendError("the sandbox service is shutting down; create the sandbox after it restarts")
                result = self.store.admit(record, rules, time.time())
                if result.outcome in ("admitted", "existing"):
                    return result
                if result.outcome == "conflict":
                    raise IdempotencyConflict(
                        f"idempotency key {idempotency_key!r} was already used by this owner to create sandbox "
                        f"{result.sandbox_id} with a different spec; use a new key for a new sandbox (a key "
                        "is freed when its sandbox's record expires)")
                remaining = deadline - time.monotonic()
                if not member and (result.cap == "server") != at_server_cap and remaining > 0:
                    at_server_cap = result.cap == "server"
                    if at_server_cap:  # seen by every instance: member starts wait, idle members are evicted
                        self.store.set_waiting(record.info.id, time.time() + remaining)
                    else:
                        self.store.clear_waiting(record.info.id)
                if at_server_cap:
                    self.relieve()
                if remaining <= 0:
                    raise CapacityExceeded(self._refusal(result, record.info.owner, time.monotonic() - started,
                                                         rules.max_per_owner),
                                           retry_after_s=result.retry_after_s)
                if not waiting:
                    waiting, self.waiting = True, self.waiting + 1
                pause = POLL_S if result.retry_after_s is None else max(result.retry_after_s, 0.001)
                await asyncio.sleep(min(pause, remaining))
        finally:
            if waiting:
                self.waiting -= 1
            if at_server_cap:
                try:
                    self.store.clear_waiting(record.info.id)
                except Exception:  # the store closed (stopping): the row expires at its deadline anyway
                    pass

    def owner_cap(self, key_cap: int | None) -> int | None:
        """The per-owner cap of a create: the server's, or the caller's key's when that is lower."""
        caps = [c for c in (self.caps.max_sandboxes_per_owner, key_cap) if c is not None]
        return min(caps) if caps else None

    def stats(self) -> CapsStats:
        by_owner = self.store.count_by_owner(states=self.live_states)
        members = sum(n for owner, n in by_owner.items() if owner.startswith("pool:"))
        return CapsStats(live=sum(by_owner.values()), by_owner=by_owner, waiting=self.waiting,
                         waiting_at_server_cap=self.store.waiting_count(time.time()), pool_members=members,
                         caps=self.caps)

    def _refusal(self, result: Admitted, owner: str, waited_s: float, owner_cap: int | None) -> str:
        caps = self.caps
        waited = f"waited {waited_s:.1f} s (wait_s={caps.wait_s:g}) and none freed up" if caps.wait_s else \
            "wait_s is 0, so it did not wait"
        cap: Literal["server", "owner", "rate"] | None = result.cap
        if cap == "server":
            in_use = result.live - result.pool_members
            members = ""
            if result.pool_members:
                members = (f", and {result.pool_members} unclaimed warm-pool member"
                           f"{'s' if result.pool_members != 1 else ''} (idle, starting or being evicted: idle ones "
                           "are evicted for waiting creates, none freed a place in time; lower the pools' "
                           "min_ready and max_size to leave room)")
            return (f"the orchestrator is at its cap of {caps.max_sandboxes} live sandboxes ({result.live} now: "
                    f"{in_use} in use, counting those being created or deleted{members}); the create {waited}. "
                    "Delete sandboxes you no longer need, retry later, or raise max_sandboxes "
                    "(orchard serve --max-sandboxes)")
        if cap == "owner":
            raise_it = ("raise max_sandboxes_per_owner (orchard serve --max-sandboxes-per-owner)"
                        if owner_cap == caps.max_sandboxes_per_owner else "ask for a key with a higher cap")
            return (f"owner {owner!r} is at its cap of {owner_cap} live sandboxes "
                    f"({result.live} now); the create {waited}. Delete some of your sandboxes, retry later, or "
                    f"{raise_it}")
        retry = f"; retry in {result.retry_after_s:.2f} s" if result.retry_after_s is not None else ""
        return (f"creates are limited to {caps.max_creates_per_s:g} a second (bursts of {caps.burst:g}); the "
                f"create {waited}{retry}, or raise max_creates_per_s (orchard serve --max-creates-per-s)")
