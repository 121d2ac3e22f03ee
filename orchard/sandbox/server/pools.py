"""Warm pools on the orchestrator: pre-started sandboxes per template, claimed by creates whose spec has
that template (orchard/core/pool.py says what a template is). Backend-neutral: members are ordinary
sandboxes made through `SandboxService.create`, so every backend has pools, and members are records in
the store like any sandbox (marked `info.pool.idle`), which is how a restarted orchestrator finds them.

- A claim takes an idle member, asks its agent (`POST /claim`, with the member's own token) to replace
  that token with a fresh one and to apply the caller's env, then rewrites the record: the caller's spec,
  owner, labels, TTL, `pool.claimed`, `startup.pool_claim_ms`. No process starts.
- A create that matches a pool when none is idle is made cold; its record says so (`pool.fallback_reason`).
- Members are refilled in the background up to the pool's target (`min_ready`, raised by misses when
  `on_demand`), never more than `max_size` at once, at most `refill_parallel` starting and `refill_per_s`
  starts a second. Members idle over `max_idle_s` are replaced.
- Members never starve other creates at the server cap: while a create waits there (on any instance sharing
  the store), idle members are evicted for it (`relieve`) and member starts wait (admission.py).
- The claim itself is pool_claim.py.
- A pool whose template changed (reconfigured, or found after a restart) never hands out its old members:
  they are deleted. Stopping the service deletes every idle member; after a crash, the next instance
  adopts them into the pool of the same name and template, or deletes them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Iterable

from orchard.core.errors import CapacityExceeded, InvalidRequest
from orchard.core.pool import PoolSpec, PoolStatus, PoolsConfig, template_differences, template_key
from orchard.core.sandbox import SandboxInfo, SandboxPoolInfo, SandboxSpec
from orchard.sandbox.server.pool_claim import claim_from
from orchard.sandbox.server.pool_state import PoolState
from orchard.sandbox.server.service_face import ServiceFace

log = logging.getLogger("orchard.sandbox.server.pools")

MAINTENANCE_INTERVAL_S = 5.0   # how often idle members are checked (dead, too old) and strays adopted
EVICT_CHECK_INTERVAL_S = 0.25  # how often idle members look for creates waiting at the cap on other instances
STRAY_CHECK_INTERVAL_S = 60.0  # how often members taken over from a dead instance are looked for
MAX_BACKOFF_S = 30.0           # after failed member starts, the next waits up to this long
CAP_RETRY_S = 0.5              # after a member start found no place under the caps (it waited wait_s already)


POOL_OWNER_PREFIX = "pool:"  # reserved: no caller may name itself so (store_admission.POOL_OWNER_SQL)


def member_owner(pool_name: str) -> str:
    """The owner of a pool's unclaimed members. A claim re-owns the member to its caller first (counted
    against the caller's cap), then asks its agent for the fresh token: an `idle` member owned by anyone
    else is a claim in flight, whose agent may hold a token no record has."""
    return f"{POOL_OWNER_PREFIX}{pool_name}"


def check_caller_owner(owner: str) -> None:
    """Refuse an owner a caller may not create as: one named like a pool's members would have its sandboxes
    counted as pool members (against the server cap's room for pools), be taken for a claim in flight, and
    make a pool's owner cap count a stranger's sandboxes."""
    if owner.startswith(POOL_OWNER_PREFIX):
        raise InvalidRequest(f"owner {owner[:80]!r} starts with {POOL_OWNER_PREFIX!r}, which is reserved for "
                             "the orchestrator's warm pools; pick another owner name")


def pools_of(pools: PoolsConfig | Iterable[PoolSpec] | PoolSpec | None) -> list[PoolSpec]:
    """The pool specs in any of the accepted shapes, validated together (unique names and templates)."""
    if pools is None:
        return []
    if isinstance(pools, PoolsConfig):
        return list(pools.pools)
    if isinstance(pools, PoolSpec):
        pools = [pools]
    return list(PoolsConfig(pools=list(pools)).pools)


class PoolManager:
    """The pools of one `SandboxService` (which calls `start`, `claim`, `stop`)."""

    def __init__(self, service: ServiceFace, pools: PoolsConfig | Iterable[PoolSpec] | None = None) -> None:
        self.service = service
        self.pools: dict[str, PoolState] = {}
        self._by_key: dict[str, PoolState] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._next_stray_check = 0.0
        self.configure(pools_of(pools), drain=False)

    # --- configuration -----------------------------------------------------------------------------------

    def configure(self, pools: PoolsConfig | Iterable[PoolSpec] | None, *, drain: bool = True) -> None:
        """Run these pools from now on. A pool whose template changed, or that is gone, is retired: its
        idle members are deleted, never handed out (nor those still starting, once they are up)."""
        specs = pools_of(pools)
        for spec in specs:  # refused now, not at every member start
            member = self.member_spec(PoolState(spec))
            try:
                self.service.backend.capabilities.check(member, self.service.backend.name)
                self.service.limits.check(member)
            except InvalidRequest as e:
                raise InvalidRequest(f"pool {spec.name}: {e}") from None
        self._check_caps(specs)
        new: dict[str, PoolState] = {}
        for spec in specs:
            old = self.pools.get(spec.name)
            if old is not None and old.key == spec.template:
                old.spec, old.target = spec, max(spec.min_ready, min(old.target, spec.size_cap))
                new[spec.name] = old
            else:
                new[spec.name] = PoolState(spec)
        retired = [p for name, p in self.pools.items() if new.get(name) is not p]
        self.pools, self._by_key = new, {p.key: p for p in new.values()}
        for pool in retired:
            pool.retired = True
            if drain:
                while pool.idle:
                    self.discard(pool, pool.idle.popleft()[0], f"deleted: pool {pool.spec.name}'s template "
                                  "changed or the pool was removed; its members are never handed out")
        self.poke()

    def _check_caps(self, specs: list[PoolSpec]) -> None:
        """Refuse pools the caps would never let fill: their refill would wait for a place and fail forever."""
        caps = self.service.admission.caps
        per_owner, total = caps.max_sandboxes_per_owner, caps.max_sandboxes
        for spec in specs:
            if per_owner is not None and spec.min_ready > per_owner:
                raise InvalidRequest(
                    f"pool {spec.name}: min_ready={spec.min_ready} is over max_sandboxes_per_owner={per_owner}, and "
                    f"its members count as the owner {member_owner(spec.name)!r}, so it could never fill; lower "
                    "min_ready or raise the cap")
        ready = sum(spec.min_ready for spec in specs)
        if total is not None and ready > total:
            raise InvalidRequest(f"the pools' min_ready add up to {ready}, over max_sandboxes={total} (members count "
                                 "against it), so they could never fill; lower min_ready or raise the cap")

    def status(self) -> list[PoolStatus]:
        return [p.status() for p in self.pools.values()]

    @property
    def stopping(self) -> bool:
        """This manager or its service is stopping: no member starts."""
        return self._stopping or self.service.closing

    # --- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Adopt idle members this instance already has (after a restart), then refill in the background."""
        self._wake = asyncio.Event()
        self._adopt_strays()
        self._loop_task = asyncio.create_task(self._refill_forever(), name="orchard-pools")

    async def stop(self) -> None:
        """Stop refilling, let member starts finish, and delete every idle member (they belong to nobody)."""
        self._stopping = True
        task, self._loop_task = self._loop_task, None
        here = asyncio.get_running_loop()
        if task is not None and not task.done() and not task.get_loop().is_closed():
            if task.get_loop() is here:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            else:
                task.get_loop().call_soon_threadsafe(task.cancel)
        await asyncio.gather(*[t for t in self._tasks if t.get_loop() is here], return_exceptions=True)
        for pool in self.pools.values():
            pool.drained += len(pool.idle)
            pool.idle.clear()
        members = [r.info.id for r in self.service.store.list(service_id=self.service.me.id, states=("ready",))
                   if r.info.pool is not None and r.info.pool.idle]
        results = await asyncio.gather(*(self.service.remove(sid, "deleted: the orchestrator stopped (an unclaimed "
                                                              "pool member)") for sid in members),
                                       return_exceptions=True)
        for sid, result in zip(members, results):
            if isinstance(result, BaseException):
                log.error("could not delete pool member %s while stopping: %s", sid, result)

    # --- claims ------------------------------------------------------------------------------------------

    def match(self, spec: SandboxSpec, pool_name: str | None) -> tuple[PoolState | None, str | None]:
        """The pool a create of `spec` claims from, or (None, why not) for an explicitly named pool that
        cannot serve it. (None, None): no pool is involved."""
        if pool_name is not None:
            pool = self.pools.get(pool_name)
            if pool is None:
                known = ", ".join(sorted(self.pools)) or "none are configured"
                raise InvalidRequest(f"no pool named {pool_name!r} (pools: {known}); name one of them or leave the "
                                     "pool out to claim from the pool whose template matches the spec")
            if pool.key != template_key(spec):
                diffs = "; ".join(template_differences(spec, pool.spec.spec))
                return pool, f"the spec's template differs from pool {pool_name}'s ({diffs}): made cold"
            return pool, None
        return self._by_key.get(template_key(spec)), None

    async def claim(self, spec: SandboxSpec, *, owner: str, pool_name: str | None = None,
                    started: float | None = None, idempotency_key: str | None = None,
                    max_per_owner: int | None = None) -> tuple[SandboxInfo | None, SandboxPoolInfo | None]:
        """(the claimed sandbox, None), or (None, what to record on the cold sandbox made instead: None when
        no pool matches, or when `idempotency_key` already names a sandbox: the normal create answers it).
        `started`: when the create began (time.monotonic())."""
        started = time.monotonic() if started is None else started
        pool, why_not = self.match(spec, pool_name)
        if pool is None:
            return None, None
        key = template_key(spec)
        if why_not is None and self._stopping:
            why_not = "the orchestrator is stopping"
        return await claim_from(self, pool, spec, owner, started, idempotency_key, key, why_not,
                                max_per_owner=max_per_owner)

    # --- making room for creates waiting at the server cap ---------------------------------------------------

    def _may_evict(self) -> bool:
        return self.service.admission.caps.max_sandboxes is not None and any(p.idle for p in self.pools.values())

    def relieve(self) -> None:
        """Evict idle members of this instance while creates (of any instance sharing the store) wait at the
        server cap for a place that is neither free nor being freed (SandboxStore.evict_idle_member decides,
        in one transaction). Each is deleted in the background; its place counts until the backend deleted
        it, and member starts wait meanwhile, so the waiting create gets it."""
        if not self._may_evict():
            return
        service, cap = self.service, self.service.admission.caps.max_sandboxes
        assert cap is not None
        if service.store.waiting_count(time.time()) == 0:
            return
        reason = f"deleted: an idle pool member evicted to make room for a create waiting at max_sandboxes={cap}"
        while (record := service.store.evict_idle_member(
                service.me.id, live_states=service.admission.live_states, max_sandboxes=cap, now=time.time(),
                reason=reason)) is not None:
            member = record.info.pool
            pool = self.pools.get(member.name) if member is not None else None
            if pool is not None:
                pool.idle = deque(entry for entry in pool.idle if entry[0] != record.info.id)
                pool.evicted += 1
            log.info("pool %s: evicted idle member %s for a create waiting at max_sandboxes=%d",
                     member.name if member else "?", record.info.id, cap)
            self._spawn(self._remove_evicted(record.info.id, reason))

    async def _remove_evicted(self, sandbox_id: str, reason: str) -> None:
        try:
            await self.service.remove(sandbox_id, reason)
        except Exception as e:
            log.warning("could not delete evicted pool member %s (the reaper retries): %s", sandbox_id, e)

    # --- refilling -----------------------------------------------------------------------------------------

    def poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _refill_forever(self) -> None:
        assert self._wake is not None
        next_maintenance = time.monotonic() + MAINTENANCE_INTERVAL_S
        while not self._stopping:
            self._wake.clear()
            now = time.monotonic()
            try:
                if now >= next_maintenance:
                    next_maintenance = now + MAINTENANCE_INTERVAL_S
                    self._maintain()
                wait = min(self._top_up(), next_maintenance - now)
                if self._may_evict():  # a create on another instance sharing the store may wait for a place
                    self.relieve()
                    wait = min(wait, EVICT_CHECK_INTERVAL_S)
            except Exception:  # never let one bad pass stop refilling
                log.exception("refilling the warm pools failed; retrying")
                wait = 1.0
            try:
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.001))
            except TimeoutError:
                pass

    def _top_up(self) -> float:
        """Start the members each pool lacks now; return how long until a start may be due again."""
        now, wait = time.monotonic(), MAINTENANCE_INTERVAL_S
        for pool in self.pools.values():
            spec = pool.spec
            while (pool.starting + len(pool.idle) < min(pool.target, spec.size_cap)
                   and pool.starting < spec.refill_parallel and not self.stopping):
                if now < pool.next_start:
                    wait = min(wait, pool.next_start - now)
                    break
                if spec.refill_per_s is not None:
                    pool.next_start = max(now, pool.next_start) + 1.0 / spec.refill_per_s
                pool.starting += 1
                self._spawn(self._start_member(pool))
        return wait

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def member_spec(self, pool: PoolState) -> SandboxSpec:
        ttl = pool.spec.member_timeout_s
        if self.service.limits.timeout_s is not None:
            ttl = min(ttl, self.service.limits.timeout_s)
        return pool.spec.spec.model_copy(update={"timeout_s": ttl, "heartbeat_timeout_s": None})

    async def _start_member(self, pool: PoolState) -> None:
        try:
            info = await self.service.create(
                self.member_spec(pool), owner=member_owner(pool.spec.name),
                _pool_member=SandboxPoolInfo(name=pool.spec.name, template=pool.key, idle=True))
        except CapacityExceeded as e:  # at the cap, or yielding to waiting creates: not the member's fault
            pool.last_error = f"waiting for a place: {e}"
            pool.next_start = time.monotonic() + CAP_RETRY_S
            return
        except Exception as e:
            pool.failed += 1
            pool.failures_in_a_row += 1
            pool.last_error = str(e)
            pool.next_start = time.monotonic() + min(MAX_BACKOFF_S, 0.5 * 2 ** pool.failures_in_a_row)
            if not self.stopping:
                log.warning("pool %s: starting a member failed (%s); retrying", pool.spec.name, e)
            return
        finally:
            pool.starting -= 1
            self.poke()
        pool.started += 1
        pool.failures_in_a_row = 0
        if pool.retired or self._stopping:
            self.discard(pool, info.id, "deleted: its pool was retired or the orchestrator is stopping")
        else:
            pool.idle.append((info.id, time.monotonic()))

    def discard(self, pool: PoolState, sandbox_id: str, reason: str) -> None:
        """Delete an unclaimed member in the background."""
        pool.drained += 1

        async def remove() -> None:
            try:
                await self.service.remove(sandbox_id, reason)
            except Exception as e:
                log.warning("could not delete pool member %s (the reaper retries): %s", sandbox_id, e)

        self._spawn(remove())

    def _maintain(self) -> None:
        """Forget dead members, replace (or, above min_ready, drop) those idle too long, adopt strays."""
        now = time.monotonic()
        for pool in self.pools.values():
            kept: deque[tuple[str, float]] = deque()
            for sandbox_id, since in pool.idle:
                record = self.service.store.get(sandbox_id)
                if record is None or record.info.state != "ready":
                    continue
                if now - since > pool.spec.max_idle_s:
                    self.discard(pool, sandbox_id, f"deleted: an unclaimed pool member older than max_idle_s="
                                  f"{pool.spec.max_idle_s:g}")
                    if pool.target > pool.spec.min_ready:
                        pool.target -= 1
                    continue
                kept.append((sandbox_id, since))
            pool.idle = kept
        # Strays appear only when this instance takes over a dead one's sandboxes (rare); looking for them
        # reads every record this instance has, so it is done less often.
        if now >= self._next_stray_check:
            self._next_stray_check = now + STRAY_CHECK_INTERVAL_S
            self._adopt_strays()

    def _adopt_strays(self) -> None:
        """Idle members this instance manages but no pool holds (from before a restart, or taken over from
        a dead instance): into the pool of their name and template, else deleted."""
        held = {sid for pool in self.pools.values() for sid, _ in pool.idle}
        busy = self.service.creating.keys() | self.service.deleting.keys()
        now_wall, now = time.time(), time.monotonic()
        for record in self.service.store.list(service_id=self.service.me.id, states=("ready",)):
            member = record.info.pool
            if (member is None or not member.idle or record.info.id in held or record.info.id in busy
                    or record.info.owner != member_owner(member.name)):  # the last: a claim in flight
                continue
            pool = self.pools.get(member.name)
            age = now_wall - record.info.created_at
            if pool is not None and pool.key == member.template and age < pool.spec.max_idle_s and not self._stopping:
                pool.idle.append((record.info.id, now - age))
            else:
                self.discard(pool or PoolState(PoolSpec(name=member.name, min_ready=0)), record.info.id,
                              "deleted: a pool member whose pool's template changed or is gone")
