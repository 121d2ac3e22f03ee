"""Test helpers on real parts: an `orchard serve` subprocess on a free port (stopped, and what it runs
deleted, afterwards), and what the local backend still runs under a home; waiting for a condition,
stopping a process, and the environments of the machine's processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

START_TIMEOUT_S = 60


@dataclass
class RunningServer:
    url: str
    api_key: str
    home: Path
    log: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "ORCHARD_URL": self.url, "ORCHARD_API_KEY": self.api_key,
                "ORCHARD_HOME": str(self.home)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `predicate` until it returns something true, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop_process(process: subprocess.Popen, how: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Send `how` to a process still running, and SIGKILL it if it has not ended `timeout` s later."""
    if process.poll() is None:
        process.send_signal(how)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def environments() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, environment entries) of every process whose environment can be read."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            yield int(entry), environ.split(b"\0")


def _wait_until_up(process: subprocess.Popen, url: str, log: Path, api_key: str | None) -> str:
    """Wait for /healthz; return the API key (read from the server's output when it generated one)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"orchard serve exited with {process.returncode}:\n{log.read_text()}")
        if api_key is None:
            match = re.search(r"ORCHARD_API_KEY=(\S+)", log.read_text())
            api_key = match.group(1) if match else None
        try:
            if api_key and httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return api_key
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"orchard serve did not come up in {START_TIMEOUT_S} s:\n{log.read_text()}")


async def _delete_all(server: RunningServer) -> None:
    from orchard.sandbox.client import AsyncOrchard

    async with AsyncOrchard(server.url, server.api_key) as orch:
        for info in await orch.list():
            if info.state not in ("deleted", "lost"):
                await orch.delete(info.id)


@contextlib.contextmanager
def running_server(home: Path, api_key: str | None = None) -> Iterator[RunningServer]:
    """`orchard serve` with its state in `home`. With `api_key` None the server generates one, which is
    read from what it prints (this exercises that path)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = home / "serve.log"
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_URL", "ORCHARD_API_KEY")}
    env["ORCHARD_HOME"] = str(home)
    command = [sys.executable, "-m", "orchard.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if api_key is not None:
        env["ORCHARD_API_KEY"] = api_key  # never on the command line (visible in ps)
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        server = RunningServer(url, _wait_until_up(process, url, log, api_key), home, log)
        try:
            yield server
        finally:
            asyncio.run(_delete_all(server))
    finally:
        stop_process(process, signal.SIGINT)
        remove_live_sandboxes(home)


def _local_backend(home: Path):
    from orchard.sandbox.backends.registry import backend_config, create_backend

    return create_backend(backend_config("local", home))


async def live_sandbox_ids(home: Path) -> set[str]:
    """Sandboxes the local backend under `home` still runs, found from the processes themselves."""
    backend = _local_backend(home)
    try:
        return {found.id for found in await backend.list_live()}
    finally:
        await backend.close()


def remove_live_sandboxes(home: Path) -> None:
    """Teardown after a failed test: whatever still runs under `home` must not outlive the tests."""
    async def remove() -> None:
        backend = _local_backend(home)
        try:
            for found in await backend.list_live():
                await backend.delete(found)
        finally:
            await backend.close()

    asyncio.run(remove())
