"""Orchard clients for the bench: embedded (the default, no server), each with a private state home in a
temporary directory, so a bench run neither sees nor leaves state of other runs. Closing the client
deletes every sandbox it created, which the `with` blocks guarantee on errors and Ctrl-C too."""

from __future__ import annotations

import tempfile
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator

import httpx

from bench.memory import PeakGrowth
from bench.processes import read_status_kib
from orchard.sandbox.client import AsyncOrchard, Orchard

_HOME_PREFIX = "orchard-bench-"
_UNIX_PREFIX = "unix://"


@contextmanager
def embedded_orchard() -> Iterator[Orchard]:
    with tempfile.TemporaryDirectory(prefix=_HOME_PREFIX) as home, Orchard(home=home) as orchard:
        yield orchard


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


def agent_pid(orchard: Orchard, sandbox) -> int:
    """The agent's pid inside the sandbox's pid namespace, from its own `/health` answer (which needs no
    token), reached at the address the orchestrator hands out."""
    agent_url = orchard.get(sandbox.id).agent_url
    if agent_url.startswith(_UNIX_PREFIX):
        transport, base_url = httpx.HTTPTransport(uds=agent_url[len(_UNIX_PREFIX):], verify=False), "http://agent"
    else:
        transport, base_url = None, agent_url
    with httpx.Client(transport=transport, base_url=base_url, timeout=30) as client:
        response = client.get("/health")
        response.raise_for_status()
        return int(response.json()["pid"])


def agent_memory(orchard: Orchard, sandbox) -> PeakGrowth:
    """The agent's VmRSS/VmHWM, read from inside its sandbox (its pid is one of that pid namespace)."""
    pid = agent_pid(orchard, sandbox)

    def read(field: str) -> int:
        return read_status_kib(checked_exec(sandbox, f"cat /proc/{pid}/status"), field)

    def reset() -> bool:
        return sandbox.exec(f"echo 5 > /proc/{pid}/clear_refs").exit_code == 0

    return PeakGrowth(read, reset)
