"""The local backend's agent zygote (root only): agents forked from one pre-started interpreter into their
sandboxes must be indistinguishable, from inside and from the host, from agents bwrap started, and a
failure on that path must leave nothing behind.

Real sandboxes, real bwrap, the real zygote; each check compares against a sandbox made the classic way
on the same backend settings. (The isolation suites run on the zygote, root's default.)"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

import pytest

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local import zygote as local_zygote
from orchard.sandbox.backends.local.bwrap import agent_env
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.local.state import children_of, process_running
from orchard.sandbox.backends.local.config import ZYGOTE_ENV
from orchard.sandbox.backends.local.zygote import ENV_AREA_NAME, zygote_wanted
from tests import local_backend_rig as rig

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the zygote is used by root only")

# What a workload sees of itself and its agent: ids, capabilities, namespaces' pid view, environment.
PROBE = ("id -u; id -g; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; echo ---; "
         "cat /proc/1/cmdline | tr '\\0' ' '; echo; echo ---; env | sort | grep -v -E '^(PWD|SHLVL|_)='; "
         "echo ---; cat /proc/self/cgroup")


@pytest.fixture
async def backends(tmp_path, bundle_cache):
    async with contextlib.AsyncExitStack() as stack:
        made = {}
        for kind in ("classic", "zygote"):
            made[kind] = await stack.enter_async_context(
                rig.local_backend(tmp_path / kind, bundle_cache_dir=bundle_cache, zygote=kind == "zygote"))
        yield made


@contextlib.asynccontextmanager
async def running(backend: LocalBackend, spec: SandboxSpec | None = None):
    """The rig's sandbox; after its delete neither its init nor its agent runs."""
    async with rig.running(backend, spec) as (sb, agent):
        yield sb, agent
    assert not process_running(sb.handle["init_pid"], sb.handle["init_start"])
    if sb.handle.get("agent_pid"):
        assert not Path(f"/proc/{sb.handle['agent_pid']}/ns").exists() or \
            Path(f"/proc/{sb.handle['agent_pid']}/status").read_text().count("State:\tZ")


def agent_fds(sb) -> list[str]:
    """What the agent's descriptors are, seen from the host: kinds (socket, pipe) and file names."""
    pid = sb.handle.get("agent_pid") or children_of(sb.handle["init_pid"])[0]
    kinds = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{n}")
            kinds.append(target.split(":")[0] if ":[" in target else Path(target).name)
    return sorted(kinds)


def cgroup_relative(text: str) -> str:
    """The sandbox's cgroup line without its per-sandbox key."""
    return "".join(ch for ch in text if not ch.isdigit() and ch not in "abcdef")


async def test_a_zygote_agent_looks_from_inside_like_one_bwrap_started(backends):
    spec = SandboxSpec(env={"SEED": "7"}, memory_mb=256, max_processes=64)
    seen = {}
    for kind, backend in backends.items():
        async with running(backend, spec) as (sb, agent):
            assert (sb.handle.get("agent_pid") is not None) == (kind == "zygote")
            r = await agent.exec(PROBE)
            assert r.ok, r
            seen[kind] = r.stdout.split("---\n")
            seen[kind + " fds"] = agent_fds(sb)
            health = await agent.health() if hasattr(agent, "health") else None
            if isinstance(health, dict):
                assert health.get("workload_pid_namespace") == "separate"
    (ids, init, env, groups), (zids, zinit, zenv, zgroups) = seen["classic"], seen["zygote"]
    assert ids == zids  # uid and gid, no capability at all, no_new_privs
    assert zinit.startswith("/.orchard/") and "agent-bundle" not in zinit, zinit  # no host path shows
    assert env == zenv
    assert cgroup_relative(groups) == cgroup_relative(zgroups)
    # None of the zygote's own descriptors (its socket to the backend, its stdout) reaches the agent: it
    # holds nothing a classic agent does not (which also inherits bwrap's pipe for the user id maps).
    extra = Counter(seen["zygote fds"]) - Counter(seen["classic fds"])
    assert not extra, (extra, seen["classic fds"], seen["zygote fds"])


async def test_a_zygote_agent_is_limited_and_checks_its_token(backends):
    backend = backends["zygote"]
    async with running(backend, SandboxSpec(max_processes=32)) as (sb, agent):
        agent_pid = sb.handle["agent_pid"]
        groups = {Path(g).name for g in sb.handle["cgroups"]}
        in_groups = Path(f"/proc/{agent_pid}/cgroup").read_text()
        assert any(key in in_groups for key in groups), (groups, in_groups)
        bomb = await agent.exec("for i in $(seq 64); do sleep 5 & done 2>&1 | tail -1; echo done", timeout=60)
        assert "done" in bomb.stdout and ("fork" in bomb.stdout + bomb.stderr
                                           or "Resource" in bomb.stdout + bomb.stderr), bomb
        wrong = AgentSandbox(sb.id, sb.agent_url, "not-the-token")
        with pytest.raises(Exception, match="401|token"):
            await wrong.exec("true")
        await wrong.close()


async def test_a_failure_on_the_zygote_path_leaves_nothing_and_the_next_create_works(backends, monkeypatch):
    backend = backends["zygote"]
    real = local_zygote.agent_request

    def broken(**kwargs):
        return {**real(**kwargs), "cwd": "/no/such/dir"}

    monkeypatch.setattr(local_zygote, "agent_request", broken)
    with pytest.raises(BackendError, match="could not start in the sandbox|exited before"):
        await backend.create("broken", SandboxSpec(), "tok")
    assert list(backend.root_dir.iterdir()) == []
    assert not (backend.run_base / backend._key("broken")).exists()
    monkeypatch.setattr(local_zygote, "agent_request", real)
    async with running(backend) as (_, agent):
        assert (await agent.exec("echo fine")).stdout == "fine\n"


async def test_sandboxes_outlive_the_zygote_and_a_new_one_replaces_it(backends):
    backend = backends["zygote"]
    async with running(backend) as (_, first):
        zygote = backend._zygote
        assert zygote is not None and zygote.alive()
        await backend.close()
        assert not zygote.alive()
        assert (await first.exec("echo alive")).stdout == "alive\n"
        async with running(backend) as (_, second):
            assert backend._zygote is not zygote and backend._zygote.alive()
            assert (await second.exec("echo second")).stdout == "second\n"


def environ_of(pid: int) -> dict[str, str]:
    data = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in data.decode().split("\0") if "=" in entry)


async def test_from_the_host_its_processes_show_the_sandboxs_environment_and_commands_rank_first_for_oom(
        backends):
    """/proc/PID/environ of the agent, its spawner and the workload's init is the agent's own environment
    (never the spec's, which its commands get) with either kind (the zygote points its forks' environment
    area at it), and the zygote's own holds
    nothing of the orchestrator's. Commands start at oom_score_adj 500 above their spawner's 0 with either
    kind (a zygote agent's spawner opens its own with the uid owning its /proc files)."""
    seen = {}
    for kind, backend in backends.items():
        async with running(backend, SandboxSpec(env={"SEED": "7"}, memory_mb=256)) as (sb, agent):
            r = await agent.exec("cat /proc/self/oom_score_adj /proc/$PPID/comm")
            assert r.stdout.split() == ["500", "orchard-spawner"], (kind, r)
            agent_pid = sb.handle.get("agent_pid") or children_of(sb.handle["init_pid"])[0]
            workload = [p for p in sb.handle["cgroups"] if Path(p).name == "workload"]
            spawner = [int(p) for p in Path(workload[0], "cgroup.procs").read_text().split()]
            children = [int(p) for task in Path(f"/proc/{agent_pid}/task").iterdir()
                        for p in (task / "children").read_text().split()]
            init = [p for p in children if Path(f"/proc/{p}/comm").read_text().strip() == "orchard-init"]
            assert len(spawner) == 1 and len(init) == 1, (spawner, init)
            assert Path(f"/proc/{spawner[0]}/oom_score_adj").read_text().strip() == "0", kind  # (its own)
            assert b"(zygote)" not in Path(f"/proc/{agent_pid}/cmdline").read_bytes()  # ps tells them apart
            seen[kind] = [environ_of(pid) for pid in (agent_pid, spawner[0], init[0])]
            # The agent's own environment (the spec's is its commands' only: docs/security.md, issue 21)
            own = {k: v for k, v in seen[kind][0].items() if k != "PWD"}  # (bwrap and the zygote set PWD)
            assert own == agent_env() and seen[kind][0] == seen[kind][1] == seen[kind][2], kind
            assert (await agent.exec("echo $SEED")).stdout == "7\n"
    assert seen["zygote"] == seen["classic"]
    zygote_env = environ_of(backends["zygote"]._zygote.process.pid)
    assert set(zygote_env) == {"PATH", "LC_ALL", ENV_AREA_NAME}, zygote_env


def test_the_zygote_is_roots_default_and_can_be_turned_off(monkeypatch):
    """Where ids are remapped (root) the zygote is on unless the setting or ORCHARD_LOCAL_ZYGOTE=0 says
    otherwise; without remapping (not root) never."""
    monkeypatch.delenv(ZYGOTE_ENV, raising=False)
    assert zygote_wanted(True, None) and not zygote_wanted(False, None)
    assert not zygote_wanted(True, False) and not zygote_wanted(False, True)
    monkeypatch.setenv(ZYGOTE_ENV, "0")
    assert not zygote_wanted(True, None) and zygote_wanted(True, True)
    monkeypatch.setenv(ZYGOTE_ENV, "1")
    assert zygote_wanted(True, None)


async def test_orchard_local_zygote_0_starts_agents_through_bwrap(tmp_path, bundle_cache, monkeypatch):
    monkeypatch.setenv(ZYGOTE_ENV, "0")
    async with rig.local_backend(tmp_path / "off", bundle_cache_dir=bundle_cache) as backend:
        async with running(backend) as (sb, agent):
            assert sb.handle.get("agent_pid") is None and backend._zygote is None
            assert (await agent.exec("echo bwrap")).stdout == "bwrap\n"
