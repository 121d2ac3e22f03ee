"""Warm pools on the real local backend: members are real sandboxes (bubblewrap + their agent), claims go
through the real agent's POST /claim, and "nothing leaked" is checked against what the backend itself finds
running (its `list_live`, from the processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchard.core.errors import AuthError, InvalidRequest
from orchard.core.pool import PoolSpec, PoolsConfig, template_key
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.server.pool_claim import claim_agent
from orchard.sandbox.server.service import SandboxService
from tests.running_server import live_sandbox_ids

REPO = Path(__file__).resolve().parent.parent


async def until(condition, timeout: float = 90.0, what: str = "the condition", state=None) -> None:
    """Wait for `condition()`; on timeout the failure names `what` and, when given, `state()` (what was seen)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            seen = f"; state: {state()}" if state is not None else ""
            raise AssertionError(f"{what} did not happen within {timeout:g} s{seen}")
        await asyncio.sleep(0.02)


def idle_members(service: SandboxService) -> dict[str, str]:
    """id → token of the unclaimed members in the store."""
    return {r.info.id: r.info.token for r in service.store.list(states=("ready",))
            if r.info.pool is not None and r.info.pool.idle}


@pytest.fixture
def run(sandbox_home):
    """Run an async test body against a started embedded service with `pools`; stop deletes everything."""
    def runner(pools, body):
        async def main():
            service = SandboxService.embedded(sandbox_home, pools=pools, reap_interval_s=0.2)
            await service.start()
            try:
                await body(service)
            finally:
                await service.stop(delete_all=True)
            assert await live_sandbox_ids(sandbox_home) == set(), "stop left sandboxes running"
        asyncio.run(main())
    return runner


def test_claim_hands_out_a_member_with_a_fresh_token_and_the_callers_env_and_labels(run):
    async def body(service: SandboxService):
        await until(lambda: service.pools.status()[0].idle == 2, what="the pool filling to min_ready=2")
        members = idle_members(service)
        assert await service.list() == []  # idle members are nobody's: not listed
        info = await service.create(SandboxSpec(env={"GREETING": "hi"}, labels={"run": "r1"}, timeout_s=60),
                                    owner="alice")
        assert info.id in members and info.pool.claimed and info.pool.name == "warm"
        assert info.token != members[info.id]
        assert info.owner == "alice" and info.spec.labels == {"run": "r1"}
        assert info.expires_at - info.created_at == pytest.approx(60)
        assert info.startup.pool_claim_ms is not None and info.startup.backend_create_ms is None
        assert [i.id for i in await service.list(labels={"run": "r1"})] == [info.id]
        async with AgentSandbox(info.id, info.agent_url, info.token) as sandbox:
            result = await sandbox.exec("echo $GREETING")
            assert result.stdout == "hi\n"
            session = await sandbox.shell("s")
            assert (await session.run("echo $GREETING")).output.strip() == "hi"
        async with AgentSandbox(info.id, info.agent_url, members[info.id]) as with_pool_token:
            with pytest.raises(AuthError):
                await with_pool_token.exec("true")
        # A claimed sandbox is claimed once: its holder cannot be replaced, the pool's token least of all.
        from orchard.core.errors import OrchardError
        with pytest.raises(OrchardError, match="401"):
            await claim_agent(info.agent_url, members[info.id], "x" * 32, {})
        with pytest.raises(OrchardError, match="409"):
            await claim_agent(info.agent_url, info.token, "y" * 32, {})
        # Each member's agent accepts only its own token.
        other = next(sid for sid in idle_members(service) if sid != info.id)
        with pytest.raises(OrchardError, match="401"):
            await claim_agent((await service.get(other)).agent_url, info.token, "z" * 32, {})
        # The pool refills behind the claim.
        await until(lambda: service.pools.status()[0].idle == 2, what="the refill after a claim")
        assert service.pools.status()[0].claims == 1

    run([PoolSpec(name="warm", min_ready=2)], body)


def test_an_empty_pool_falls_back_to_a_cold_create_and_says_why(run):
    async def body(service: SandboxService):
        info = await service.create(SandboxSpec(env={"A": "1"}))
        assert info.pool is not None and not info.pool.claimed
        assert "no started member" in info.pool.fallback_reason
        assert info.startup.backend_create_ms is not None and info.startup.pool_claim_ms is None
        # A spec of another template has nothing to do with the pool.
        other = await service.create(SandboxSpec(workdir="/elsewhere"))
        assert other.pool is None
        # Naming a pool whose template differs: made cold, the reason names the field.
        named = await service.create(SandboxSpec(workdir="/elsewhere"), pool="empty")
        assert not named.pool.claimed and "workdir" in named.pool.fallback_reason
        with pytest.raises(InvalidRequest, match="no pool named"):
            await service.create(SandboxSpec(), pool="nope")
        assert service.pools.status()[0].misses == 1

    run([PoolSpec(name="empty", min_ready=0, max_size=2)], body)


def test_on_demand_grows_to_the_demand_but_never_past_max_size(run):
    """Five creates at once find the on-demand pool empty: five misses, each asking for one more member, and
    the pool grows to max_size=3, never past it; claims then do not grow it further.

    The creates are concurrent on purpose: only a miss grows the pool, and whether a create that follows
    another misses depends on whether the member the previous miss started is up before that create's own
    cold start finished (a race; sequential creates made 2 to 3 misses in 5, so the pool grew to 2 at times
    and never reached max_size)."""
    async def body(service: SandboxService):
        seen_max = 0

        async def watch():
            nonlocal seen_max
            while True:
                status = service.pools.status()[0]
                seen_max = max(seen_max, status.idle + status.starting)
                await asyncio.sleep(0.005)

        def status():
            return service.pools.status()[0]

        watcher = asyncio.create_task(watch())
        try:
            made = await asyncio.gather(*(service.create(SandboxSpec(cpu=None), owner="bob") for _ in range(5)))
            assert all(info.pool is not None and not info.pool.claimed for info in made)
            assert status().misses == 5 and status().claims == 0 and status().target == 3
            await until(lambda: status().idle == 3, what="the pool growing to max_size", state=status)
            for _ in range(3):  # three members to claim: each create claims one, and the pool refills to 3
                assert (await service.create(SandboxSpec(cpu=None), owner="bob")).pool.claimed
            await until(lambda: status().idle == 3, what="the refill after the claims", state=status)
            await asyncio.sleep(0.3)
            final = status()
            assert (final.target, final.idle, final.claims, final.misses, final.started) == (3, 3, 3, 5, 6), final
        finally:
            watcher.cancel()
        assert seen_max <= 3

    run([PoolSpec(name="grow", min_ready=0, max_size=3, on_demand=True)], body)


def test_members_of_a_changed_template_are_never_handed_out(run):
    async def body(service: SandboxService):
        await until(lambda: service.pools.status()[0].idle == 2, what="the first template's members")
        old = set(idle_members(service))
        service.pools.configure([PoolSpec(name="p", min_ready=2, spec=SandboxSpec(workdir="/work2"))])
        # Until the new template's members are up, a create of the old template is no pool's: made cold.
        first = await service.create(SandboxSpec())
        assert first.id not in old and first.pool is None
        await until(lambda: service.pools.status()[0].idle == 2, what="the new template's members")
        claimed = await service.create(SandboxSpec(workdir="/work2"))
        assert claimed.pool.claimed and claimed.id not in old
        await until(lambda: not (old & set(idle_members(service))), what="the old members' deletion")
        assert not (old & await live_sandbox_ids(service_home(service)))

    run([PoolSpec(name="p", min_ready=2)], body)


def service_home(service: SandboxService) -> Path:
    return Path(service.store.path).parent


def test_a_claim_with_an_idempotency_key_is_answered_again_not_repeated(run):
    async def body(service: SandboxService):
        await until(lambda: service.pools.status()[0].idle == 2, what="the pool filling")
        first = await service.create(SandboxSpec(), owner="k", idempotency_key="key-1")
        again = await service.create(SandboxSpec(), owner="k", idempotency_key="key-1")
        assert first.pool.claimed and again.id == first.id
        assert service.pools.status()[0].claims == 1

    run([PoolSpec(name="p", min_ready=2)], body)


def test_pool_specs_are_checked():
    with pytest.raises(ValueError, match="leave env and labels empty"):
        PoolSpec(name="p", spec=SandboxSpec(env={"A": "1"}))
    with pytest.raises(ValueError, match="below min_ready"):
        PoolSpec(name="p", min_ready=3, max_size=2)
    with pytest.raises(ValueError, match="same template"):
        PoolsConfig(pools=[PoolSpec(name="a"), PoolSpec(name="b", spec=SandboxSpec(timeout_s=5))])
    # env, labels and the TTLs are not part of the template; everything else is.
    assert template_key(SandboxSpec(env={"A": "1"}, labels={"x": "y"}, timeout_s=9)) == template_key(SandboxSpec())
    assert template_key(SandboxSpec(memory_mb=512)) != template_key(SandboxSpec())


CRASHING_ORCHESTRATOR = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from orchard.core.pool import PoolSpec
    from orchard.sandbox.server.service import SandboxService

    async def main():
        service = SandboxService.embedded(Path(sys.argv[1]), pools=[PoolSpec(name="p", min_ready=2)],
                                          ephemeral=sys.argv[2] == "ephemeral")
        await service.start()
        while service.pools.status()[0].idle < 2:
            await asyncio.sleep(0.02)
        print("FILLED", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def crash_an_orchestrator_with_a_full_pool(home: Path, mode: str) -> set[str]:
    """Start a pooled orchestrator in a process of its own, wait for its 2 members, kill -9 it; return the
    members' ids (still running: nobody deleted them)."""
    process = subprocess.Popen([sys.executable, "-c", CRASHING_ORCHESTRATOR, str(home), mode],
                               stdout=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert process.stdout.readline().strip() == b"FILLED"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    members = asyncio.run(live_sandbox_ids(home))
    assert len(members) == 2
    return members


@pytest.mark.slow
def test_after_a_crash_members_are_adopted_into_their_pool_or_deleted(sandbox_home):
    """A server's members (not ephemeral) are adopted into the pool of the same template and handed out
    without a new start; under a changed template they are deleted; an embedded (ephemeral) orchestrator's
    die with it. Each way: no orphan left."""
    members = crash_an_orchestrator_with_a_full_pool(sandbox_home, "server")

    async def adopt():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", min_ready=2)], ephemeral=False)
        await service.start()
        try:
            assert service.pools.status()[0].idle == 2 and service.pools.status()[0].started == 0
            info = await service.create(SandboxSpec(env={"B": "2"}))
            assert info.id in members and info.pool.claimed
        finally:
            await service.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(adopt())

    members = crash_an_orchestrator_with_a_full_pool(sandbox_home, "server")

    async def changed_template():
        service = SandboxService.embedded(
            sandbox_home, pools=[PoolSpec(name="p", min_ready=0, spec=SandboxSpec(memory_mb=256))], ephemeral=False)
        await service.start()
        try:
            # Deleted, not only out of the pool (a member is `deleting` while the backend removes it).
            await until(lambda: all(service.store.get(m).info.state == "deleted" for m in members),
                        what="the stale members' deletion")
            assert not (members & await live_sandbox_ids(sandbox_home))
        finally:
            await service.stop()
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(changed_template())

    crash_an_orchestrator_with_a_full_pool(sandbox_home, "ephemeral")

    async def embedded_crash():
        service = SandboxService.embedded(sandbox_home)
        report = await service.start()
        await service.stop()
        assert len(report.orphans_removed) == 2
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(embedded_crash())


def test_claims_keep_to_the_per_owner_cap(sandbox_home):
    """A claim gives its owner one more live sandbox: over `max_sandboxes_per_owner` it is refused like a
    cold create (429 after the wait), never handed out. The pool's members count as the owner `pool:NAME`
    under that cap, so a pool holds at most the cap."""
    from orchard.core.errors import CapacityExceeded
    from orchard.sandbox.server.admission import CreateCaps

    async def main():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", min_ready=2)],
                                          caps=CreateCaps(max_sandboxes_per_owner=2, wait_s=0))
        await service.start()
        try:
            await until(lambda: service.pools.status()[0].idle == 2, what="the pool filling")
            made = await asyncio.gather(*(service.create(SandboxSpec(), owner="carol") for _ in range(2)))
            assert all(info.pool.claimed for info in made)
            with pytest.raises(CapacityExceeded):
                await service.create(SandboxSpec(), owner="carol")
            assert service.pools.status()[0].claims == 2
            await until(lambda: service.pools.status()[0].idle == 2, what="the refill")
            with pytest.raises(CapacityExceeded):
                await service.create(SandboxSpec(), owner="carol")
            assert service.pools.status()[0].claims == 2
        finally:
            await service.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


def test_stop_deletes_unclaimed_members_and_keeps_claimed_sandboxes(sandbox_home):
    """A server stopping leaves its users' sandboxes for the next start, but not its unclaimed members."""
    async def main():
        service = SandboxService.embedded(sandbox_home, pools=[PoolSpec(name="p", min_ready=2)], ephemeral=False)
        await service.start()
        await until(lambda: service.pools.status()[0].idle == 2, what="the pool filling")
        claimed = await service.create(SandboxSpec())
        await until(lambda: service.pools.status()[0].idle == 2, what="the refill")
        await service.stop()
        assert await live_sandbox_ids(sandbox_home) == {claimed.id}
        again = SandboxService.embedded(sandbox_home, ephemeral=False)
        assert (await again.start()).adopted == [claimed.id]
        await again.stop(delete_all=True)
        assert await live_sandbox_ids(sandbox_home) == set()

    asyncio.run(main())


def test_orchard_serve_pools_file_and_the_rest_surface(sandbox_home, monkeypatch):
    """`orchard serve --pools FILE` (here through ORCHARD_POOLS), a remote client's create claimed from it,
    GET /v1/pools, PUT /v1/pools to change the template."""
    import httpx

    from orchard.sandbox.client import AsyncOrchard
    from tests.running_server import running_server

    pools_file = sandbox_home / "pools.yaml"
    pools_file.write_text("pools:\n  - name: web\n    min_ready: 1\n    spec: {workdir: /srv}\n")
    monkeypatch.setenv("ORCHARD_POOLS", str(pools_file))
    with running_server(sandbox_home, api_key="pool-key") as server:
        async def main():
            async with AsyncOrchard(server.url, "pool-key") as orch:
                deadline = time.monotonic() + 30
                while (await orch.pool_status())[0].idle < 1:
                    assert time.monotonic() < deadline, "the server's pool never filled"
                    await asyncio.sleep(0.05)
                sandbox = await orch.create(workdir="/srv", env={"WHO": "remote"}, labels={"t": "1"})
                info = await orch.get(sandbox.id)
                assert info.pool.claimed and info.pool.name == "web" and info.owner == "default"
                assert (await sandbox.exec("echo $WHO; pwd")).stdout == "remote\n/srv\n"
                assert [i.id for i in await orch.list()] == [sandbox.id]
                cold = await orch.create(workdir="/other", pool="web")
                assert "workdir" in (await orch.get(cold.id)).pool.fallback_reason
                async with httpx.AsyncClient(base_url=server.url,
                                             headers={"Authorization": "Bearer pool-key"}) as http:
                    answer = await http.put("/v1/pools", json={"pools": [{"name": "web", "min_ready": 0}]})
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["pools"][0]["idle"] == 0
                    bad = await http.put("/v1/pools", json={"pools": [{"name": "web", "spec": {"env": {"A": "1"}}}]})
                    assert bad.status_code == 422 or bad.status_code == 400
                deadline = time.monotonic() + 30
                while len(await live_sandbox_ids(sandbox_home)) != 2:  # the old member is deleted
                    assert time.monotonic() < deadline, "the old template's member was not deleted"
                    await asyncio.sleep(0.05)

        asyncio.run(main())


def test_embedded_sdk_pool_option(sandbox_home):
    """`Orchard(pool=...)`: the sync SDK's in-process orchestrator runs the pool; its creates are claimed."""
    from orchard.sandbox.client import Orchard

    with Orchard(home=sandbox_home, pool={"name": "sdk", "min_ready": 1}) as orch:
        deadline = time.monotonic() + 30
        while orch.pool_status()[0].idle < 1:
            assert time.monotonic() < deadline, "the pool never filled"
            time.sleep(0.02)
        with orch.create(env={"X": "y"}) as sandbox:
            assert orch.get(sandbox.id).pool.claimed
            assert sandbox.exec("echo $X").stdout == "y\n"
    with pytest.raises(InvalidRequest, match="invalid pool"):
        Orchard(home=sandbox_home, pool={"name": "Bad Name"})
    assert asyncio.run(live_sandbox_ids(sandbox_home)) == set()


@pytest.mark.slow
def test_orchard_eval_pool_claims_task_sandboxes(sandbox_home, tmp_path, monkeypatch):
    """`run_eval(pool=2)` (`orchard eval --pool 2`): the oracle resolves two swe-mini tasks, their sandboxes
    (agent's and grader's) claimed from the run's pools, and nothing is left running."""
    from orchard.eval.models import eval_gateway_config
    from orchard.eval.runner import run_eval
    from orchard.sandbox.server.home import state_db_path
    from orchard.sandbox.server.store import SandboxStore

    monkeypatch.setenv("ORCHARD_HOME", str(sandbox_home))
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    tasks = ["orchard__pagekit-112", "orchard__logstamp-57"]
    results = asyncio.run(run_eval(harness="react", model="oracle", suite="swe-mini", out_dir=tmp_path / "run",
                                   gateway_config=eval_gateway_config("oracle"), task_ids=tasks, parallel=2, pool=2))
    assert results.summary.resolve_rate == 1.0 and results.summary.errors == 0
    assert asyncio.run(live_sandbox_ids(sandbox_home)) == set()
    store = SandboxStore(state_db_path(sandbox_home))
    try:
        used = [r.info for r in store.list(states=("deleted",)) if r.info.pool and not r.info.pool.idle]
    finally:
        store.close()
    assert sum(info.pool.claimed for info in used) >= 2, [info.pool for info in used]
    with pytest.raises(InvalidRequest, match="--pool"):
        asyncio.run(run_eval(harness="react", model="oracle", suite="swe-mini", out_dir=tmp_path / "remote",
                             gateway_config=eval_gateway_config("oracle"), task_ids=tasks,
                             orchard_url="http://127.0.0.1:9", pool=2))


def test_a_pool_the_orchestrator_cannot_run_is_refused_up_front(sandbox_home):
    from orchard.sandbox.server.spec_limits import SpecLimits

    with pytest.raises(InvalidRequest, match="pool big: memory_mb=4096 is over"):
        SandboxService.embedded(sandbox_home, limits=SpecLimits(memory_mb=1024),
                                pools=[PoolSpec(name="big", spec=SandboxSpec(memory_mb=4096))])
