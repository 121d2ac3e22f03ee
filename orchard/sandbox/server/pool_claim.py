"""A claim from a warm pool (pools.py): take an idle member, re-own it to the caller within its per-owner cap,
then one `POST /claim` to its agent (docs/agent-protocol.md), authorized by the member's own token, handing
it a fresh token and the caller's env, and rewrite its record as the caller's sandbox."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from urllib.parse import urlsplit

from orchard.core.errors import InvalidRequest, OrchardError, exception_text
from orchard.core.sandbox import SandboxInfo, SandboxPoolInfo, SandboxSpec, StartupTimings
from orchard.sandbox.server.admission import spec_fingerprint
from orchard.sandbox.server.pool_state import PoolHost, PoolState

log = logging.getLogger("orchard.sandbox.server.pools")

CLAIM_TIMEOUT_S = 10.0
_KEY_TAKEN = "the idempotency key already names a sandbox"
_OVER_CAP = "the owner is at its per-owner cap"
_CLAIM_FAILED = "claim failed: "  # + why; the member was deleted


async def claim_from(manager: PoolHost, pool: PoolState, spec: SandboxSpec, owner: str, started: float,
                     idempotency_key: str | None, key: str, why_not: str | None = None, *,
                     max_per_owner: int | None = None) -> tuple[SandboxInfo | None, SandboxPoolInfo | None]:
    failed: list[str] = []
    while why_not is None and pool.idle:
        sandbox_id, since = pool.idle.popleft()
        manager.poke()
        info, why_not = await hand_out(manager, pool, sandbox_id, spec, owner, started, idempotency_key,
                                       max_per_owner)
        if info is not None:
            pool.claims += 1
            return info, None
        if why_not is not None and why_not.startswith(_CLAIM_FAILED):  # deleted: try the next member
            failed.append(f"{sandbox_id}: {why_not[len(_CLAIM_FAILED):]}")
            why_not = None
            continue
        if why_not is not None:  # the member is fine but cannot serve this spec: keep it
            pool.idle.appendleft((sandbox_id, since))
            if why_not in (_KEY_TAKEN, _OVER_CAP):  # the normal create answers (the key's sandbox, or
                return None, None                   # it waits for a place under the cap, or says 429)
    if why_not is None:
        pool.misses += 1
        if pool.spec.on_demand and pool.target < pool.spec.size_cap:
            pool.target += 1
        manager.poke()
        why_not = (f"pool {pool.spec.name} had no started member ({pool.starting} starting, at most "
                   f"{pool.spec.size_cap}): made cold")
        if failed:
            why_not = (f"pool {pool.spec.name}'s members failed their claim and were deleted ("
                       f"{'; '.join(failed)[:500]}); no other was started: made cold")
    return None, SandboxPoolInfo(name=pool.spec.name, template=key, fallback_reason=why_not)

async def hand_out(manager: PoolHost, pool: PoolState, sandbox_id: str, spec: SandboxSpec, owner: str,
                   started: float, idempotency_key: str | None,
                   max_per_owner: int | None = None) -> tuple[SandboxInfo | None, str | None]:
    store = manager.service.store
    record = store.get(sandbox_id)
    member = record.info.pool if record is not None else None
    if (record is None or record.info.state != "ready" or record.backend is None or member is None
            or not member.idle or member.template != pool.key or record.info.token is None):
        if record is not None and record.info.state == "ready":
            manager.discard(pool, sandbox_id, "deleted: a pool member that no longer matched its pool")
        return None, None
    now = time.time()
    if record.info.expires_at < now + spec.timeout_s:
        return None, (f"timeout_s={spec.timeout_s:g} is longer than pool {pool.spec.name}'s members have left "
                      f"(member_timeout_s={pool.spec.member_timeout_s:g}): made cold")
    # Re-owned (counted against the caller's per-owner cap, in the store, so that orchestrators sharing it
    # cannot together exceed it) and bound to the key before the agent hears of the claim: a retry of
    # this create finds this member and waits for the claim, never claims another.
    admission = manager.service.admission
    pool_owner = record.info.owner
    reowned = store.reown_within_cap(
        sandbox_id, from_owner=pool_owner, to_owner=owner, live_states=admission.live_states,
        max_per_owner=admission.owner_cap(max_per_owner), idempotency_key=idempotency_key,
        fingerprint=spec_fingerprint(spec) if idempotency_key is not None else None)
    if reowned.outcome != "reowned":
        return None, {"gone": None, "key_taken": _KEY_TAKEN, "over_cap": _OVER_CAP}[reowned.outcome]
    claim_started = time.monotonic()
    token = secrets.token_urlsafe(32)
    try:
        await claim_agent(record.backend.agent_url, record.info.token, token, spec.env)
    except BaseException as e:
        # Refused, failed, or this create was cancelled: the agent may hold either token now, so the
        # member is never handed out; its key is freed (nobody got it) and the caller gets another
        # member or a cold create.
        store.release_claim(sandbox_id, owner=owner, pool_owner=pool_owner)
        manager.discard(pool, sandbox_id, f"deleted: a pool member whose claim failed: {exception_text(e)}")
        if not isinstance(e, Exception):
            raise
        log.warning("pool %s: member %s could not be claimed (%s); deleting it", pool.spec.name, sandbox_id,
                    exception_text(e))
        pool.last_error = f"claiming member {sandbox_id} failed: {e}"
        return None, f"{_CLAIM_FAILED}{e}"
    done = time.monotonic()
    info = record.info
    info.token, info.spec, info.owner = token, spec, owner
    info.created_at = info.last_heartbeat = now
    info.expires_at = now + spec.timeout_s
    info.pool = SandboxPoolInfo(name=pool.spec.name, template=pool.key, claimed=True)
    info.startup = StartupTimings(pool_claim_ms=(done - claim_started) * 1000,
                                  total_ms=(done - started) * 1000)
    if not store.update_if_state(record, "ready"):  # deleted meanwhile (reaped as dead, another instance)
        store.free_idempotency_keys(sandbox_id)  # nobody got it: a retry with the key creates anew
        return None, None
    return info, None  # the record was read for this claim alone: nothing else holds it



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
