"""Which of a spec's limits the local backend can enforce, refusing the rest before anything starts.

Rule: a limit that cannot be enforced is an error at create (`InvalidRequest` naming it and why), never a
silent downgrade. With cgroups every limit is a cgroup setting (see cgroups.py). Without them:
- `memory_mb`: refused. The only rlimit, RLIMIT_AS, bounds each process's address space, not the
  sandbox's memory (N processes get N times the limit).
- `cpu`: refused; no rlimit bounds a share of the CPU.
- `max_processes`: RLIMIT_NPROC (set with `prlimit` on the launching shell, inherited by everything in the
  sandbox) holds when the orchestrator is not root: the kernel refuses a fork once the user has that many
  processes, so the sandbox can never have more (the count includes the user's other processes, so the
  limit is stricter than asked, never weaker). For root it is not enforced at all: refused.
"""

from __future__ import annotations

import os
import shutil

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local.cgroups import CPU_PERIOD_US, CgroupSet

MIN_CPU_QUOTA_US = 1000  # the kernel's smallest CFS quota
MIN_CPU = MIN_CPU_QUOTA_US / CPU_PERIOD_US
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NO_CGROUPS = ("cgroups are not usable by this orchestrator (it needs root or a delegated, writable cgroup "
              "with the memory, pids and cpu controllers)")


def check_cpu_floor(spec: SandboxSpec) -> None:
    """Before anything is made: a CPU share below the smallest quota the kernel takes cannot be enforced."""
    if spec.cpu is not None and spec.cpu < MIN_CPU:
        raise InvalidRequest(f"cpu={spec.cpu:g} cannot be enforced by the local backend: the smallest CPU "
                             f"quota is {MIN_CPU:g} cores ({MIN_CPU_QUOTA_US} us per {CPU_PERIOD_US} us); "
                             f"ask for at least {MIN_CPU:g}")


def require_enforceable(spec: SandboxSpec, cgroups: CgroupSet | None) -> bool:
    """Raise InvalidRequest naming the first limit of `spec` that neither the sandbox's cgroups nor an
    rlimit that holds can enforce. Returns True when RLIMIT_NPROC must stand in for `max_processes`."""
    have = set(cgroups.controllers) if cgroups is not None else set()
    why_not = NO_CGROUPS if cgroups is None else "this machine's cgroups lack the {} controller"
    if spec.memory_mb and "memory" not in have:
        raise InvalidRequest(f"memory_mb={spec.memory_mb} cannot be enforced: {why_not.format('memory')}, and "
                             "no rlimit bounds a sandbox's memory; leave memory_mb unset or run the "
                             "orchestrator where cgroups are writable")
    if spec.cpu and "cpu" not in have:
        raise InvalidRequest(f"cpu={spec.cpu:g} cannot be enforced: {why_not.format('cpu')}; leave cpu unset "
                             "or run the orchestrator where cgroups are writable")
    if spec.max_processes and "pids" not in have:
        if os.geteuid() == 0:
            raise InvalidRequest(
                f"max_processes={spec.max_processes} cannot be enforced: {why_not.format('pids')}, and "
                "RLIMIT_NPROC does not bind root; set max_processes to null (no limit) or run the "
                "orchestrator where cgroups are writable")
        if shutil.which("prlimit", path=HOST_PATH) is None:
            raise InvalidRequest(
                f"max_processes={spec.max_processes} cannot be enforced: {why_not.format('pids')}, and "
                "`prlimit` (util-linux), which sets RLIMIT_NPROC instead, is not installed; install it or "
                "set max_processes to null (no limit)")
        return True
    return False
