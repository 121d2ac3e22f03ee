"""Local backends side by side on one machine (two orchestrators, two users' homes, tests running in
parallel): the cleanup one does after crashes never touches what another makes. Real sandboxes, real
cgroups; two LocalBackend instances with different root and run directories in one process stand for two
orchestrators (the cgroups both use are beneath this process's own, as they would be for two services
started side by side)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchard.core.backend import BackendSandbox
from orchard.core.sandbox import NetworkPolicy, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local import cgroups, netns as local_netns
from orchard.sandbox.backends.local import LocalBackend
from tests.local_backend_rig import local_backend
from tests.test_local_allowlist import host_address, leftovers, reaches, tcp_server


@pytest.fixture
async def pair(tmp_path, bundle_cache):
    async with local_backend(tmp_path / "a" / "sandboxes", run_dir=tmp_path / "a" / "run",
                             bundle_cache_dir=bundle_cache) as a, \
            local_backend(tmp_path / "b" / "sandboxes", run_dir=tmp_path / "b" / "run",
                          bundle_cache_dir=bundle_cache) as b:
        yield [a, b]


def _groups_of(backend: LocalBackend, sandbox_id: str) -> list[Path]:
    return [group for group, _, _ in cgroups.placements(backend._key(sandbox_id))]


async def test_another_backends_sweep_never_removes_the_groups_of_a_create_in_progress(pair):
    """The state of a create between making its groups and moving its first process in: empty groups and
    a run dir. The other backend's sweep for abandoned groups must leave them; their owner's own sweep
    removes them once their run dir is gone (what a crash that lost the sandbox's state leaves)."""
    a, b = pair
    a._ensure_run_base()
    run_dir = a._paths("inflight").run_dir
    run_dir.mkdir()
    made = cgroups.create_cgroups(a._key("inflight"), SandboxSpec(memory_mb=64))
    assert made is not None, "this test needs writable cgroups (run as root)"
    try:
        assert await b.list_live() == []
        assert all(Path(p).is_dir() for p in made.paths), "another backend removed a create's cgroups"
        run_dir.rmdir()
        assert await a.list_live() == []
        assert not any(group.exists() for group in _groups_of(a, "inflight")), "its owner left them"
    finally:
        cgroups.remove_cgroups(made.paths)


async def test_groups_of_the_earlier_key_layout_are_left_to_their_sandboxs_delete(pair):
    """Groups named by the key before it named its owner (what an earlier version's create interrupted
    before recording its groups left): no sweep takes them, whoever's they are; the delete of their
    sandbox, found by id in its root, does."""
    a, b = pair
    (a.root_dir / "old").mkdir(parents=True)  # an unrecorded sandbox dir, young: no sweep deletes it
    made = cgroups.create_cgroups(a._legacy_key("old"), SandboxSpec(memory_mb=64))
    assert made is not None, "this test needs writable cgroups (run as root)"
    try:
        assert await b.list_live() == [] and await a.list_live() == []
        assert all(Path(p).is_dir() for p in made.paths), "a sweep removed a group it cannot tell is its own"
        await a.delete(BackendSandbox(id="old", agent_url=""))
        assert not any(Path(p).exists() for p in made.paths)
        assert not (a.root_dir / "old").exists()
    finally:
        cgroups.remove_cgroups(made.paths)


async def test_creates_succeed_while_another_backend_sweeps(pair):
    """Many concurrent creates on one backend while the other lists (and sweeps) in a loop: every create
    succeeds and every sandbox keeps its groups."""
    a, b = pair
    stop = asyncio.Event()
    sweeps = 0

    async def sweep() -> None:
        nonlocal sweeps
        while not stop.is_set():
            assert await b.list_live() == []
            sweeps += 1
            await asyncio.sleep(0)

    sweeper = asyncio.create_task(sweep())
    try:
        made = await asyncio.gather(*(a.create(f"c{i}", SandboxSpec(memory_mb=128, max_processes=64), "tok")
                                      for i in range(8)), return_exceptions=True)
    finally:
        stop.set()
        await sweeper
    failed = [m for m in made if isinstance(m, BaseException)]
    assert not failed, failed
    assert sweeps > 0
    for sb in made:
        assert sb.handle["cgroups"] and all(Path(g).is_dir() for g in sb.handle["cgroups"])
    assert sorted(s.id for s in await a.list_live()) == sorted(sb.id for sb in made)


@pytest.mark.skipif(local_netns.unavailable_reason() is not None, reason=local_netns.unavailable_reason() or "")
async def test_another_backends_network_cleanup_leaves_a_live_allowlist(pair):
    """The allowlist's interfaces and nftables rules are shared by the whole machine: another backend's
    sweep (`clean_orphans`) and the delete of its own allowlisted sandbox (the last of its own, which
    removes the table when no interface is left) keep a live sandbox's interface, rules and reach."""
    a, b = pair
    with tcp_server(host_address()) as port:
        spec = SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=[f"{host_address()}:{port}"]))
        sb = await a.create("net-a", spec, "tok")
        agent = AgentSandbox("net-a", sb.agent_url, "tok")
        try:
            assert await reaches(agent, host_address(), port)
            others = await b.create("net-b", spec, "tok")
            assert [s.id for s in await b.list_live()] == [others.id]
            await b.delete(others)
            assert await b.list_live() == []
            assert len(leftovers(a, sb)) == 2, "another backend removed a live sandbox's network"
            assert await reaches(agent, host_address(), port)
        finally:
            await agent.close()
            await a.delete(sb)
        assert leftovers(a, sb) == []
