"""Spares of the local backend (root, with the agent zygote, on cgroup v1: local/spares.py): a create that
takes one starts its sandbox from processes that were in its cgroups before it began, under its own key
and with its spec's limits; a create that fails on one, a closed backend and a killed one leave nothing.

Real sandboxes, bwrap, zygote and cgroups."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local import cgroups
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.local.spares import SPARE_INFIX
from orchard.sandbox.backends.local.state import process_running, process_start_time
from tests.local_backend_rig import cgroup_v1_only, running, shut_down


pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="spares go with the zygote, which root uses"),
              pytest.mark.skipif(not cgroup_v1_only(), reason="spares need cgroup v1 (cgroup2 renames no group)")]

LIMIT_FILES = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "pids.max", "cpu.cfs_quota_us",
               "cpu.cfs_period_us")


def new_backend(tmp_path: Path, short_tmp: Path, bundle_cache: Path, name: str = "root",
                spares: int = 1) -> LocalBackend:
    """Its sockets under `short_tmp` (a socket path holds 107 bytes)."""
    return LocalBackend(tmp_path / name, run_dir=short_tmp / name, bundle_cache_dir=bundle_cache, spares=spares)


@pytest.fixture
async def backend(tmp_path, short_tmp, bundle_cache):
    made = new_backend(tmp_path, short_tmp, bundle_cache)
    yield made
    await shut_down(made)


async def spare_made(backend: LocalBackend) -> set[str]:
    """The keys of the backend's ready spares, once it has one (after its first create)."""
    deadline = time.monotonic() + 10
    while not backend._spares._ready:
        assert backend._spares.off_reason is None, f"spares were turned off: {backend._spares.off_reason}"
        assert time.monotonic() < deadline, "no spare was made after a create"
        await asyncio.sleep(0.02)
    return backend._spares.names()


def boot_ticks() -> int:
    """Now, in the unit of /proc/PID/stat's start time (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def processes_in(groups: list[str]) -> set[int]:
    return cgroups.cgroup_pids(groups)


def spare_groups(backend: LocalBackend) -> list[str]:
    """Every group of the backend's spares on the host (found by name, whoever made them)."""
    found = []
    for group, _, _ in cgroups.placements("probe"):
        with contextlib.suppress(OSError):
            found += [str(g) for g in group.parent.iterdir()
                      if g.is_dir() and g.name.startswith(f"{backend.owner}-{SPARE_INFIX}")]
    return found


async def test_a_create_starts_from_the_spare_made_after_the_create_before(backend):
    async with running(backend):
        pass
    taken = await spare_made(backend)
    await asyncio.sleep(0.05)  # past a clock tick: the spare's shell began before the create below
    began = boot_ticks()
    async with running(backend) as (sb, agent):
        assert process_start_time(sb.handle["pid"]) < began, "bwrap was not the spare's shell"
        key = backend._key(sb.id)
        assert sb.handle["cgroups"] and all(f"/orchard/{key}" in g for g in sb.handle["cgroups"])
        inside = processes_in(sb.handle["cgroups"])
        assert {sb.handle["pid"], sb.handle["init_pid"], sb.handle["agent_pid"]} <= inside
        result = await agent.exec("cat /proc/self/cgroup; echo ok")
        assert result.exit_code == 0 and result.stdout.endswith("ok\n")
        assert SPARE_INFIX not in result.stdout  # the commands' groups carry the sandbox's name
    assert not taken & await spare_made(backend)  # the next create's, made since under a name of its own


@pytest.mark.parametrize("spec", [SandboxSpec(memory_mb=200, max_processes=50, cpu=0.5),
                                  SandboxSpec(max_processes=None)], ids=["limits", "none"])
async def test_a_spares_sandbox_has_the_limits_of_one_made_without(tmp_path, short_tmp, bundle_cache, backend, spec):
    """The same spec on a backend without spares: every limit file of every group reads the same (a spec
    without limits finds none left on the spare's groups)."""
    without = new_backend(tmp_path, short_tmp, bundle_cache, "plain", spares=0)
    try:
        async with running(backend):
            pass
        await spare_made(backend)
        await asyncio.sleep(0.05)  # past a clock tick: the spare's shell began before the create below
        async with running(backend, spec) as (sb, _), running(without, spec) as (plain, _):
            assert process_start_time(sb.handle["pid"]) < process_start_time(plain.handle["pid"])

            def limits(groups: list[str], key: str) -> dict[str, str]:
                read = {}
                for group in groups:
                    for name in LIMIT_FILES:
                        with contextlib.suppress(OSError):
                            read[f"{group.split(key, 1)[1]}:{name}"] = Path(group, name).read_text().strip()
                return read

            ours = limits(sb.handle["cgroups"], backend._key(sb.id))
            assert ours == limits(plain.handle["cgroups"], without._key(plain.id))
            assert ours["/workload:pids.max"] == str(spec.max_processes or "max")
            if spec.memory_mb:
                assert ours["/workload:memory.limit_in_bytes"] == str(spec.memory_mb << 20)
    finally:
        await without.close()


async def test_a_limit_refused_on_a_spare_fails_the_create_and_leaves_nothing(backend):
    async with running(backend):
        pass
    await spare_made(backend)
    spare = backend._spares._ready[0]
    taken = processes_in(spare.groups.paths)
    assert len(taken) == 2  # its shell and the zygote's parked child
    with pytest.raises(InvalidRequest, match="max_processes=100000000 cannot be enforced"):
        await backend.create("refused", SandboxSpec(max_processes=10 ** 8), "token")
    assert not any(process_running(pid, process_start_time(pid)) for pid in taken)
    assert not cgroups.existing_groups(backend._key("refused")) and not Path(spare.groups.paths[0]).exists()
    assert not (backend.root_dir / "refused").exists() and not (backend.run_base / backend._key("refused")).exists()
    async with running(backend) as (_, agent):  # the next create works (on the spare made since)
        assert (await agent.exec("true")).exit_code == 0


async def test_close_ends_the_spares_and_removes_their_groups(tmp_path, short_tmp, bundle_cache):
    backend = new_backend(tmp_path, short_tmp, bundle_cache)
    try:
        async with running(backend):
            pass
        await spare_made(backend)
        groups = spare_groups(backend)
        members = processes_in(groups)
        assert groups and len(members) == 2
    finally:
        await backend.close()
    assert not spare_groups(backend)
    assert not any(Path(f"/proc/{pid}").exists() for pid in members)


async def test_a_spare_of_a_stopped_zygote_is_not_used(backend):
    """A zygote that died takes its parked children's use with it: the next create discards the spare
    and starts a new zygote."""
    async with running(backend):
        pass
    keys = await spare_made(backend)
    backend._zygote.process.kill()
    backend._zygote.process.wait()
    async with running(backend) as (sb, agent):
        assert (await agent.exec("true")).exit_code == 0
        assert all(key not in g for key in keys for g in sb.handle["cgroups"] + spare_groups(backend))


KILLED_BACKEND = """
import asyncio, sys, time
from pathlib import Path
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local import LocalBackend

async def main():
    backend = LocalBackend(Path(sys.argv[1]), run_dir=Path(sys.argv[2]), bundle_cache_dir=Path(sys.argv[3]))
    sb = await backend.create("first", SandboxSpec(), "token")
    await backend.delete(sb)
    while not backend._spares._ready:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_the_spare_of_a_killed_backend_ends_and_its_groups_are_swept(tmp_path, short_tmp, bundle_cache):
    """SIGKILL leaves no close: the spare's shell and parked child read end of file and exit, and the next
    backend on the same directories removes the groups they leave empty."""
    root, run = tmp_path / "root", short_tmp / "root"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BACKEND, str(root), str(run), str(bundle_cache)],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    try:
        assert proc.stdout.readline() == "ready\n"
        successor = new_backend(tmp_path, short_tmp, bundle_cache)
        groups = spare_groups(successor)
        assert groups and len(processes_in(groups)) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while processes_in(groups):
        assert time.monotonic() < deadline, f"the spare's processes outlived their backend: {processes_in(groups)}"
        await asyncio.sleep(0.02)
    try:
        assert await successor.list_live() == []
        assert not spare_groups(successor)
    finally:
        await successor.close()


async def test_a_create_refused_before_its_cgroups_leaves_the_spare_for_the_next(backend):
    """An id taken already is refused before the spare is touched: the spare stays, and serves the next."""
    async with running(backend) as (sb, _):
        keys = await spare_made(backend)
        with pytest.raises(InvalidRequest, match="already exists"):
            await backend.create(sb.id, SandboxSpec(), "token")
        assert backend._spares.names() == keys and len(processes_in(spare_groups(backend))) == 2


UNCLOSED_BACKEND = """
import asyncio, sys
from pathlib import Path
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local import LocalBackend

kept = []

async def main(name):
    backend = LocalBackend(Path(sys.argv[1]) / name, run_dir=Path(sys.argv[2]) / name,
                           bundle_cache_dir=Path(sys.argv[3]))
    sb = await backend.create("first", SandboxSpec(), "token")
    await backend.delete(sb)
    while not backend._spares._ready:
        await asyncio.sleep(0.01)
    print(backend._spares.names().pop(), flush=True)
    if name == "kept":
        kept.append(backend)

asyncio.run(main("dropped"))  # collected with its spare on the way out of main
asyncio.run(main("kept"))  # alive until the interpreter exits
"""


def test_the_spares_of_a_backend_never_closed_go_with_it(tmp_path, short_tmp, bundle_cache):
    """A backend dropped without close() (collected), or alive at exit, takes its spare's groups along."""
    done = subprocess.run([sys.executable, "-c", UNCLOSED_BACKEND, str(tmp_path), str(short_tmp), str(bundle_cache)],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent, timeout=60)
    keys = done.stdout.split()
    assert done.returncode == 0 and len(keys) == 2, done.stderr[-2000:]
    assert not [g for key in keys for g in cgroups.existing_groups(key)]
