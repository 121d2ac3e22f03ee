"""The Orchard SDK: create sandboxes and talk to them.

    async with AsyncOrchard() as orch:                # no URL: the orchestrator runs in this process
        sb = await orch.create(image="host")
        print((await sb.exec("echo hi")).stdout)

    with Orchard("http://host:8700", api_key=KEY) as orch, orch.create() as sb:   # a deployed server
        sb.exec("echo hi")

Lifecycle goes through a control plane (embedded or remote, orchard/sandbox/control.py); exec and files go
straight to the sandbox's agent. A client deletes every sandbox it created when it closes, on errors too
(see orchard/sandbox/exit_cleanup.py for signals and process exit)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, AsyncGenerator

from pydantic import ValidationError

from orchard.core.backend import BackendConfig
from orchard.core.control_plane import ControlPlane
from orchard.core.errors import (BackendError, InvalidRequest, NotFound, OrchardError, SandboxLost,
                                 describe_validation_errors)
from orchard.core.pool import PoolStatus
from orchard.core.sandbox import SandboxInfo, SandboxSpec
from orchard.sandbox import exit_cleanup
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.control import EmbeddedControlPlane, RemoteControlPlane
from orchard.sandbox.sync import LoopThread, SyncSandbox

log = logging.getLogger(__name__)

AT_EXIT_CLOSE_TIMEOUT_S = 60.0


def _spec_from(spec: SandboxSpec | None, fields: dict[str, Any]) -> SandboxSpec:
    """`spec` with `fields` overriding it, validated; a bad field is an InvalidRequest naming it."""
    try:
        if spec is None:
            return SandboxSpec(**fields)
        return SandboxSpec.model_validate({**spec.model_dump(), **fields}) if fields else spec
    except ValidationError as exc:
        raise InvalidRequest(f"invalid sandbox spec: {describe_validation_errors(exc, 'spec')}") from exc


class AsyncOrchard:
    """Client of one orchestrator. `url` None (and no ORCHARD_URL) runs it in-process, state under `home`
    ($ORCHARD_HOME, default ~/.orchard), on `backend` (a `BackendConfig` or a backend's name, default
    the local backend); otherwise talks to the server at `url` with `api_key` (default ORCHARD_API_KEY),
    whose backend is the server's choice. `caps` (a `CreateCaps` or its fields as a dict): the in-process
    orchestrator's hard caps on live sandboxes and create rate. `pool` (a `PoolSpec`, a list of them, or
    their fields as dicts): the in-process orchestrator's warm pools (docs/pools.md). Use as `async with`,
    or call `close()`."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 home: str | Path | None = None, timeout: float = 300.0,
                 backend: BackendConfig | str | None = None, caps: Any = None, pool: Any = None,
                 _guard_exit: bool = True) -> None:
        self.url = url or os.environ.get("ORCHARD_URL") or None
        if self.url:
            if backend is not None:
                raise InvalidRequest("backend= chooses where an in-process orchestrator runs sandboxes; a server "
                                     f"at {self.url} uses its own (`orchard serve --backend`): drop one of them")
            if caps is not None:
                raise InvalidRequest("caps= sets an in-process orchestrator's caps; a server at "
                                     f"{self.url} has its own (`orchard serve --max-sandboxes ...`): drop caps=")
            if pool is not None:
                raise InvalidRequest("pool= sets an in-process orchestrator's warm pools; a server at "
                                     f"{self.url} has its own (`orchard serve --pools FILE`): drop pool=")
            key = api_key or os.environ.get("ORCHARD_API_KEY") or None
            self._control: ControlPlane = RemoteControlPlane(self.url, key, timeout=timeout)
        else:
            self._control = EmbeddedControlPlane(home, backend, caps=caps, pools=pool)
        self._created: dict[str, AgentSandbox] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_guard: AsyncGenerator[None, None] | None = None
        # Embedded sandboxes die with this process: make sure every way out deletes them.
        self._guards_exit = self.embedded and _guard_exit
        if self._guards_exit:
            exit_cleanup.register(self)

    @property
    def embedded(self) -> bool:
        return self.url is None

    def __repr__(self) -> str:
        return f"AsyncOrchard({self._control.description}, {len(self._created)} sandboxes open)"

    async def create(self, spec: SandboxSpec | None = None, *, detach: bool = False,
                     idempotency_key: str | None = None, pool: str | None = None,
                     **spec_fields: Any) -> AgentSandbox:
        """Create a sandbox (`spec_fields` override `spec`) and return it once ready. Its `close()`
        deletes it, and closing this client deletes it too, unless `detach`: then it lives on until its
        `timeout_s` or a `delete()` (only with a server; embedded sandboxes die with this process).
        `idempotency_key`: creating again with the same key returns the same sandbox, never a second one
        (a different spec with it is refused); this client's own retries always reuse one key. A spec
        with a warm pool's template is claimed from that pool (`pool`: from the pool of that name);
        `(await orch.get(sandbox.id)).pool` says whether it was (docs/pools.md)."""
        await self._ready()
        if detach and self.embedded:
            raise InvalidRequest("a detached sandbox must outlive this process, so it needs an Orchard server: "
                                 "start one with `orchard serve` and pass its URL (or set ORCHARD_URL)")
        info = await self._control.create(_spec_from(spec, spec_fields), idempotency_key=idempotency_key,
                                          pool=pool)
        try:
            sandbox = self._attach(info, owned=not detach)
        except BaseException:
            await self._control.delete(info.id)
            raise
        if not detach:
            self._created[info.id] = sandbox
        return sandbox

    async def connect(self, sandbox_id: str) -> AgentSandbox:
        """Attach to an existing sandbox (waiting until it is ready). Closing the returned object only
        closes the connection; delete the sandbox with `delete()`."""
        await self._ready()
        info = await self._control.get(sandbox_id)
        if info.state == "creating":
            info = await self._control.wait_ready(sandbox_id)
        return self._attach(info, owned=False)

    async def pool_status(self) -> list[PoolStatus]:
        """The orchestrator's warm pools now: members idle and starting, claims, misses (docs/pools.md)."""
        await self._ready()
        return await self._control.pool_status()

    async def wait_for_pool(self, name: str, *, idle: int = 1, timeout: float = 120.0) -> PoolStatus:
        """Return once pool `name` has at least `idle` members started (e.g. before timing a run)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            status = next((p for p in await self.pool_status() if p.name == name), None)
            if status is None:
                raise NotFound(f"no pool named {name!r}; pools: {', '.join(p.name for p in await self.pool_status())}")
            if status.idle >= idle:
                return status
            if asyncio.get_running_loop().time() > deadline:
                raise BackendError(f"pool {name} had {status.idle} of {idle} members started after {timeout:g} s "
                                   f"(last error: {status.last_error}); see pool_status()")
            await asyncio.sleep(0.02)

    async def get(self, sandbox_id: str) -> SandboxInfo:
        await self._ready()
        return await self._control.get(sandbox_id)

    async def list(self, *, owner: str | None = None, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        await self._ready()
        return await self._control.list(owner=owner, labels=labels)

    async def wait_ready(self, sandbox_id: str, timeout: float = 60) -> SandboxInfo:
        await self._ready()
        return await self._control.wait_ready(sandbox_id, timeout)

    async def heartbeat(self, sandbox_id: str) -> SandboxInfo:
        """Keep a sandbox with `heartbeat_timeout_s` alive."""
        await self._ready()
        return await self._control.heartbeat(sandbox_id)

    async def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox (SandboxNotFound if there is no such sandbox)."""
        await self._ready()
        sandbox = self._created.pop(sandbox_id, None)
        try:
            await self._control.delete(sandbox_id)
        finally:
            if sandbox is not None:
                await sandbox.close()

    async def close(self) -> None:
        """Delete every sandbox this client created, then stop the control plane (embedded: the
        orchestrator, deleting whatever it still runs). Raises the first failure after trying them all."""
        if self._closed:
            return
        self._closed = True
        guard, self._loop_guard = self._loop_guard, None
        errors: list[BaseException] = []
        try:
            results = await asyncio.gather(*(sb.close() for sb in list(self._created.values())),
                                           return_exceptions=True)
            errors += [r for r in results if isinstance(r, BaseException)]
        finally:
            try:
                await self._control.close()
            except Exception as exc:  # noqa: BLE001 — reported below, after the sandboxes were tried
                errors.append(exc)
            finally:
                if self._guards_exit:
                    exit_cleanup.unregister(self)
                if guard is not None:
                    await guard.aclose()
        if errors:
            raise errors[0]

    async def __aenter__(self) -> "AsyncOrchard":
        await self._ready()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self.close()
        except OrchardError as close_error:
            if exc is None:
                raise
            # The body's error is the one to see; the cleanup failure is logged, not lost.
            log.warning("closing the Orchard client after an error also failed: %s", close_error)

    def close_at_exit(self) -> None:
        """Called at interpreter exit for a client nobody closed."""
        if self._closed:
            return
        loop = self._loop
        try:
            if loop is not None and loop.is_running() and not loop.is_closed():
                asyncio.run_coroutine_threadsafe(self.close(), loop).result(AT_EXIT_CLOSE_TIMEOUT_S)
            else:
                asyncio.run(asyncio.wait_for(self.close(), AT_EXIT_CLOSE_TIMEOUT_S))
        except BaseException as exc:  # noqa: BLE001 — at exit there is no one left to raise to
            log.warning("could not delete the sandboxes of an unclosed Orchard client at exit: %s; "
                        "the next embedded start removes them", exc)

    def _attach(self, info: SandboxInfo, *, owned: bool) -> AgentSandbox:
        if info.state in ("deleting", "deleted", "lost") or not info.agent_url or not info.token:
            raise SandboxLost(f"sandbox {info.id} is {info.state}{': ' + info.error if info.error else ''}; "
                              "create a new one")

        async def delete_on_close() -> None:
            # Runs when the sandbox object is closed; a sandbox already deleted (by `delete` or its TTL)
            # needs nothing more.
            if self._created.pop(info.id, None) is not None:
                try:
                    await self._control.delete(info.id)
                except NotFound:
                    pass

        sandbox = AgentSandbox(info.id, info.agent_url, info.token, workdir=info.spec.workdir,
                               on_close=delete_on_close if owned else None)
        sandbox.startup = info.startup
        return sandbox

    async def _ready(self) -> None:
        if self._closed:
            raise InvalidRequest("this Orchard client is closed; make a new one")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_guard = self._closes_with_its_loop()
            await anext(self._loop_guard)

    async def _closes_with_its_loop(self) -> AsyncGenerator[None, None]:
        """An async generator parked at its `yield` for the client's life. The event loop finalizes
        such generators when it shuts down (`asyncio.run` does, before closing the loop) or when they
        are garbage collected, so a client nobody closed is closed on its own loop, while that still
        runs. `close()` finalizes it with the guard already cleared, so then it does nothing."""
        try:
            yield
        finally:
            if self._loop_guard is not None:
                self._loop_guard = None
                try:
                    await self.close()
                except BaseException as exc:  # noqa: BLE001 — the loop is ending; nobody to raise to
                    log.warning("could not delete the sandboxes of an unclosed Orchard client when its event "
                                "loop ended: %s", exc)


class Orchard:
    """The synchronous twin of `AsyncOrchard`: the same client on a private event-loop thread, returning
    `SyncSandbox` objects. Use as `with Orchard() as orch:`, or call `close()`."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 home: str | Path | None = None, timeout: float = 300.0,
                 backend: BackendConfig | str | None = None, caps: Any = None, pool: Any = None) -> None:
        self._loop = LoopThread.shared()  # one loop for every sync object, as in orchard/sandbox/sync.py
        self._async = AsyncOrchard(url, api_key, home=home, timeout=timeout, backend=backend, caps=caps, pool=pool,
                                   _guard_exit=False)
        self._closed = False
        # Registered here, on the caller's thread, since the async client's close runs on the loop thread.
        if self._async.embedded:
            exit_cleanup.register(self)

    @property
    def embedded(self) -> bool:
        return self._async.embedded

    @property
    def url(self) -> str | None:
        return self._async.url

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncOrchard", "Orchard", 1)

    def create(self, spec: SandboxSpec | None = None, *, detach: bool = False,
               idempotency_key: str | None = None, pool: str | None = None, **spec_fields: Any) -> SyncSandbox:
        """See `AsyncOrchard.create`."""
        return SyncSandbox(self._loop.run(self._async.create(spec, detach=detach, idempotency_key=idempotency_key,
                                                             pool=pool, **spec_fields)), self._loop)

    def pool_status(self) -> list[PoolStatus]:
        """See `AsyncOrchard.pool_status`."""
        return self._loop.run(self._async.pool_status())

    def wait_for_pool(self, name: str, *, idle: int = 1, timeout: float = 120.0) -> PoolStatus:
        """See `AsyncOrchard.wait_for_pool`."""
        return self._loop.run(self._async.wait_for_pool(name, idle=idle, timeout=timeout))

    def connect(self, sandbox_id: str) -> SyncSandbox:
        return SyncSandbox(self._loop.run(self._async.connect(sandbox_id)), self._loop)

    def get(self, sandbox_id: str) -> SandboxInfo:
        return self._loop.run(self._async.get(sandbox_id))

    def list(self, *, owner: str | None = None, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        return self._loop.run(self._async.list(owner=owner, labels=labels))

    def wait_ready(self, sandbox_id: str, timeout: float = 60) -> SandboxInfo:
        return self._loop.run(self._async.wait_ready(sandbox_id, timeout))

    def heartbeat(self, sandbox_id: str) -> SandboxInfo:
        return self._loop.run(self._async.heartbeat(sandbox_id))

    def delete(self, sandbox_id: str) -> None:
        self._loop.run(self._async.delete(sandbox_id))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._async.close())
        finally:
            if self._async.embedded:
                exit_cleanup.unregister(self)

    def close_at_exit(self) -> None:
        try:
            self.close()
        except BaseException as exc:  # noqa: BLE001 — at exit there is no one left to raise to
            log.warning("could not delete the sandboxes of an unclosed Orchard client at exit: %s; "
                        "the next embedded start removes them", exc)

    def __enter__(self) -> "Orchard":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except OrchardError as close_error:
            if exc is None:
                raise
            log.warning("closing the Orchard client after an error also failed: %s", close_error)
