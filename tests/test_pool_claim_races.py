"""Pool claims under races and failures, on real parts: the embedded service on the real local backend
(members are real sandboxes, claims go through their real agents), two services sharing one state
database as replicas do, and a real orchestrator process killed with SIGKILL in the middle of a claim."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from orchard.core.errors import CapacityExceeded
from orchard.core.pool import PoolSpec
from orchard.core.sandbox import SandboxInfo, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.server.admission import CreateCaps
from orchard.sandbox.server.service import ACTIVE_STATES, SandboxService
from orchard.sandbox.server.store import SandboxStore
from tests.running_server import live_sandbox_ids
from tests.test_caps import record
from tests.test_pools import idle_members, until

REPO = Path(__file__).resolve().parent.parent


async def works(info: SandboxInfo) -> bool:
    async with AgentSandbox(info.id, info.agent_url, info.token) as sandbox:
        return (await sandbox.exec("echo ok")).stdout == "ok\n"


def test_reown_within_cap_is_atomic_across_store_connections(tmp_path):
    """Two connections on one SQLite file (two orchestrators sharing a home), re-owning members from
    several threads at once: the owner gets exactly its cap, and each member one owner."""
    path = tmp_path / "state.db"
    stores = [SandboxStore(path), SandboxStore(path)]
    try:
        for i in range(12):
            member = record(f"sb-m{i}", owner="pool:p")
            member.info.state = "ready"
            stores[0].insert(member)
        won: list[str] = []
        start = threading.Barrier(6)

        def claim_all(store: SandboxStore) -> None:
            start.wait()
            for i in range(12):
                result = store.reown_within_cap(f"sb-m{i}", from_owner="pool:p", to_owner="carol",
                                                live_states=ACTIVE_STATES, max_per_owner=3)
                if result.outcome == "reowned":
                    won.append(result.sandbox_id)

        threads = [threading.Thread(target=claim_all, args=(stores[t % 2],)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == len(set(won)) == 3
        assert stores[1].count_by_owner(states=ACTIVE_STATES) == {"carol": 3, "pool:p": 9}
        assert {r.info.id for r in stores[1].list(owner="carol")} == set(won)  # the record says so too
    finally:
        for store in stores:
            store.close()


def test_two_orchestrators_sharing_a_store_keep_claims_to_the_per_owner_cap(sandbox_home):
    """Claims on two services sharing one state database at once: the owner's cap holds across both (the
    count and the re-owning are one store transaction), the rest is refused."""
    async def main():
        caps = CreateCaps(max_sandboxes_per_owner=2, wait_s=0)
        services = [SandboxService.embedded(sandbox_home, pools=[PoolSpec(name=name, min_ready=2)], caps=caps)
                    for name in ("a", "b")]
        for service in services:
            await service.start()
        try:
            await until(lambda: all(s.pools.status()[0].idle == 2 for s in services), what="both pools filling")
            results = await asyncio.gather(*(s.create(SandboxSpec(), owner="carol") for s in services * 3),
                                           return_exceptions=True)
            made = [r for r in results if isinstance(r, SandboxInfo)]
            assert len(made) == 2 and all(info.pool.claimed for info in made)
            assert all(isinstance(r, CapacityExceeded) for r in results if not isinstance(r, SandboxInfo))
            assert (await services[0].stats()).by_owner["carol"] == 2
        finally:
            for service in services:
                await service.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


def test_a_claim_the_agent_refuses_deletes_the_member_and_the_caller_gets_a_working_sandbox(sandbox_home):
    """A member whose agent refuses the claim (here: its stored token is not the agent's) is deleted, never
    handed out; the caller gets a cold sandbox with its own working token, and its idempotency key names
    that sandbox. Creates racing with one key get one sandbox, never a member before its claim is done."""
    async def main():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", min_ready=1, max_size=1)])
        await service.start()
        try:
            await until(lambda: service.pools.status()[0].idle == 1, what="the pool filling")
            bad, = idle_members(service)
            stored = service.store.get(bad)
            stored.info.token = "not-the-agents-token-" + "x" * 20
            service.store.save(stored)
            info = await service.create(SandboxSpec(), owner="dave", idempotency_key="k1")
            assert info.id != bad and not info.pool.claimed and await works(info)
            assert f"members failed their claim and were deleted ({bad}: the agent answered 401" in \
                info.pool.fallback_reason
            await until(lambda: service.store.get(bad).info.state == "deleted", what="the refused member's deletion")
            assert "claim failed" in service.store.get(bad).info.error
            assert (await service.create(SandboxSpec(), owner="dave", idempotency_key="k1")).id == info.id
            assert (await service.stats()).by_owner["dave"] == 1

            await until(lambda: service.pools.status()[0].idle == 1, what="the refill")
            racing = await asyncio.gather(*(service.create(SandboxSpec(), owner="erin", idempotency_key="k2")
                                            for _ in range(4)))
            assert len({(i.id, i.token) for i in racing}) == 1 and racing[0].pool.claimed
            assert await works(racing[0])
        finally:
            await service.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


CLAIM_THEN_CRASH = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from orchard.core.pool import PoolSpec
    from orchard.sandbox.server.pool_claim import claim_agent
    from orchard.sandbox.server.service import ACTIVE_STATES, SandboxService

    async def main():
        service = SandboxService.embedded(Path(sys.argv[1]), pools=[PoolSpec(name="p", min_ready=1, max_size=1)],
                                          ephemeral=False)
        await service.start()
        while service.pools.status()[0].idle < 1:
            await asyncio.sleep(0.02)
        member = service.store.list(states=("ready",))[0]
        # What a claim does, up to its last step (the record's rewrite): re-own + key, then the agent.
        service.store.reown_within_cap(member.info.id, from_owner="pool:p", to_owner="alice",
                                       live_states=ACTIVE_STATES, max_per_owner=None, idempotency_key="k1",
                                       fingerprint="f")
        await claim_agent(member.backend.agent_url, member.info.token, "t" * 40, {})
        print(member.info.id, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def test_a_claim_interrupted_by_a_crash_is_deleted_and_its_key_freed(sandbox_home):
    """An orchestrator killed mid-claim (member re-owned and its agent given a new token, record not yet
    rewritten): the next one deletes that member rather than adopt it into the pool (its agent's token is
    in no record), and frees the claim's idempotency key, so the caller's retry gets a working sandbox."""
    process = subprocess.Popen([sys.executable, "-c", CLAIM_THEN_CRASH, str(sandbox_home)], stdout=subprocess.PIPE,
                               cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        member = process.stdout.readline().decode().strip()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert member.startswith("sb-")

    async def main():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", min_ready=1, max_size=1)],
                                          ephemeral=False)
        report = await service.start()
        try:
            assert member in report.orphans_removed
            assert "claim was interrupted" in service.store.get(member).info.error
            assert member not in await live_sandbox_ids(sandbox_home)
            info = await service.create(SandboxSpec(), owner="alice", idempotency_key="k1")
            assert info.id != member and await works(info)
        finally:
            await service.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


def test_pools_the_caps_would_never_let_fill_are_refused_up_front(sandbox_home):
    """Members count against the caps (as the owner `pool:NAME` under the per-owner cap): a pool that could
    never reach min_ready is refused with what to change, rather than refilling into 429s forever."""
    from orchard.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="pool p: min_ready=3 is over max_sandboxes_per_owner=2"):
        SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", min_ready=3)],
                                caps=CreateCaps(max_sandboxes_per_owner=2))
    with pytest.raises(InvalidRequest, match="min_ready add up to 5, over max_sandboxes=4"):
        SandboxService.embedded(sandbox_home, caps=CreateCaps(max_sandboxes=4), pools=[
            PoolSpec(name="a", min_ready=3), PoolSpec(name="b", min_ready=2, spec=SandboxSpec(workdir="/w"))])
