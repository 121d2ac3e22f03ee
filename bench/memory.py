"""Peak memory growth of a process over a piece of work, from the kernel's own high-water mark: VmHWM is
reset (/proc/PID/clear_refs) before the work and read after it, so no sampling can miss a short peak."""

from __future__ import annotations

import os
from typing import Callable

from bench.processes import proc_status_kib, reset_peak_rss

KIB_PER_MB = 1000 * 1000 / 1024


class PeakGrowth:
    """Reads and resets the VmRSS/VmHWM of a process through two callables, so that the process may be
    on this host (its /proc) or inside a sandbox (read by exec)."""

    def __init__(self, read_status_kib: Callable[[str], int], reset_peak: Callable[[], bool]) -> None:
        self._read = read_status_kib
        self._reset = reset_peak
        self._baseline_kib = 0

    def start(self) -> None:
        self._reset()  # when refused, VmHWM keeps an older peak: the growth reported is then an upper bound
        self._baseline_kib = self._read("VmRSS")

    def growth_mb(self) -> float:
        return max(0, self._read("VmHWM") - self._baseline_kib) / KIB_PER_MB

    def rss_mb(self) -> float:
        return self._read("VmRSS") / KIB_PER_MB

    def peak_mb(self) -> float:
        return self._read("VmHWM") / KIB_PER_MB


def host_process(pid: int | None = None) -> PeakGrowth:
    pid = os.getpid() if pid is None else pid
    return PeakGrowth(lambda field: proc_status_kib(pid, field), lambda: reset_peak_rss(pid))
