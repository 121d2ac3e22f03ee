"""The host's memory in use (MemTotal − MemAvailable), sampled in the background while load runs."""

from __future__ import annotations

import asyncio

from bench.memory import KIB_PER_MB


def host_used_mb() -> float:
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0])
    return (fields["MemTotal"] - fields["MemAvailable"]) / KIB_PER_MB


class HostMemorySampler:
    """`async with HostMemorySampler() as s:` … `s.peak_mb`, `s.baseline_mb`."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.baseline_mb = self.peak_mb = host_used_mb()
        self._task: asyncio.Task | None = None

    async def _sample(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, host_used_mb())
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> "HostMemorySampler":
        self.baseline_mb = self.peak_mb = host_used_mb()
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self.peak_mb = max(self.peak_mb, host_used_mb())
