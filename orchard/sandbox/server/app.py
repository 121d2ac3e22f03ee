"""The orchestrator's REST API (FastAPI): sandbox lifecycle only. Clients run commands and move files by
talking to each sandbox's agent directly, at the `agent_url` with the `token` returned here."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.security import HTTPBearer

from orchard import __version__
from orchard.core.errors import Forbidden, InvalidRequest, SandboxNotFound
from orchard.core.pool import PoolsConfig, PoolStatusList
from orchard.core.sandbox import SandboxInfo, SandboxList, SandboxSpec
from orchard.sandbox.server.admission import MAX_IDEMPOTENCY_KEY_CHARS, CapsStats
from orchard.sandbox.server.api_keys import KeyRing
from orchard.sandbox.server.auth import Authenticate, Principal, principal_of
from orchard.sandbox.server.http_errors import ERROR_RESPONSES
from orchard.sandbox.server.limits import MIB, BodySizeLimit
from orchard.sandbox.server.models import Health
from orchard.sandbox.server.service import ACTIVE_STATES, SandboxService
from orchard.util.http_errors import install_error_handlers

DEFAULT_KEY_NAME = "default"


def create_app(service: SandboxService, api_key: str, *, key_name: str = DEFAULT_KEY_NAME,
               max_body_bytes: int = MIB, keys: KeyRing | None = None) -> FastAPI:
    """The app starts the service (reconcile, reaper) when it starts and stops it, leaving the sandboxes
    running for the next start, when it stops. `api_key` is the admin key; `key_name` the owner of sandboxes
    it creates without naming one. `keys`: owner keys (api_keys.py), each acting only for its owner."""
    if not api_key:
        raise InvalidRequest("an API key is required to serve the sandbox API; pass a non-empty key")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="Orchard Env", version=__version__, lifespan=lifespan,
                  description="Create, find, keep alive and delete sandboxes. Exec and files go straight to "
                              "each sandbox's agent at `agent_url`, with its `token`.")
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(Authenticate, admin_key=api_key, keys=keys)  # outermost: before any body is read
    install_error_handlers(app, service="orchestrator", log=logging.getLogger("orchard.sandbox.server"))

    # The key is checked by Authenticate before the body is read; this only documents it in OpenAPI.
    bearer = HTTPBearer(auto_error=False, description="the orchestrator's admin key, or an owner key")

    def caller(request: Request) -> Principal:
        return principal_of(request.scope)

    async def visible(sandbox_id: str, principal: Principal) -> SandboxInfo:
        """The sandbox, if the caller may see it: an owner key sees its owner's only (another's: 404, as if
        it did not exist, so ids of other owners cannot be probed)."""
        info = await service.get(sandbox_id)
        if not principal.admin and info.owner != principal.owner:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r} of owner {principal.owner!r}; check the id or list "
                                  "your sandboxes")
        return info

    def admin_only(principal: Principal, what: str) -> None:
        if not principal.admin:
            raise Forbidden(f"{what} needs the orchestrator's admin key; key {principal.key_id} is owner "
                            f"{principal.owner!r}'s")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(bearer)], responses=ERROR_RESPONSES, tags=["sandboxes"])

    @v1.post("/sandboxes", status_code=201, response_model=SandboxInfo)
    async def create_sandbox(spec: SandboxSpec, principal: Principal = Depends(caller), owner: str | None = Query(
            default=None, max_length=200,
            description=f"owner to record (admin key only; an owner key's sandboxes are its owner's); "
                        f"default: the admin key's name ({key_name!r})"),
            idempotency_key: str | None = Header(
                default=None, alias="Idempotency-Key", min_length=1, max_length=MAX_IDEMPOTENCY_KEY_CHARS,
                description="the same key again (same owner) answers with the same sandbox instead of a new "
                            "one, waiting for it while it is created; with another spec it is refused (409)"),
            pool: str | None = Query(default=None, max_length=63,
                                     description="claim from this warm pool (default: the pool whose template "
                                                 "the spec has, if any)"),
    ) -> SandboxInfo:
        """Create a sandbox; returns once it is ready, with its `agent_url` and `token`. Over one of the
        orchestrator's caps it waits a bounded time for a place, then answers 429. A spec with a warm
        pool's template is claimed from it (no start); `pool` in the answer says whether it was."""
        if principal.admin:
            return await service.create(spec, owner=owner or key_name, idempotency_key=idempotency_key, pool=pool)
        if owner is not None and owner != principal.owner:
            raise Forbidden(f"key {principal.key_id} is owner {principal.owner!r}'s: it cannot create sandboxes "
                            f"for {owner!r}; leave out `owner`")
        return await service.create(spec, owner=str(principal.owner), idempotency_key=idempotency_key, pool=pool,
                                    max_per_owner=principal.max_sandboxes)

    @v1.get("/pools", response_model=PoolStatusList)
    async def list_pools() -> PoolStatusList:
        """The warm pools: their templates, members idle and starting, claims and misses."""
        return PoolStatusList(pools=service.pools.status())

    @v1.put("/pools", response_model=PoolStatusList)
    async def configure_pools(config: PoolsConfig, principal: Principal = Depends(caller)) -> PoolStatusList:
        """Run these pools from now on (the same shape as `orchard serve --pools FILE`). A pool whose
        template changed, or that is left out, has its unclaimed members deleted, never handed out. Admin
        key only."""
        admin_only(principal, "configuring the warm pools")
        service.pools.configure(config)
        return PoolStatusList(pools=service.pools.status())

    @v1.get("/stats", response_model=CapsStats)
    async def stats(principal: Principal = Depends(caller)) -> CapsStats:
        """Live sandboxes (in all and per owner), creates waiting for a place, and the caps. An owner key
        sees its own owner's count only."""
        stats = await service.stats()
        if not principal.admin:
            stats.by_owner = {o: n for o, n in stats.by_owner.items() if o == principal.owner}
        return stats

    @v1.get("/sandboxes", response_model=SandboxList)
    async def list_sandboxes(
            owner: str | None = Query(default=None, description="only this owner's sandboxes"),
            label: list[str] = Query(default=[], description="KEY=VALUE; repeat to require several"),
            principal: Principal = Depends(caller),
    ) -> SandboxList:
        """Sandboxes that are not deleted (lost ones included), oldest first; an owner key's own only."""
        labels = _parse_labels(label)
        if not principal.admin:
            if owner is not None and owner != principal.owner:
                return SandboxList(sandboxes=[])
            owner = principal.owner
        return SandboxList(sandboxes=await service.list(owner=owner, labels=labels))

    @v1.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo)
    async def get_sandbox(sandbox_id: str, principal: Principal = Depends(caller)) -> SandboxInfo:
        """A sandbox, also after it was deleted or lost (for a while): `state` and `error` say what happened."""
        return await visible(sandbox_id, principal)

    @v1.post("/sandboxes/{sandbox_id}/wait", response_model=SandboxInfo)
    async def wait_sandbox(sandbox_id: str, timeout: float = Query(default=60, gt=0, le=3600),
                           principal: Principal = Depends(caller)) -> SandboxInfo:
        """Return once the sandbox is ready; 410 if it was deleted or lost."""
        await visible(sandbox_id, principal)
        return await service.wait_ready(sandbox_id, timeout=timeout)

    @v1.post("/sandboxes/{sandbox_id}/heartbeat", response_model=SandboxInfo)
    async def heartbeat_sandbox(sandbox_id: str, principal: Principal = Depends(caller)) -> SandboxInfo:
        """Keep a sandbox with `heartbeat_timeout_s` alive."""
        await visible(sandbox_id, principal)
        return await service.heartbeat(sandbox_id)

    @v1.delete("/sandboxes/{sandbox_id}", status_code=204, response_class=Response)
    async def delete_sandbox(sandbox_id: str, principal: Principal = Depends(caller)) -> Response:
        """Delete a sandbox and everything it made; deleting it again does nothing."""
        await visible(sandbox_id, principal)
        await service.delete(sandbox_id)
        return Response(status_code=204)

    app.include_router(v1)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        """Liveness, without authentication."""
        return Health(backend=service.backend.name, sandboxes=service.store.count(states=ACTIVE_STATES))

    return app


def _parse_labels(filters: list[str]) -> dict[str, str]:
    labels = {}
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"label filter {item!r} must look like KEY=VALUE")
        labels[key] = value
    return labels
