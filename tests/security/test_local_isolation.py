"""Attacks on the local (bubblewrap) backend's isolation, each performed from inside a real sandbox.

Every test starts real sandboxes (bwrap, namespaces, cgroups, the bundled agent), runs the attack as the
sandbox's workload through the agent, and asserts that it failed and that the sandbox is still usable."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchard.core.errors import OrchardError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.bundle import ensure_agent_bundle
from tests import local_backend_rig as rig

MIB = 1 << 20


# `backend` and `busybox_rootfs` are conftest.py's fixtures.


@contextlib.asynccontextmanager
async def running(backend: LocalBackend, spec: SandboxSpec | None = None):
    """The rig's sandbox; its delete leaves neither its directory nor its run directory."""
    async with rig.running(backend, spec) as (sb, agent):
        yield sb, agent
    assert not Path(sb.handle["sandbox_dir"]).exists() and not Path(sb.handle["run_dir"]).exists()


def host_bytes(path: Path) -> int:
    """Bytes stored under `path` on the host, as the host sees it (not mounts private to a sandbox)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


# What a workload tries: fill every place it might write, 200 MiB each, and report how much each took.
FILL = ("for d in {places}; do dd if=/dev/zero of=$d/fill bs=1M count=200 2>/dev/null; "
        "echo \"$d $(stat -c %s $d/fill 2>/dev/null || echo 0)\"; done")


async def fill(agent: AgentSandbox, places: list[str]) -> dict[str, int]:
    r = await agent.exec(FILL.format(places=" ".join(places)), timeout=120)
    written = {}
    for line in r.stdout.splitlines():
        place, size = line.split()
        written[place] = int(size)
    assert set(written) == set(places), r.stdout + r.stderr
    return written


# ---- item 3 of the issue: nothing the workload writes sits outside its disk quota --------------------------

@pytest.mark.parametrize("image", ["host", "rootfs"])
async def test_disk_quota_covers_every_writable_place(backend, busybox_rootfs, image):
    spec = SandboxSpec(disk_mb=16, image="host" if image == "host" else str(busybox_rootfs))
    places = [spec.workdir, "/tmp", "/run", "/.orchard/run", "/.orchard", "/dev", "/var/tmp", "/"]
    async with running(backend, spec) as (sb, agent):
        written = await fill(agent, places)
        on_disk = {p: n for p, n in written.items() if p not in ("/dev",)}
        # Everything that could be written at all went to the 16 MiB writable layer, all places together.
        assert sum(on_disk.values()) <= 16 * MIB, written
        assert written["/.orchard/run"] == written["/.orchard"] == written["/dev"] == 0, written
        # The host's disk holds none of it: the quota'd layer is a tmpfs private to the sandbox.
        assert host_bytes(Path(sb.handle["sandbox_dir"])) < MIB
        assert host_bytes(Path(sb.handle["run_dir"])) < MIB
        assert (await agent.exec("rm -f /tmp/fill ./fill /run/fill /fill; echo ok")).stdout == "ok\n"


async def test_memory_backed_mounts_are_bounded(backend):
    """/dev/shm is a tmpfs, i.e. host memory: it is size-limited even without a memory cgroup (64 MiB, or a
    quarter of memory_mb), and /tmp and /run are not memory at all but the writable layer."""
    async with running(backend, SandboxSpec(memory_mb=96)) as (_, agent):
        written = await fill(agent, ["/dev/shm"])
        assert written["/dev/shm"] <= 24 * MIB
        # A full /dev/shm leaves the agent (which shares memory_mb) room to answer and run commands.
        r = await agent.exec("python3 -c \"b = bytearray(16 << 20); print('allocated')\"")
        assert r.stdout == "allocated\n", r
        types = (await agent.exec("stat -f -c %T /tmp /run /dev/shm")).stdout.split()
        assert types[:2] != ["tmpfs", "tmpfs"] and types[2] == "tmpfs"
    async with running(backend) as (_, agent):
        assert (await fill(agent, ["/dev/shm"]))["/dev/shm"] <= 64 * MIB
        assert (await agent.exec("echo still-usable")).stdout == "still-usable\n"


async def test_the_agent_socket_is_out_of_the_sandboxs_reach(backend, tmp_path):
    """The socket clients connect to is bound on the host and handed to the agent as a descriptor: the
    sandbox has no path to it, so it can neither fill its directory nor swap it for another socket."""
    async with running(backend) as (sb, agent):
        r = await agent.exec("ls -A /.orchard/run; ln -s /tmp/x /.orchard/run/agent.sock || echo refused; "
                             "cat /.orchard/run/env 2>/dev/null || echo env-closed")
        # env: the commands' environment, read by the agent before it became the workload's user
        assert r.stdout.split() == ["env", "token", "refused", "env-closed"]
        assert sorted(os.listdir(sb.handle["run_dir"])) == ["agent.sock"]
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"


# ---- item 2 of the issue: a host-image sandbox reads host files only as an unprivileged user would -------

@pytest.fixture
def host_secret():
    """A root-only file in a directory anyone may enter, where host-image sandboxes see it (/var/tmp is
    bound into them, unlike /tmp): only the file's own mode protects it."""
    directory = Path(tempfile.mkdtemp(prefix="orchard-secret-", dir="/var/tmp"))
    directory.chmod(0o755)
    secret = directory / "secret.txt"
    secret.write_text("root's secret")
    secret.chmod(0o600)
    yield secret
    shutil.rmtree(directory, ignore_errors=True)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the subordinate id range needs root")


@needs_root
async def test_root_only_host_files_cannot_be_read(backend, host_secret):
    async with running(backend) as (sb, agent):
        assert (await agent.exec("id -u")).stdout == "0\n"  # root inside ...
        attacks = [f"cat {host_secret}", "cat /etc/shadow",
                   # ... but not host root: neither the host's root uid, nor a new user namespace, helps
                   f"python3 -c 'import os; os.setuid(65535); print(open(\"{host_secret}\").read())'",
                   f"unshare --user --map-root-user cat {host_secret}",
                   f"unshare --user --map-user=65535 cat {host_secret}"]
        for attack in attacks:
            r = await agent.exec(attack)
            assert r.exit_code != 0 and "secret" not in r.stdout and "root:" not in r.stdout, (attack, r)
        assert (await agent.exec("grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status")).stdout.split()[1::2] \
            == ["0000000000000000"] * 4
        # ... and on the host its files belong to the subordinate range, not to root.
        await agent.write_file("made-inside.txt", b"x")
        assert (Path(sb.handle["sandbox_dir"]) / "rw" / "workspace" / "made-inside.txt").stat().st_uid == 100000
        # The agent's token is not readable by the workload either.
        assert (await agent.exec("cat /.orchard/run/token")).exit_code != 0


@needs_root
async def test_another_orchard_homes_state_and_workspaces_cannot_be_read(backend, bundle_cache):
    """A second orchestrator's home (its state db holds live agent tokens) lies under the host root that
    this sandbox sees, and no tmpfs cover of this orchestrator hides it: its mode does."""
    other_home = Path(tempfile.mkdtemp(prefix="orchard-other-home-", dir="/var/tmp"))
    other_home.chmod(0o755)  # as a home made by an older Orchard or a lax umask might be
    (other_home / "state.db").write_text("live tokens")
    (other_home / "state.db").chmod(0o644)
    other = LocalBackend(other_home / "sandboxes", bundle_cache_dir=bundle_cache)
    try:
        async with running(other) as (_, victim), running(backend) as (_, agent):
            await victim.write_file("secret.txt", b"the other sandbox's secret")
            await victim.exec("chmod 644 secret.txt")
            for attack in (f"cat {other_home}/state.db", f"ls {other_home}/sandboxes",
                           f"cat {other_home}/sandboxes/*/rw/workspace/secret.txt"):
                r = await agent.exec(attack)
                assert r.exit_code != 0 and "secret" not in r.stdout and "tokens" not in r.stdout, (attack, r)
    finally:
        await other.close()
        shutil.rmtree(other_home, ignore_errors=True)


async def test_ordinary_work_still_runs_as_the_sandbox_root(backend):
    """Writing the workspace, Orchard's own Python with its installed packages, git: as before."""
    async with running(backend) as (_, agent):
        script = (f"set -e; echo data > a.txt; mkdir -p sub && cp a.txt sub/; "
                  f"{sys.executable} -c 'import pydantic, httpx; print(\"imports ok\")'; "
                  f"{sys.executable} -m pytest --version >/dev/null && echo pytest ok; "
                  "git init -q repo && cd repo && echo x > f && git add f && "
                  "git -c user.email=a@b -c user.name=a commit -qm init && git log --oneline | wc -l; "
                  "echo tmp > /tmp/t && cat /tmp/t")
        r = await agent.exec(script, timeout=60)
        assert r.ok, r
        assert r.stdout.split("\n")[:4] == ["imports ok", "pytest ok", "1", "tmp"]
        assert (await agent.read_file("sub/a.txt")) == b"data\n"


# ---- item 7 of the issue: the workload cannot take down or tamper with its own agent ----------------------

# The pids in the workload's /proc whose command line is the agent's (the pattern does not match itself).
AGENT_PIDS = "grep -l 'orchard_[a]gent' /proc/[0-9]*/cmdline | cut -d/ -f3 | sort -n | tr '\\n' ' '"


def host_status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def init_host_pid(sb) -> int:
    """The workload's pid namespace init, as the host sees it: the agent's child named orchard-init."""
    from orchard.sandbox.backends.local.state import children_of

    inits = [pid for pid in children_of(agent_host_pid(sb))
             if Path(f"/proc/{pid}/comm").read_text().strip() == "orchard-init"]
    assert len(inits) == 1, inits
    return inits[0]


async def test_the_workload_cannot_open_its_agents_memory(backend):
    """Nothing of the agent's can be read or traced from the workload: as root's, the agent has no pid in
    the workload's pid namespace (its /proc lists only the namespace's init, a fork of the agent running
    as a uid of its own); either way the agent is non-dumpable (it changed its uid before serving), so
    its /proc files that give its memory, environment and descriptors are closed to the workload."""
    async with running(backend) as (_, agent):
        health = await agent.health()
        separate = health["workload_pid_namespace"] == "separate"
        # The commands' spawner (a fork of the agent too, in the workload's cgroup: test_workload_cgroup.py)
        spawners = (await agent.exec("pgrep -x orchard-spawner")).stdout.split()
        pids = [p for p in (await agent.exec(AGENT_PIDS)).stdout.split() if p not in spawners]
        assert pids == (["1"] if separate else [str(health["pid"])])
        for pid in pids[:1] + spawners:
            for attack in (f"python3 -c \"open('/proc/{pid}/mem', 'r+b')\"", f"cat /proc/{pid}/environ",
                           f"ls -l /proc/{pid}/fd/", f"cat /proc/{pid}/maps"):
                r = await agent.exec(attack)
                assert r.exit_code != 0 and "ermission denied" in r.stderr, (attack, r)
            r = await agent.exec(f"strace -p {pid} -o /dev/null", timeout=30)  # ptrace: refused as well
            assert r.exit_code != 0 and "ermitted" in r.stderr, r
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"


@needs_root
async def test_the_workload_cannot_stop_or_kill_its_agent(backend):
    """The workload shares the agent's uid, but runs in a pid namespace of its own where the agent has no
    pid: kill(2) cannot name it, kill(-1) skips it, and the namespace's init (pid 1, another uid) gets no
    signal from inside. After every attack the agent answers, and was never stopped."""
    async with running(backend) as (sb, agent):
        assert (await agent.health())["workload_pid_namespace"] == "separate"
        agent_pid, init_pid = agent_host_pid(sb), init_host_pid(sb)
        for attack in ("for p in $(" + AGENT_PIDS + "); do kill -STOP $p; kill -KILL $p; done",
                       "kill -STOP -1; kill -CONT -1", "kill -KILL -1", "kill -INT 1; kill -TERM 1",
                       "python3 -c 'import os, signal; os.kill(-1, signal.SIGSTOP); os.kill(-1, signal.SIGCONT)'",
                       "strace -p 1 -o /dev/null || gdb -p 1 -batch || false"):
            try:
                await agent.exec(attack, timeout=30)
            except OrchardError as exc:
                # `kill -KILL -1` also kills the workload's spawner (it lives in the workload), at times
                # before the spawner has answered with the pid of the very command that killed it: that one
                # exec is then an error saying so. The agent itself is untouched (checked below).
                assert "spawner exited while it started the command" in str(exc), (attack, exc)
            assert host_status(agent_pid)["State"].split()[0] in ("S", "R"), attack
            assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n", attack
        assert process_alive(init_pid)
        # The workload's own processes are still its to signal, by the pids it sees.
        r = await agent.exec("sleep 30 & kill -STOP $! && kill -KILL $! && wait $!; echo $?; "
                             "sleep 30 & until pgrep -x sleep >/dev/null; do sleep 0.01; done; "
                             "pkill -x sleep; wait $!; echo $?", timeout=30)
        assert r.stdout == "137\n143\n", r


def has_cap_sys_resource() -> bool:
    return bool(int(host_status(os.getpid())["CapEff"], 16) & (1 << 24))


def process_alive(pid: int) -> bool:
    try:
        return host_status(pid)["State"].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@needs_root
async def test_pids_agree_inside_and_orphans_are_reaped(backend):
    """In the workload's namespace, $$, /proc and ps tell the same pids (its /proc is its own), and what
    a command leaves behind is reaped by the namespace's init, not left a zombie."""
    async with running(backend) as (_, agent):
        r = await agent.exec("echo $$ $(cut -d' ' -f4 /proc/self/stat) $(ps -o ppid= -p $(sh -c 'echo $PPID'))")
        first, ppid, ps_ppid = r.stdout.split()
        assert first == ppid, r
        r = await agent.exec("for i in 1 2 3 4 5; do (sleep 0.1 &); done; sleep 1; "
                             "ps -eo stat=,pid=,comm= | grep '^Z' | wc -l; ps -o user=,comm= -p 1")
        assert r.stdout.split() == ["0", "nobody", "orchard-init"], r
        s = await (await agent.shell("s")).run("echo $$ && sleep 0.1")  # sessions work as before
        assert s.exit_code == 0 and s.output.strip().isdigit()


@needs_root
async def test_when_the_workloads_init_dies_the_sandbox_is_lost(backend):
    """Without its init, nothing can start in the workload's namespace any more (fork fails with ENOMEM):
    the agent then exits, saying why, so the sandbox is seen as lost instead of failing every command."""
    import asyncio

    async with running(backend) as (sb, agent):
        os.kill(init_host_pid(sb), 9)
        for _ in range(100):
            if not await backend.is_alive(sb):
                break
            await asyncio.sleep(0.05)
        assert not await backend.is_alive(sb)
        log = (Path(sb.handle["sandbox_dir"]) / "agent.log").read_text()
        assert "pid namespace init" in log and "exits" in log, log


@needs_root
async def test_without_cap_sys_admin_the_agent_serves_as_before(backend, monkeypatch):
    """Where the agent cannot make a pid namespace (no CAP_SYS_ADMIN, as in a container), it says why
    and serves as before, its commands in its own namespace; /health tells which case it is."""
    from orchard.sandbox.backends.local import bwrap

    monkeypatch.setattr(bwrap, "AGENT_SETUP_CAPS", tuple(c for c in bwrap.AGENT_SETUP_CAPS if c != "CAP_SYS_ADMIN"))
    async with running(backend) as (sb, agent):
        health = await agent.health()
        assert health["workload_pid_namespace"] == "shared"
        assert (await agent.exec(AGENT_PIDS)).stdout.split() == ["1", str(health["pid"])]  # bwrap's, its own
        assert (await agent.exec("echo ok")).stdout == "ok\n"
        s = await (await agent.shell("s")).run("cd /tmp && pwd")
        assert s.output == "/tmp\n"
        log = (Path(sb.handle["sandbox_dir"]) / "agent.log").read_text()
        assert "share the agent's pid namespace (unshare(CLONE_NEWPID): Operation not permitted)" in log, log


@needs_root
async def test_the_workload_cannot_make_the_oom_killer_pick_its_agent(backend):
    """The workload cannot raise the oom_score_adj of any process of the agent's side (the agent has no
    /proc entry it can see; the init's are another uid's), so a memory hog at the sandbox's limit is what
    the OOM killer ends; the agent and the init stay."""
    async with running(backend, SandboxSpec(memory_mb=128)) as (sb, agent):
        init_pid = init_host_pid(sb)
        if has_cap_sys_resource():  # the backend exempts the init from the OOM killer where it can
            assert Path(f"/proc/{init_pid}/oom_score_adj").read_text().strip() == "-1000"
        spawners = (await agent.exec("pgrep -x orchard-spawner")).stdout.split()  # the workload's side
        theirs = [p for p in (await agent.exec(AGENT_PIDS)).stdout.split() if p not in spawners]
        r = await agent.exec("for f in /proc/[0-9]*/oom_score_adj; do echo 1000 > $f 2>/dev/null && echo $f; "
                             "done; true")
        raised = {line.split("/")[2] for line in r.stdout.split()}
        assert raised and not raised & set(theirs), (raised, theirs)  # only its own
        r = await agent.exec("python3 -c 'b = bytearray(400 << 20); print(len(b))'", timeout=120)
        assert r.exit_code == 137, r
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"
        assert process_alive(init_pid)


# ---- item 7 of the issue: the workload cannot take down its agent, nor can token-less clients ---------------

def agent_host_pid(sb) -> int:
    from orchard.sandbox.backends.local.state import children_of

    if sb.handle.get("agent_pid"):  # forked by the zygote: not a child of the sandbox's init
        return sb.handle["agent_pid"]
    pid, = children_of(sb.handle["init_pid"])
    return pid


@pytest.fixture
async def apart_backend(tmp_path, bundle_cache):
    async with rig.local_backend(tmp_path / "apart", bundle_cache_dir=bundle_cache, agent_apart=True) as made:
        yield made


@needs_root
async def test_an_agent_apart_cannot_be_stopped_or_killed_by_its_workload(apart_backend):
    """With `agent_apart`, the agent has a uid of its own (inside 65533, host 165533) that the workload
    (uid 0 inside, with no capabilities) may not signal or trace; the workload's own processes are still
    its to signal, and files the agent writes are still the workload's."""
    async with running(apart_backend) as (_, agent):
        pid = (await agent.health())["pid"]
        for attack in (f"kill -STOP {pid}", f"kill -KILL {pid}", f"kill -STOP 1",
                       f"python3 -c 'import os, signal; os.kill({pid}, signal.SIGSTOP)'",
                       f"strace -p {pid} -o /dev/null || gdb -p {pid} -batch || false"):
            r = await agent.exec(attack, timeout=30)
            assert r.exit_code != 0, (attack, r)
        assert (await agent.exec(f"kill -0 {pid} 2>/dev/null; echo $?")).stdout == "1\n"
        assert (await agent.exec("sleep 30 & kill -STOP $! && kill -KILL $! && echo own-ok")).stdout == "own-ok\n"
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"
        # Files the agent writes for clients are the workload's (uid 0 inside), as they were before.
        await agent.write_file("by-agent.txt", b"x")
        assert (await agent.exec("stat -c %u by-agent.txt && echo y >> by-agent.txt && echo ok")).stdout \
            == "0\nok\n"


async def test_a_huge_max_output_bytes_cannot_exhaust_the_agents_memory(backend):
    """/exec holds output in memory until the command ends: at most 16 MiB per stream, whatever
    max_output_bytes asks (the result says truncated)."""
    async with running(backend, SandboxSpec(memory_mb=256)) as (_, agent):
        r = await agent.exec("head -c 400M /dev/zero", max_output_bytes=1 << 40, timeout=120)
        assert r.exit_code == 0 and r.stdout_truncated and len(r.stdout) == 16 * MIB
        shell = await agent.shell("s")
        s = await shell.run("head -c 400M /dev/zero; echo", max_output_bytes=1 << 40, timeout=120)
        assert s.truncated and len(s.output) <= 16 * MIB + 200
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"


async def test_idle_connections_without_the_token_cannot_lock_clients_out(backend):
    """500 connections that never send a request (from whoever can reach the agent's socket: on the local
    backend the host only, on Kubernetes other Pods): a client with the token is still served, the agent
    holds at most MAX_CONNECTIONS connection threads (an evicted connection counts until its thread has
    ended), and the idle ones are closed after a short timeout instead of holding a thread each forever."""
    import socket as socketlib
    import time

    from orchard.sandbox.agent.server import MAX_CONNECTIONS

    def agent_threads() -> int:
        return int(next(line.split()[1] for line in Path(f"/proc/{agent_host_pid(sb)}/status")
                        .read_text().splitlines() if line.startswith("Threads:")))

    async with running(backend) as (sb, agent):
        path = sb.agent_url.removeprefix("unix://")
        assert (await agent.exec("true")).ok  # the spawner and its threads are up
        # The agent's own threads (accepting, spawner, ...) and the client's kept-alive connection, if any.
        before = agent_threads()
        idle = []
        try:
            for _ in range(500):
                s = socketlib.socket(socketlib.AF_UNIX)
                s.connect(path)
                idle.append(s)
            assert (await agent.exec("echo served")).stdout == "served\n"
            # Bounded by the connection limit, not by the attacker, nor by how soon the threads of the
            # evicted connections get a CPU to end on.
            assert agent_threads() <= MAX_CONNECTIONS + before
            # Each idle connection is closed by the agent (end of input) without ever being answered.
            deadline = time.monotonic() + 60
            for s in idle:
                s.settimeout(max(deadline - time.monotonic(), 0.1))
                assert s.recv(1) == b""
        finally:
            for s in idle:
                s.close()
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"


@needs_root
def test_an_agent_that_cannot_take_its_identity_refuses_to_serve(bundle_cache, tmp_path):
    """Started without the capabilities to switch (here as host root with none), the agent exits with
    status 2 saying why, before listening: it never serves as a user it was not meant to be."""
    bundle = ensure_agent_bundle(bundle_cache)
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o644)
    argv = bundle.launch_argv(listen=f"unix:{tmp_path}/a.sock", workdir=str(tmp_path / "w"),
                              mount_point=str(bundle.path))
    env = {**bundle.launch_env(mount_point=str(bundle.path)), "ORCHARD_AGENT_TOKEN_FILE": str(token)}
    for extra in (["--user", "0:0"], ["--user", "0:0", "--agent-user", "65533:65533"]):
        r = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", *argv, *extra],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "cannot become uid" in r.stderr and r.stdout == "", r
        assert not (tmp_path / "a.sock").exists()


async def test_modules_the_workload_drops_in_its_workdir_never_run_in_the_agent(backend):
    """The agent imports some standard modules only when first needed (tempfile for a file write, tarfile
    for a directory download, traceback on a failure). The workload writes modules of those names into
    the workdir, the directory the agent's interpreter started in, before any of them was imported:
    the agent still imports the standard library's, and none of the workload's code runs in it."""
    async with running(backend) as (_, agent):
        plant = ("for m in tempfile shutil tarfile traceback; do "
                 "echo \"open('/tmp/hijacked-$m', 'w').write('x')\" > $m.py; done; "
                 "mkdir -p tree && echo leaf > tree/leaf")
        assert (await agent.exec(plant)).ok
        await agent.write_file("written.txt", b"by the agent")
        with tempfile.TemporaryDirectory() as local:
            await agent.download("tree", Path(local) / "tree")
            assert (Path(local) / "tree" / "leaf").read_bytes() == b"leaf\n"
        r = await agent.exec("ls /tmp; cat written.txt")
        assert "hijacked" not in r.stdout and r.stdout.endswith("by the agent"), r
