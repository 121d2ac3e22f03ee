"""Warm pools never starve other creates at the server cap: a create of another template waiting for a place
evicts an idle member, member starts yield to waiting creates, and a refusal tells idle members from
sandboxes in use. Real parts: the embedded service on the real local backend (members are real sandboxes),
and two store connections on one SQLite file for orchestrators sharing a store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from orchard.core.errors import CapacityExceeded
from orchard.core.pool import PoolSpec
from orchard.core.sandbox import SandboxInfo, SandboxPoolInfo, SandboxSpec
from orchard.sandbox.server.admission import CreateCaps
from orchard.sandbox.server.models import AdmissionRules, SandboxRecord
from orchard.sandbox.server.service import ACTIVE_STATES, SandboxService
from orchard.sandbox.server.store import SandboxStore
from tests.running_server import live_sandbox_ids

POOLED = {"workdir": "/pooled"}  # the pool's template; SandboxSpec() is another one


async def until(condition, timeout: float = 60.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        await asyncio.sleep(0.02)


def test_a_create_of_another_template_evicts_an_idle_member_and_the_cap_holds(sandbox_home: Path):
    """Cap 3, a pool of 3 filling it: a create of another template gets a place within its wait by evicting
    one idle member (the cap, sampled in the store and in what the backend runs, is never exceeded); the pool
    does not refill into the place while the cap is reached, and refills once a place is free."""
    async def main():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", spec=POOLED, min_ready=3)],
                                          caps=CreateCaps(max_sandboxes=3, wait_s=60), reap_interval_s=0.2)
        await service.start()
        peak_store = peak_backend = 0
        sampling = True

        async def sample() -> None:
            nonlocal peak_store, peak_backend
            while sampling:
                peak_store = max(peak_store, (await service.stats()).live)
                peak_backend = max(peak_backend, len(await service.backend.list_live()))
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        try:
            await until(lambda: service.pools.status()[0].idle == 3, what="the pool filling the cap")
            stats = await service.stats()
            assert stats.live == 3 and stats.pool_members == 3 and stats.waiting_at_server_cap == 0
            info = await service.create(SandboxSpec())
            assert info.state == "ready" and info.pool is None
            assert info.startup.admission_wait_ms > 0  # it waited for the evicted member's deletion
            status = service.pools.status()[0]
            assert status.evicted == 1 and status.idle == 2
            evicted = [r.info for r in service.store.list(states=("deleted",)) if r.info.pool is not None]
            assert len(evicted) == 1 and "evicted to make room" in evicted[0].error
            assert (await service.stats()).waiting_at_server_cap == 0  # its waiting row went with its admission
            # At the cap the pool cannot refill; a freed place is refilled.
            await asyncio.sleep(0.5)
            assert service.pools.status()[0].idle == 2
            await service.delete(info.id)
            await until(lambda: service.pools.status()[0].idle == 3, what="the refill once a place is free")
        finally:
            sampling = False
            await sampler
            await service.stop(delete_all=True)
        assert peak_store == 3 and 0 < peak_backend <= 3
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


def test_a_create_waiting_on_another_orchestrator_sharing_the_store_gets_a_members_place(sandbox_home: Path):
    """Two orchestrators on one home (replicas): the pool's members are the first's, the create waits on the
    second, which has no pools; the first sees the waiting create in the store and evicts one member."""
    async def main():
        caps = CreateCaps(max_sandboxes=2, wait_s=60)
        first = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", spec=POOLED, min_ready=2)],
                                        caps=caps, reap_interval_s=0.2)
        second = SandboxService.embedded(sandbox_home, caps=caps, reap_interval_s=0.2)
        await first.start()
        await second.start()
        try:
            await until(lambda: first.pools.status()[0].idle == 2, what="the pool filling the cap")
            info = await second.create(SandboxSpec())
            assert info.state == "ready" and first.pools.status()[0].evicted == 1
            assert (await second.stats()).live == 2
        finally:
            await second.stop(delete_all=True)
            await first.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


def test_a_refusal_at_the_cap_tells_pool_members_from_sandboxes_in_use(sandbox_home: Path):
    """With wait_s=0 nothing is evicted (the create could not wait for the member's deletion); the 429 says
    how many of the live sandboxes are unclaimed pool members and how many are in use."""
    async def main():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", spec=POOLED, min_ready=2)],
                                          caps=CreateCaps(max_sandboxes=3, wait_s=0))
        await service.start()
        try:
            await until(lambda: service.pools.status()[0].idle == 2, what="the pool filling")
            await service.create(SandboxSpec())
            with pytest.raises(CapacityExceeded) as refused:
                await service.create(SandboxSpec())
            message = str(refused.value)
            assert "cap of 3 live sandboxes (3 now: 1 in use" in message
            assert "2 unclaimed warm-pool members (idle, starting or being evicted" in message
            assert "min_ready" in message and "--max-sandboxes" in message
            assert service.pools.status()[0].evicted == 0
        finally:
            await service.stop(delete_all=True)

    asyncio.run(main())


def record(sandbox_id: str, *, owner: str = "", state: str = "creating", member_of: str | None = None,
           service_id: str = "a") -> SandboxRecord:
    now = time.time()
    pool = SandboxPoolInfo(name=member_of, template="tpl-0", idle=True) if member_of else None
    return SandboxRecord(service_id=service_id, info=SandboxInfo(
        id=sandbox_id, state=state, spec=SandboxSpec(), backend="local", owner=owner, created_at=now,
        expires_at=now + 60, last_heartbeat=now, pool=pool))


def test_member_starts_yield_to_waiting_creates_and_replicas_evict_once_per_waiting_create(tmp_path: Path):
    """Two store connections on one file (two orchestrators sharing a home): while a create waits at the
    server cap, a member start is refused and an ordinary create is not; one waiting create makes the two
    instances evict one member between them, from the pool with the most idle members, oldest first; once
    its place is free nothing more is evicted."""
    path = tmp_path / "state.db"
    first, second = SandboxStore(path), SandboxStore(path)
    try:
        for i, (pool, service_id) in enumerate([("big", "a"), ("big", "a"), ("small", "a"), ("big", "b")]):
            first.insert(record(f"sb-m{i}", owner=f"pool:{pool}", state="ready", member_of=pool,
                                service_id=service_id))
        member_rules = AdmissionRules(live_states=ACTIVE_STATES, max_sandboxes=6, yield_to_waiting=True)
        plain_rules = AdmissionRules(live_states=ACTIVE_STATES, max_sandboxes=6)
        now = time.time()
        first.set_waiting("sb-waiting", now + 30)
        refused = second.admit(record("sb-member", owner="pool:big", member_of="big"), member_rules, now)
        assert refused.outcome == "full" and refused.cap == "server" and refused.pool_members == 4
        assert second.admit(record("sb-plain"), plain_rules, now).outcome == "admitted"
        # 5 live under a cap of 6: a place is free, so the waiting create needs no eviction.
        evict = dict(live_states=ACTIVE_STATES, max_sandboxes=6, now=now, reason="evicted")
        assert first.evict_idle_member("a", **evict) is None
        evict["max_sandboxes"] = 5  # now full: one eviction, by whichever instance comes first
        taken = first.evict_idle_member("a", **evict)
        assert taken is not None and taken.info.id == "sb-m0" and taken.info.state == "deleting"
        assert second.evict_idle_member("b", **evict) is None and first.evict_idle_member("a", **evict) is None
        # The member deleted: its place is free for the waiting create, still nothing more is evicted.
        taken.info.state, taken.finished_at = "deleted", now
        first.save(taken)
        assert second.evict_idle_member("b", **evict) is None
        first.clear_waiting("sb-waiting")
        assert second.admit(record("sb-member", owner="pool:big", member_of="big"), member_rules, now).outcome == \
            "admitted"
        # A waiting row past its create's deadline counts for nothing (an instance that crashed mid-wait).
        first.set_waiting("sb-gone", now - 1)
        assert first.waiting_count(now) == 0 and first.evict_idle_member("a", **evict) is None
    finally:
        first.close()
        second.close()
