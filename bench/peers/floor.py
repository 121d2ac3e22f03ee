"""Start the floor server (`floor_server.py`) as a child process and talk to it with httpx keep-alive."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import httpx

from bench.processes import child_process, python_module_argv, read_ready_line


@dataclass(frozen=True)
class FloorServer:
    url: str
    pid: int


@contextmanager
def floor_server() -> Iterator[FloorServer]:
    """A running floor server on 127.0.0.1; stopped (its process group killed) when the block ends."""
    with child_process(python_module_argv("bench.peers.floor_server", "--port", "0"),
                       capture_stdout=True) as proc:
        port = int(read_ready_line(proc).split()[1])
        yield FloorServer(url=f"http://127.0.0.1:{port}", pid=proc.pid)


def _checked(response: httpx.Response) -> dict:
    response.raise_for_status()
    result = response.json()
    if result["exit_code"] != 0:
        raise RuntimeError(f"floor exec failed: {result}")
    return result


class FloorClient:
    """One keep-alive connection to the floor server (the same reuse Orchard's SDK gets)."""

    def __init__(self, url: str) -> None:
        self._client = httpx.Client(base_url=url, timeout=60.0)

    def exec(self, command: str | list[str]) -> dict:
        return _checked(self._client.post("/exec", json={"command": command}))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "FloorClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncFloorClient:
    """A keep-alive connection pool to the floor server for concurrent load."""

    def __init__(self, url: str, max_connections: int) -> None:
        self._client = httpx.AsyncClient(base_url=url, timeout=120.0,
                                         limits=httpx.Limits(max_connections=max_connections))

    async def exec(self, command: str | list[str]) -> dict:
        return _checked(await self._client.post("/exec", json={"command": command}))

    async def __aenter__(self) -> "AsyncFloorClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()
