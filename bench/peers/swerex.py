"""SWE-ReX 1.4.0 (PyPI `swe-rex`) as a peer: its own remote server (`python -m swerex`, the module behind
the `swerex-remote` script: FastAPI on uvicorn, run as shipped) and its `RemoteRuntime` client."""

from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

from bench.processes import child_process, free_port, python_module_argv, wait_until_http_ok

SESSION_NAME = "bench"


@dataclass(frozen=True)
class SwerexServer:
    host: str
    port: int
    token: str
    pid: int


def swerex_version() -> str:
    from importlib.metadata import version

    return version("swe-rex")


@contextmanager
def swerex_server() -> Iterator[SwerexServer]:
    """A SWE-ReX remote server on 127.0.0.1 with a fresh auth token; its process group (the bash sessions
    it spawned included) is killed when the block ends."""
    port, token = free_port(), secrets.token_hex(16)
    argv = python_module_argv("swerex", "--host", "127.0.0.1", "--port", str(port), "--auth-token", token)
    with child_process(argv) as proc:
        wait_until_http_ok(f"http://127.0.0.1:{port}/is_alive", proc, headers={"X-API-Key": token})
        yield SwerexServer(host="http://127.0.0.1", port=port, token=token, pid=proc.pid)


def remote_runtime(server: SwerexServer):
    """SWE-ReX's own client for `server` (imported here: SWE-ReX is only needed by the bench)."""
    from swerex.runtime.remote import RemoteRuntime

    # Its rich log handler prints a line per request at DEBUG; the peer's cost is the round trip, not that.
    logging.getLogger("rex-runtime").setLevel(logging.WARNING)
    return RemoteRuntime(host=server.host, port=server.port, auth_token=server.token, timeout=30.0)


async def swerex_execute(runtime, command: str) -> None:
    from swerex.runtime.abstract import Command

    response = await runtime.execute(Command(command=command, shell=True))
    if response.exit_code != 0:
        raise RuntimeError(f"SWE-ReX execute failed: {response}")


@asynccontextmanager
async def swerex_session(runtime) -> AsyncIterator[None]:
    """A SWE-ReX bash session named SESSION_NAME, closed afterwards."""
    from swerex.runtime.abstract import CloseBashSessionRequest, CreateBashSessionRequest

    await runtime.create_session(CreateBashSessionRequest(session=SESSION_NAME))
    try:
        yield
    finally:
        await runtime.close_session(CloseBashSessionRequest(session=SESSION_NAME))


async def swerex_session_run(runtime, command: str) -> None:
    from swerex.runtime.abstract import BashAction

    observation = await runtime.run_in_session(BashAction(command=command, session=SESSION_NAME))
    if observation.exit_code != 0:
        raise RuntimeError(f"SWE-ReX session run failed: {observation}")


async def swerex_upload(runtime, source_path: str, target_path: str) -> None:
    from swerex.runtime.abstract import UploadRequest

    await runtime.upload(UploadRequest(source_path=source_path, target_path=target_path))
