"""The agent's /health on its Unix socket, which the backends whose agents listen on this machine (local,
docker) ask once before they hand a sandbox out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from orchard.core.errors import BackendError

# The agent's /health answer is a few dozen bytes; anything past this is not the agent.
MAX_HEALTH_RESPONSE = 1 << 16


async def check_health(socket: Path, timeout: float) -> None:
    """One `GET /health` on the agent's published socket; BackendError unless it answers 200 with status
    ok. A plain request on a fresh connection (the agent closes it after answering): an httpx client built
    for this one request cost each create ~1-2 ms more."""
    async def exchange() -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(socket))
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
            response = bytearray()
            while chunk := await reader.read(65536):
                response.extend(chunk)
                if len(response) > MAX_HEALTH_RESPONSE:
                    break
            return bytes(response)
        finally:
            writer.close()

    try:
        response = await asyncio.wait_for(exchange(), timeout)
    except TimeoutError:
        raise BackendError(f"the agent's /health did not answer within {timeout:g} s") from None
    if not response:
        raise BackendError("the agent closed its connection without answering /health (it exited or was "
                           "killed while starting)")
    head, _, body = response.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status_line.split(" ")[1:2] != ["200"] or not isinstance(answer, dict) or answer.get("status") != "ok":
        raise BackendError(f"the agent's /health answered {status_line or 'nothing'!r}: "
                           f"{body[:200].decode(errors='replace')}")
