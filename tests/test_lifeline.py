"""Embedded sandboxes end with the process that owns them, even when it is SIGKILLed (orchard/sandbox/lifeline.py):
a real process makes real sandboxes on the local backend, running a command of their own, and is killed with
SIGKILL; with no other Orchard process started on that home, every process of the sandboxes ends and nothing of
theirs is left (cgroups, mounts, directories, the watcher itself)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from orchard.sandbox.backends.local.state import read_record
from orchard.sandbox.client import AsyncOrchard

OWNER = textwrap.dedent("""
    import asyncio, sys
    from orchard.sandbox.client import AsyncOrchard

    async def main():
        orch = AsyncOrchard(home=sys.argv[1])
        made = [await orch.create(image="host") for _ in range(2)]
        for sandbox in made:
            await sandbox.exec("nohup sleep 1000 >/dev/null 2>&1 &")
        print(" ".join(sandbox.id for sandbox in made), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def _watchers_of(owner: int) -> list[int]:
    """The lifeline watchers started for process `owner` (found by their command line)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"orchard.sandbox.lifeline" in argv and str(owner).encode() in argv:
            found.append(int(entry))
    return found


def _wait_until(condition, what: str, bound_s: float = 120.0) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"still there after {bound_s:g} s: {what}"
        time.sleep(0.2)


def test_sigkill_of_the_owner_ends_its_embedded_sandboxes_and_leaves_nothing(sandbox_home):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(sandbox_home)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "ORCHARD_HOME": str(sandbox_home)}, start_new_session=True)
    try:
        ids = owner.stdout.readline().split()
        assert len(ids) == 2, "the owner did not make its sandboxes"
        handles = [read_record(sandbox_home / "sandboxes" / sandbox_id / "meta.json").handle for sandbox_id in ids]
        pids = [pid for handle in handles for pid in (handle.pid, handle.init_pid, handle.agent_pid) if pid]
        assert all(_alive(pid) for pid in pids)
        watchers = _watchers_of(owner.pid)
        assert len(watchers) == 1
        os.killpg(owner.pid, signal.SIGKILL)  # the owner's whole process group, as `kill -9` of a job does
        # Not reaped yet: a zombie owner has ended all the same.
        _wait_until(lambda: not any(_alive(pid) for pid in pids), "the sandboxes' processes")
        _wait_until(lambda: not any(_alive(pid) for pid in watchers), "the lifeline watcher")
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(30)
    assert handles and all(handle.cgroups for handle in handles), "this test needs cgroups (run as root)"
    for handle in handles:  # a cgroup is removed only once no process is left in it (the sandbox's command too)
        assert not any(Path(group).exists() for group in handle.cgroups), "a sandbox's cgroup was left"
        assert not Path(handle.sandbox_dir).exists() and not Path(handle.run_dir).exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert not any(handle.sandbox_dir in mounts or handle.run_dir in mounts for handle in handles)
    assert not any(sandbox_id in mounts for sandbox_id in ids)
    assert not list((sandbox_home / "sandboxes").iterdir())


async def test_a_client_that_closes_ends_its_watcher_with_nothing_to_do(sandbox_home):
    async with AsyncOrchard(home=sandbox_home) as orch:
        sandbox = await orch.create(image="host")
        assert (await sandbox.exec("echo hi")).stdout == "hi\n"
        (watcher,) = _watchers_of(os.getpid())
    assert not _alive(watcher), "the watcher outlived its client's close"
    assert not (sandbox_home / "lifeline.log").exists()
    await asyncio.sleep(0)
