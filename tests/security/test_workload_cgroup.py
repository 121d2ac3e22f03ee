"""The agent apart from its workload's memory and process limits (local backend, root): attacks from inside
real sandboxes (bwrap, namespaces, cgroups, the bundled agent), each checked to fail, the agent still up.

The sandbox's cgroup has an `agent` leaf (where the sandbox starts) and a `workload` leaf with the spec's
limits, where the agent's spawner starts every command (orchard/sandbox/agent/workload_cgroup.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.core.sandbox import SandboxSpec
from tests.security.test_local_isolation import agent_host_pid, needs_root, running  # backend: conftest.py's

# 24 processes of ~15 MiB each (interpreter + 5 MiB) in a 96 MiB workload: the OOM killer must end some.
# Each is smaller than the agent, so with one cgroup for both it is the agent the OOM killer picked
# (SandboxLost) before the split.
FILL = ("for i in $(seq 24); do python3 -c 'import time; b = bytearray(5 << 20); time.sleep(5)' & "
        "pids=\"$pids $!\"; done; for p in $pids; do wait $p; echo $?; done")
SPLIT_LINE = ("memory", "pids")


def leaf_of(cgroup_file: str) -> set[str]:
    """The last path component of the memory and pids groups in a /proc/PID/cgroup text (v1 lines name
    their controller; a v2 line `0::` stands for both)."""
    lines = [line.split(":", 2)[1:] for line in cgroup_file.splitlines()]
    v1 = {path.rsplit("/", 1)[-1] for controllers, path in lines if set(controllers.split(",")) & set(SPLIT_LINE)}
    return v1 or {path.rsplit("/", 1)[-1] for controllers, path in lines if controllers == ""}


@needs_root
@pytest.mark.slow
async def test_a_workload_that_fills_its_memory_cannot_take_its_agent_down(backend):
    """Many processes, each smaller than the agent, fill the workload's memory: the OOM killer ends some
    of them (they exit 137), never the agent or the spawner, and the next command runs."""
    async with running(backend, SandboxSpec(memory_mb=96, max_processes=64)) as (sb, agent):
        assert (await agent.health())["workload_cgroup"] == "separate"
        assert leaf_of((await agent.exec("cat /proc/self/cgroup")).stdout) == {"workload"}
        assert leaf_of(Path(f"/proc/{agent_host_pid(sb)}/cgroup").read_text()) == {"agent"}
        spawner = (await agent.exec("pgrep -x orchard-spawner")).stdout.split()
        r = await agent.exec(FILL, timeout=120)
        statuses = r.stdout.split()
        assert r.exit_code == 0 and len(statuses) == 24 and "137" in statuses, r
        assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"
        assert (await agent.exec("pgrep -x orchard-spawner")).stdout.split() == spawner  # the same one
        # One command past the limit on its own: killed, reported as exit 137.
        r = await agent.exec("python3 -c 'b = bytearray(400 << 20)'", timeout=120)
        assert r.exit_code == 137, r
        assert (await agent.exec("echo next")).stdout == "next\n"


@needs_root
async def test_the_workload_cannot_leave_its_cgroup_or_touch_the_agents(backend):
    """The sandbox's cgroups are in its /sys, read-only and host root's: no command can move itself (or
    anything) into another group, make one, or raise a limit, not even its own."""
    async with running(backend, SandboxSpec(memory_mb=96, max_processes=64)) as (sb, agent):
        groups = [Path(p) for p in sb.handle["cgroups"]]
        targets = [g / "cgroup.procs" for g in groups] + [g / name for g in groups for name in (
            "memory.limit_in_bytes", "memory.max", "pids.max") if (g / name).exists()]
        assert any(g.name == "agent" for g in groups) and any(g.name == "workload" for g in groups)
        for target in targets:
            value = "$$" if target.name == "cgroup.procs" else "max"
            r = await agent.exec(f"echo {value} > {target}")
            assert r.exit_code != 0 and ("Read-only" in r.stderr or "denied" in r.stderr), (target, r)
        r = await agent.exec(f"mkdir {groups[-1]}/escape")
        assert r.exit_code != 0, r
        assert leaf_of((await agent.exec("cat /proc/self/cgroup")).stdout) == {"workload"}


@needs_root
async def test_a_spawner_the_workload_kills_is_replaced(backend):
    """The spawner shares the commands' uid, so the workload can kill or stop it: the command then running
    has no known exit status (reported as killed, saying why), and the next command starts a new spawner,
    still in the workload's cgroup. The agent is untouched."""
    async with running(backend, SandboxSpec(memory_mb=96)) as (sb, agent):
        r = await agent.exec("pkill -KILL -x orchard-spawner; sleep 1; echo unseen")
        assert r.exit_code == 137 and "spawner was killed" in r.stderr, r
        assert (await agent.exec("echo next")).stdout == "next\n"
        assert len((await agent.exec("pgrep -x orchard-spawner")).stdout.split()) == 1
        assert leaf_of((await agent.exec("cat /proc/self/cgroup")).stdout) == {"workload"}
        s = await (await agent.shell("s")).run("cd /tmp && pwd")  # sessions start through it too
        assert s.output == "/tmp\n"
        # Stopped instead: the command's end is seen on its pidfd, the spawner is killed and replaced.
        r = await agent.exec("pkill -STOP -x orchard-spawner; echo unseen")
        assert r.exit_code == 137 and "killed or stopped" in r.stderr, r
        assert (await agent.exec("echo next")).stdout == "next\n"
        r = await agent.exec("ps -o stat= -C orchard-spawner")
        assert len(r.stdout.split()) == 1 and "T" not in r.stdout, r  # one, and not stopped


@needs_root
async def test_where_the_commands_cannot_start_apart_the_agent_shares_their_limits(backend, monkeypatch):
    """Without a pid namespace of the workload's own (no CAP_SYS_ADMIN) there is no spawner: the agent
    moves itself into `workload` before serving, so the spec's limits still bind every command (and the
    agent, as before the split); /health says `shared`."""
    from orchard.sandbox.backends.local import bwrap

    monkeypatch.setattr(bwrap, "AGENT_SETUP_CAPS", tuple(c for c in bwrap.AGENT_SETUP_CAPS if c != "CAP_SYS_ADMIN"))
    async with running(backend, SandboxSpec(memory_mb=96)) as (sb, agent):
        assert (await agent.health())["workload_cgroup"] == "shared"
        assert leaf_of(Path(f"/proc/{agent_host_pid(sb)}/cgroup").read_text()) == {"workload"}
        assert leaf_of((await agent.exec("cat /proc/self/cgroup")).stdout) == {"workload"}
        log = (Path(sb.handle["sandbox_dir"]) / "agent.log").read_text()
        assert "commands share the agent's cgroup (the commands share the agent's pid namespace)" in log, log
