"""How a local sandbox goes: its processes killed so that none is left behind, then its cgroups, its
network allowlist and its directories removed. Safe to repeat, and to run on whatever a create that was
interrupted at any point left, found from the sandbox's handle, its `meta.json` or its directories."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orchard.sandbox.backends.local.cgroups as cgroups
import orchard.sandbox.backends.local.netns as netns
from orchard.core.backend import BackendSandbox
from orchard.core.errors import BackendError
from orchard.sandbox.backends.local.bwrap import SandboxPaths
from orchard.sandbox.backends.local.procs import kill, rmtree, wait_gone
from orchard.sandbox.backends.local.state import LocalHandle, children_of, process_running, read_record


def handle_of(sandbox: BackendSandbox) -> LocalHandle | None:
    try:
        return LocalHandle.model_validate(sandbox.handle)
    except ValueError:
        return None


def handle_from_disk(paths: SandboxPaths) -> LocalHandle | None:
    """The sandbox's handle from its `meta.json`, else one naming only its directories (a create that
    crashed before recording it), else None: nothing of it is there."""
    record = read_record(paths.meta_file)
    if record is not None:
        return record.handle
    if paths.sandbox_dir.exists() or paths.run_dir.exists():
        return LocalHandle(pid=0, pid_start=0, sandbox_dir=str(paths.sandbox_dir),
                           run_dir=str(paths.run_dir), socket=str(paths.socket))
    return None


def destroy(sandbox_id: str, handle: LocalHandle, key: str, legacy_key: str,
            proc: subprocess.Popen | None) -> None:
    """Kill every process, then remove cgroups and files; blocking (short). `key`: the sandbox's (its run
    dir, cgroups and allowlist interface are named by it), `legacy_key` the one before keys named their
    owner; `proc`: bwrap's monitor, where this process started it."""
    # An allowlist's slot that a crash left unrecorded is found by its interface, which dies with the
    # sandbox: look before the kill.
    net_slot = handle.net_slot
    if net_slot is None:
        net_slot = netns.find_slot(key)
    monitor_alive = process_running(handle.pid, handle.pid_start)
    if process_running(handle.init_pid, handle.init_start):
        # SIGKILL to a pid namespace's init kills every process in that namespace.
        kill(handle.init_pid)
    elif monitor_alive:
        # bwrap's report never arrived (crash mid-create): its children are the namespace init, and
        # the monitor may not have got as far as making one.
        for child in children_of(handle.pid):
            kill(child)
        kill(handle.pid)
    if monitor_alive:
        wait_gone(handle.pid, handle.pid_start, proc, timeout=5.0)
    # A create killed before it recorded its groups left them unrecorded: they are found by name.
    left = cgroups.kill_and_remove(handle.cgroups or cgroups.existing_groups(key)
                                   or cgroups.existing_groups(legacy_key))
    if proc is not None and proc.returncode is None:
        proc.wait()
    network_error = None
    try:  # after the kill: nothing of the sandbox runs while its network goes
        netns.detach(key, net_slot)
    except BackendError as e:
        network_error = e
    for path in (handle.run_dir, handle.sandbox_dir):
        rmtree(Path(path))
    if network_error is not None:
        raise BackendError(f"sandbox {sandbox_id}: its network allowlist could not be removed: "
                           f"{network_error}") from network_error
    if left:
        raise BackendError(f"sandbox {sandbox_id}: cgroups {', '.join(left)} could not be removed; "
                           "some process in them did not die — check `cat <group>/cgroup.procs`")
