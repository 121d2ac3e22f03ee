"""Control planes the SDK talks to for sandbox lifecycle: the orchestrator running in this process
(`EmbeddedControlPlane`, the default with no server URL) or a deployed one over REST
(`RemoteControlPlane`). Both return the same `SandboxInfo`s and raise the same typed errors, so the SDK
above them does not care which one it has. Exec and files never pass through here: they go straight to
the sandbox's agent."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from orchard.core.backend import BackendConfig
from orchard.core.errors import (AuthError, BackendError, CapacityExceeded, IdempotencyConflict, InvalidRequest,
                                 NotFound, OrchardError, PayloadTooLarge, SandboxLost, describe_validation_errors,
                                 error_from_code)
from orchard.core.pool import PoolSpec, PoolsConfig, PoolStatus, PoolStatusList
from orchard.core.sandbox import SandboxInfo, SandboxList, SandboxSpec

if TYPE_CHECKING:
    from orchard.sandbox.server.admission import CreateCaps


class EmbeddedControlPlane:
    """The orchestrator in this process, with its state under `home` ($ORCHARD_HOME, default ~/.orchard),
    on `backend` (a config or a backend's name; default the local backend). Started on first use; `close`
    deletes every sandbox it runs, because nothing would be left to reap them once this process is gone."""

    def __init__(self, home: str | Path | None = None, backend: BackendConfig | str | None = None, *,
                 caps: CreateCaps | dict | None = None, pools: Any = None) -> None:
        self.home = Path(home) if home is not None else None
        self.pools = _pools(pools)
        self.backend = backend
        self.caps = _caps(caps)
        name = backend if isinstance(backend, str) else backend.backend if backend is not None else "local"
        self.description = f"embedded (in-process, {name} backend)"
        self._service = None
        self._lifeline = None  # ends this process's sandboxes if it is killed (orchard/sandbox/lifeline.py)
        self._start_lock: asyncio.Lock | None = None
        self._closed = False

    async def _started(self):
        if self._closed:
            raise InvalidRequest("this Orchard client is closed; make a new one to create sandboxes")
        if self._service is not None:
            return self._service
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._service is None:
                # Imported here so that a remote-only client never loads the server and backend code.
                from orchard.sandbox.lifeline import Lifeline
                from orchard.sandbox.server.home import resolve_home, resolved_backend_config
                from orchard.sandbox.server.service import SandboxService

                home = resolve_home(self.home)
                config = resolved_backend_config(self.backend, home)
                service = SandboxService.embedded(home, backend=config, caps=self.caps, pools=self.pools)
                self._lifeline = await asyncio.to_thread(Lifeline, home, config)
                try:
                    await service.start()
                except BaseException:
                    self._release_lifeline()
                    raise
                self._service = service
        return self._service

    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None,
                     pool: str | None = None) -> SandboxInfo:
        return await (await self._started()).create(spec, idempotency_key=idempotency_key, pool=pool)

    async def pool_status(self) -> list[PoolStatus]:
        return (await self._started()).pools.status()

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await (await self._started()).get(sandbox_id)

    async def list(self, *, owner: str | None = None,
                   labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        return await (await self._started()).list(owner=owner, labels=labels)

    async def wait_ready(self, sandbox_id: str, timeout: float = 60) -> SandboxInfo:
        return await (await self._started()).wait_ready(sandbox_id, timeout)

    async def heartbeat(self, sandbox_id: str) -> SandboxInfo:
        return await (await self._started()).heartbeat(sandbox_id)

    async def delete(self, sandbox_id: str) -> None:
        await (await self._started()).delete(sandbox_id)

    async def close(self) -> None:
        self._closed = True
        service, self._service = self._service, None
        if service is not None:
            await service.stop(delete_all=True)
        self._release_lifeline()

    def _release_lifeline(self) -> None:
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            lifeline.release()


_Model = TypeVar("_Model", bound=BaseModel)


# Connection attempts that failed before anything was sent are retried by httpcore (backoff 0, 0.5, 1 s).
CONNECT_RETRIES = 3
# A create whose connection broke after it was sent (or that got no answer in time) is sent again, with the
# same idempotency key: the server answers with the sandbox the first attempt made, never a second one.
CREATE_RETRIES = 3
CREATE_RETRY_BACKOFF_S = 0.5


# For error answers without our JSON body (e.g. from a proxy in front of the server).
_ERROR_BY_STATUS: dict[int, type[OrchardError]] = {
    400: InvalidRequest, 401: AuthError, 404: NotFound, 409: IdempotencyConflict, 410: SandboxLost,
    413: PayloadTooLarge, 429: CapacityExceeded, 503: BackendError}


def _describe(exc: Exception) -> str:
    """What went wrong with a request: httpx's message, which is empty for some errors (a connection reset
    is `ReadError('')`), so never an empty string."""
    return str(exc) or f"the connection broke ({type(exc).__name__}, e.g. reset by the server)"


def _quoted(sandbox_id: str) -> str:
    """The id as one URL path segment, so that an odd id can never address another route."""
    if sandbox_id in ("", ".", ".."):
        raise InvalidRequest(f"{sandbox_id!r} is not a sandbox id; list them with `orchard sandbox ls`")
    return quote(sandbox_id, safe="")


class _Retryable(Exception):
    """An idempotent request that may be sent again; `error` is what to raise when it is not."""

    def __init__(self, error: OrchardError) -> None:
        super().__init__(str(error))
        self.error = error


def _pools(pools: Any) -> list[PoolSpec]:
    """Warm pools in any shape a user may give them: a PoolSpec, a list of them (or of their fields as dicts),
    a PoolsConfig or its dict."""
    if pools is None:
        return []
    try:
        if isinstance(pools, PoolsConfig):
            return list(pools.pools)
        if isinstance(pools, (PoolSpec, dict)) and not (isinstance(pools, dict) and "pools" in pools):
            pools = [pools]
        if isinstance(pools, dict):
            return list(PoolsConfig.model_validate(pools).pools)
        return list(PoolsConfig.model_validate({"pools": [p.model_dump() if isinstance(p, PoolSpec) else p
                                                          for p in pools]}).pools)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid pool: {describe_validation_errors(exc, 'pool')}") from exc


def _caps(caps: "CreateCaps | dict | None") -> "CreateCaps | None":
    if caps is None:
        return None
    from orchard.sandbox.server.admission import CreateCaps  # the server's code, loaded only when embedded

    try:
        return caps if isinstance(caps, CreateCaps) else CreateCaps.model_validate(caps)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid caps: {describe_validation_errors(exc, 'caps')}") from exc


class RemoteControlPlane:
    """A deployed orchestrator (`orchard serve`) over its REST API, authenticated with an API key."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 300.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidRequest(f"Orchard server URL {url!r} is not an http(s) URL; "
                                 "use e.g. http://127.0.0.1:8700")
        self.url = url.rstrip("/")
        self.description = f"remote ({self.url})"
        self._has_key = bool(api_key)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0),
            transport=httpx.AsyncHTTPTransport(retries=CONNECT_RETRIES))

    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None,
                     pool: str | None = None) -> SandboxInfo:
        """Retried on a broken connection or no answer, always with one idempotency key (a new one unless
        given), so that a retry never makes a second sandbox."""
        headers = {"Idempotency-Key": idempotency_key or f"sdk-{uuid.uuid4().hex}"}
        body = spec.model_dump(mode="json")
        for attempt in range(1, CREATE_RETRIES + 1):
            try:
                response = await self._request("POST", "/v1/sandboxes", json=body, headers=headers,
                                               params={"pool": pool} if pool is not None else None)
                return self._parse(SandboxInfo, response)
            except _Retryable as exc:
                if attempt == CREATE_RETRIES:
                    raise exc.error from exc.__cause__
                await asyncio.sleep(CREATE_RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    async def pool_status(self) -> list[PoolStatus]:
        return self._parse(PoolStatusList, await self._request("GET", "/v1/pools")).pools

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return self._parse(SandboxInfo, await self._request("GET", f"/v1/sandboxes/{_quoted(sandbox_id)}"))

    async def list(self, *, owner: str | None = None,
                   labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        params: list[tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if owner is not None:
            params.append(("owner", owner))
        response = await self._request("GET", "/v1/sandboxes", params=params)
        return self._parse(SandboxList, response).sandboxes

    async def wait_ready(self, sandbox_id: str, timeout: float = 60) -> SandboxInfo:
        response = await self._request("POST", f"/v1/sandboxes/{_quoted(sandbox_id)}/wait",
                                       params={"timeout": timeout}, read_timeout=timeout + 30)
        return self._parse(SandboxInfo, response)

    async def heartbeat(self, sandbox_id: str) -> SandboxInfo:
        return self._parse(SandboxInfo, await self._request("POST", f"/v1/sandboxes/{_quoted(sandbox_id)}/heartbeat"))

    async def delete(self, sandbox_id: str) -> None:
        await self._request("DELETE", f"/v1/sandboxes/{_quoted(sandbox_id)}")

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, json: dict | None = None,
                       params: dict | list | None = None, read_timeout: float | None = None,
                       headers: dict[str, str] | None = None) -> httpx.Response:
        """With `Idempotency-Key` in `headers`, a broken connection or a missing answer raises `_Retryable`
        (the request may be sent again); otherwise the typed error."""
        extra = {"timeout": httpx.Timeout(read_timeout, connect=10.0)} if read_timeout else {}
        retryable = bool(headers and "Idempotency-Key" in headers)
        try:
            response = await self._http.request(method, path, json=json, params=params, headers=headers, **extra)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise BackendError(f"cannot reach the Orchard server at {self.url} ({_describe(exc)}); "
                               "check that `orchard serve` is running there and that ORCHARD_URL is right") from exc
        except httpx.TimeoutException as exc:
            error = OrchardError(f"the Orchard server at {self.url} did not answer {method} {path} in time; "
                                 "it may still be working on it: check with `orchard sandbox ls`")
            raise (_Retryable(error) if retryable else error) from exc
        except httpx.TransportError as exc:
            error = OrchardError(f"talking to the Orchard server at {self.url} failed during {method} {path}: "
                                 f"{_describe(exc)}")
            raise (_Retryable(error) if retryable else error) from exc
        if response.status_code >= 400:
            raise self._error(response)
        return response

    def _error(self, response: httpx.Response) -> OrchardError:
        """The typed error of a `{"error", "message"}` body; by status when the body is not ours (a proxy)."""
        try:
            body = response.json()
            error = error_from_code(str(body["error"]), str(body["message"]))
        except (ValueError, KeyError, TypeError):
            text = response.text.strip()[:200] or response.reason_phrase
            error = _ERROR_BY_STATUS.get(response.status_code, OrchardError)(
                f"the Orchard server at {self.url} answered {response.status_code}: {text}")
        if isinstance(error, AuthError) and not self._has_key:
            error = AuthError(f"{error} (no API key was given: set ORCHARD_API_KEY or pass api_key=)")
        return error

    def _parse(self, model: type[_Model], response: httpx.Response) -> _Model:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise OrchardError(f"the Orchard server at {self.url} sent an answer this client does not "
                               f"understand (is it the same Orchard version?): {exc}") from exc
