"""The wait of one cgroup move on this host: a process written into a fresh sandbox cgroup's
`cgroup.procs` after a pause with no other move. On a stock kernel the move waits for an RCU grace period
(several ms); with the host-wide `favordynmods` cgroup option it does not (docs/local-backend.md#start-path).
Every create without a spare (docs/local-backend.md#spares) pays one such move, so the figure says which
kind of host its create→ready figure came from."""

from __future__ import annotations

import secrets
import subprocess
import time

from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local import cgroups


def time_cgroup_move(pause_s: float = 0.1) -> float | None:
    """Seconds of one move after `pause_s` without one (by this process); None where no cgroup can be made
    (not root, read-only cgroupfs)."""
    group = cgroups.create_cgroups(f"bench-move-{secrets.token_hex(4)}", SandboxSpec())
    if group is None:
        return None
    proc = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        time.sleep(pause_s)
        started = time.perf_counter()
        with open(group.procs_files[0], "w") as procs:
            procs.write(str(proc.pid))
        return time.perf_counter() - started
    finally:
        proc.kill()
        proc.wait()
        cgroups.kill_and_remove(group.paths)
