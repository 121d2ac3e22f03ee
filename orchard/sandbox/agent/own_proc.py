"""The agent's own /proc: its status and its commands' processes, with pids as the agent sees them.

Once the workload has a pid namespace of its own (pidns.py), its init mounts that namespace's /proc over
/proc, where the agent has no pid; pidns.py keeps the agent's /proc open here first (`FD`), and every
read of the agent's own goes through these functions. Its own module because identity.py reads the
agent's status through it while pidns.py, which sets `FD`, is built on identity.py."""

from __future__ import annotations

import os

FD = None  # the agent's /proc, opened before /proc shows the workload's namespace (None: /proc is its own)


def open_proc(relative: str, mode: str = "r"):
    """A file of the agent's /proc (`self/status`, `<pid>/stat`), with pids as the agent sees them."""
    if FD is None:
        return open("/proc/" + relative, mode)
    return open(relative, mode, opener=lambda path, flags: os.open(path, flags, dir_fd=FD))


def listdir_proc():
    return os.listdir("/proc" if FD is None else FD)


def readlink_proc(relative: str) -> str:
    if FD is None:
        return os.readlink("/proc/" + relative)
    return os.readlink(relative, dir_fd=FD)
