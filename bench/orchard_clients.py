"""Orchard clients for the bench: embedded (the default, no server), each with a private state home in a
temporary directory, so a bench run neither sees nor leaves state of other runs. Closing the client
deletes every sandbox it created, which the `with` blocks guarantee on errors and Ctrl-C too."""

from __future__ import annotations

import tempfile
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import AsyncIterator, Iterator

from bench.memory import PeakGrowth
from bench.processes import read_status_kib
from orchard.sandbox.backends.local.state import children_of, read_record
from orchard.sandbox.backends.registry import backend_config
from orchard.sandbox.client import AsyncOrchard, Orchard

# id of an embedded client -> its state home (where the local backend keeps each sandbox's meta.json)
_homes: dict[int, Path] = {}

_HOME_PREFIX = "orchard-bench-"


@contextmanager
def embedded_orchard(**local_options) -> Iterator[Orchard]:
    """`local_options`: LocalConfig fields (e.g. zygote=True) on top of the home's defaults."""
    with tempfile.TemporaryDirectory(prefix=_HOME_PREFIX) as home, \
            Orchard(home=home, backend=backend_config("local", Path(home), **local_options)
                    if local_options else None) as orchard:
        _homes[id(orchard)] = Path(home)
        try:
            yield orchard
        finally:
            _homes.pop(id(orchard), None)


@asynccontextmanager
async def embedded_async_orchard() -> AsyncIterator[AsyncOrchard]:
    with tempfile.TemporaryDirectory(prefix=_HOME_PREFIX) as home:
        async with AsyncOrchard(home=home) as orchard:
            yield orchard


def checked_exec(sandbox, command: str) -> str:
    result = sandbox.exec(command)
    if result.exit_code != 0:
        raise RuntimeError(f"`{command}` failed in sandbox {sandbox.id}: exit {result.exit_code}, "
                           f"{result.stderr.strip()}")
    return result.stdout


def agent_host_pid(orchard: Orchard, sandbox) -> int:
    """The agent's host pid: the one child of the sandbox's init, which the local backend records in the
    sandbox's `meta.json` under the client's home. (The workload cannot see its agent: commands run in a
    pid namespace of their own, so the agent is read from the host.)"""
    record = read_record(_homes[id(orchard)] / "sandboxes" / sandbox.id / "meta.json")
    if record is not None and record.handle.agent_pid:  # forked by the agent zygote: recorded as such
        return record.handle.agent_pid
    init_pid = record.handle.init_pid if record else None
    children = children_of(init_pid) if init_pid else []
    if len(children) != 1:
        raise RuntimeError(f"cannot find the agent of sandbox {sandbox.id}: its init {init_pid} has children "
                           f"{children}")
    return children[0]


def agent_memory(orchard: Orchard, sandbox) -> PeakGrowth:
    """The agent's VmRSS/VmHWM, read from the host."""
    status = Path(f"/proc/{agent_host_pid(orchard, sandbox)}")

    def read(field: str) -> int:
        return read_status_kib((status / "status").read_text(), field)

    def reset() -> bool:
        try:
            (status / "clear_refs").write_text("5")
            return True
        except OSError:
            return False

    return PeakGrowth(read, reset)


async def time_agent_execs(sandbox, count: int, warmup: int = 10) -> list[float]:
    """Seconds of each `exec(["true"])` on `sandbox` (an AgentSandbox on a keep-alive connection), after
    `warmup` untimed ones; a failing `true` is an error, never a figure."""
    import time

    timings: list[float] = []
    for index in range(warmup + count):
        started = time.perf_counter()
        result = await sandbox.exec(["true"])
        if index >= warmup:
            timings.append(time.perf_counter() - started)
        if result.exit_code != 0:
            raise RuntimeError(f"`true` failed in the benchmark sandbox: {result}")
    return timings
