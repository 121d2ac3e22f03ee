"""The orchestrator's side of a claim: one `POST /claim` to a pool member's agent (docs/agent-protocol.md),
authorized by the member's own token, handing it a fresh token and the caller's env."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from orchard.core.errors import InvalidRequest, OrchardError

CLAIM_TIMEOUT_S = 10.0


async def claim_agent(agent_url: str, token: str, new_token: str, env: dict[str, str]) -> None:
    """Ask a member's agent to take `new_token` (and drop `token`) and `env` for later commands. One
    request on a fresh connection, written by hand: making an httpx client (its transport and pool) for
    each member's socket costs several times the request itself, and a claim should cost about one
    round trip."""
    body = json.dumps({"token": new_token, "env": env}).encode()
    head = (f"POST /claim HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    status, answer = await asyncio.wait_for(_post(agent_url, head.encode() + body), CLAIM_TIMEOUT_S)
    if status != 200:
        raise OrchardError(f"the agent answered {status}: {answer[:300].decode(errors='replace')}")


async def _post(agent_url: str, request: bytes) -> tuple[int, bytes]:
    if agent_url.startswith("unix:"):
        path = agent_url[len("unix:"):]
        reader, writer = await asyncio.open_unix_connection(path[2:] if path.startswith("//") else path)
    elif agent_url.startswith("http://"):
        address = urlsplit(agent_url)
        reader, writer = await asyncio.open_connection(address.hostname, address.port or 80)
    else:
        raise InvalidRequest(f"pool members need an agent at unix:///PATH or http://HOST:PORT, not {agent_url!r}")
    try:
        writer.write(request)
        await writer.drain()
        response = await reader.read()  # Connection: close, so the answer ends with the connection
    finally:
        writer.close()
    head, _, answer = response.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise OrchardError(f"the agent's answer is not HTTP: {head[:100]!r}") from None
    return status, answer
