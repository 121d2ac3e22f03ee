"""Orchard's own agent started straight on the host, with no sandbox and no orchestrator around it: what
`create → ready` would cost if isolation and bookkeeping were free. It separates the agent's own start
(interpreter + imports) from what the sandbox adds."""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from bench.processes import child_process, read_ready_line
from orchard.sandbox.bundle import AgentBundle, ensure_agent_bundle


@contextmanager
def agent_bundle() -> Iterator[AgentBundle]:
    """The agent bundle (bundled interpreter + agent package), built in a temporary cache."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-bundle-") as cache:
        yield ensure_agent_bundle(Path(cache))


def time_bare_agent_start(bundle: AgentBundle) -> float:
    """Seconds from spawning the agent to its first `/health` answer over its Unix socket."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-agent-") as workdir:
        socket_path = os.path.join(workdir, "agent.sock")
        argv = bundle.launch_argv(listen=f"unix:{socket_path}", workdir=workdir, mount_point=str(bundle.path))
        env = {**os.environ, **bundle.launch_env(mount_point=str(bundle.path)),
               "ORCHARD_AGENT_TOKEN": secrets.token_hex(16)}
        started = time.perf_counter()
        with child_process(argv, env=env, capture_stdout=True) as proc:
            read_ready_line(proc)
            # verify=False: no TLS on a socket file, and loading the CA bundle alone costs ~15 ms.
            transport = httpx.HTTPTransport(uds=socket_path, verify=False)
            with httpx.Client(transport=transport, base_url="http://agent", timeout=30) as client:
                client.get("/health").raise_for_status()
            return time.perf_counter() - started
