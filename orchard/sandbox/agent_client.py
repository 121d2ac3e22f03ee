"""`AgentSandbox`: the client side of the in-sandbox agent's wire protocol (docs/agent-protocol.md).

One keep-alive `httpx.AsyncClient` per sandbox. The hot path (`exec`) serializes a plain dict itself, sends
to a pre-built URL with pre-built headers and parses the reply straight into `ExecResult`, so a call costs
little more than the HTTP round trip. A connect error is retried (nothing was sent yet); anything that fails
after a request went out is never retried, because commands and writes have side effects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import quote

import httpx

from orchard.core.errors import (
    AuthError, ExecTimeout, InvalidRequest, NotFound, OrchardError, PayloadTooLarge, SandboxLost,
    error_from_code,
)
from orchard.core.sandbox import ExecEvent, ExecResult, FileInfo, SessionResult
from orchard.sandbox import tar_stream

_CONNECT_RETRY_DELAYS_S = (0.1, 0.4)
_CONNECT_TIMEOUT_S = 10.0
_WRITE_TIMEOUT_S = 60.0
_READ_TIMEOUT_S = 120.0  # files, stat, sessions without a timeout of their own
_TIMEOUT_MARGIN_S = 30.0  # on top of a command's own timeout: the agent kills and answers within it
_ERROR_BY_STATUS: dict[int, type[OrchardError]] = {
    400: InvalidRequest, 401: AuthError, 404: NotFound, 408: ExecTimeout, 413: PayloadTooLarge}


def _timeout(read_s: float | None) -> httpx.Timeout:
    return httpx.Timeout(connect=_CONNECT_TIMEOUT_S, read=read_s, write=_WRITE_TIMEOUT_S, pool=None)


_DEFAULT_TIMEOUT = _timeout(_READ_TIMEOUT_S)
_NO_READ_TIMEOUT = _timeout(None)


def _command_timeout(timeout: float | None) -> httpx.Timeout:
    return _NO_READ_TIMEOUT if timeout is None else _timeout(timeout + _TIMEOUT_MARGIN_S)


def _transport_for(agent_url: str) -> tuple[httpx.AsyncHTTPTransport, str]:
    """`unix:///abs/agent.sock` → a Unix-socket transport; `http://host:port` → plain TCP."""
    if agent_url.startswith("unix:"):
        path = agent_url[len("unix:"):]
        path = path[2:] if path.startswith("//") else path
        if not path.startswith("/"):
            raise InvalidRequest(f"agent_url {agent_url!r} must name an absolute socket path, "
                                 "like unix:///run/orchard/agent.sock")
        # verify=False: no TLS on a socket file, and loading the CA bundle would cost ~15 ms per sandbox.
        return httpx.AsyncHTTPTransport(uds=path, verify=False), "http://agent"
    if agent_url.startswith("http://"):
        return httpx.AsyncHTTPTransport(verify=False), agent_url.rstrip("/")
    if agent_url.startswith("https://"):
        return httpx.AsyncHTTPTransport(), agent_url.rstrip("/")
    raise InvalidRequest(f"agent_url {agent_url!r} is neither unix:///abs/path.sock nor http://host:port")


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _exec_body(command: str | list[str], cwd: str | None, env: dict[str, str] | None, stdin: str | None,
               timeout: float | None, max_output_bytes: int | None) -> bytes:
    body: dict = {"command": command}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = env
    if stdin is not None:
        body["stdin"] = stdin
    if timeout is not None:
        body["timeout"] = timeout
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    return json.dumps(body).encode()


class AgentShellSession:
    """A named, stateful shell inside the sandbox (the `ShellSession` protocol)."""

    def __init__(self, sandbox: AgentSandbox, name: str) -> None:
        self.name = name
        self._sandbox = sandbox
        self._path = f"/sessions/{quote(name, safe='')}"

    async def run(self, command: str, *, timeout: float | None = None,
                  max_output_bytes: int | None = None) -> SessionResult:
        body: dict = {"command": command}
        if timeout is not None:
            body["timeout"] = timeout
        if max_output_bytes is not None:
            body["max_output_bytes"] = max_output_bytes
        resp = await self._sandbox._call("POST", f"{self._path}/run", json_body=body,
                                         timeout=_command_timeout(timeout))
        return SessionResult.model_validate_json(resp.content)

    async def interrupt(self) -> None:
        await self._sandbox._call("POST", f"{self._path}/interrupt")

    async def close(self) -> None:
        await self._sandbox._call("DELETE", self._path)


class AgentSandbox:
    """A sandbox reached through its agent at `agent_url` (`unix:///abs/path.sock` or `http://host:port`).

    `on_close` is an async callback run once by `close()` after the connection is closed (the SDK passes
    one that deletes the sandbox)."""

    def __init__(self, sandbox_id: str, agent_url: str, token: str, *, workdir: str = "/workspace",
                 on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.id = sandbox_id
        self.agent_url = agent_url
        self.workdir = workdir
        self._on_close = on_close
        self._closed = False
        transport, base_url = _transport_for(agent_url)
        # trust_env=False: a proxy from the environment must never sit between a client and its sandbox.
        self._client = httpx.AsyncClient(
            transport=transport, base_url=base_url, timeout=_DEFAULT_TIMEOUT, trust_env=False,
            headers={"Authorization": f"Bearer {token}"})
        self._exec_url = httpx.URL(base_url + "/exec")
        self._json_headers = {"Content-Type": "application/json"}

    # -- commands ---------------------------------------------------------------------------------------

    async def exec(self, command: str | list[str], *, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | None = None,
                   timeout: float | None = None, max_output_bytes: int | None = None) -> ExecResult:
        """Run a command to completion. A timeout is not an error: the result has `timed_out=True`."""
        request = self._client.build_request(
            "POST", self._exec_url, content=_exec_body(command, cwd, env, stdin, timeout, max_output_bytes),
            headers=self._json_headers, timeout=_command_timeout(timeout))
        resp = await self._send(request)
        return ExecResult.model_validate_json(resp.content)

    async def exec_stream(self, command: str | list[str], *, cwd: str | None = None,
                          env: dict[str, str] | None = None,
                          timeout: float | None = None) -> AsyncIterator[ExecEvent]:
        """Yield output as it comes (`stdout` / `stderr` events), then one `exit` event with the result."""
        request = self._client.build_request(
            "POST", "/exec/stream", content=_exec_body(command, cwd, env, None, timeout, None),
            headers=self._json_headers, timeout=_command_timeout(timeout))
        resp = await self._send(request, stream=True)
        try:
            with self._lost_on_transport_error():
                async for line in resp.aiter_lines():
                    if line:
                        yield ExecEvent.model_validate_json(line)
        finally:
            await resp.aclose()

    async def shell(self, name: str = "default", *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> AgentShellSession:
        """Start a persistent shell session; its cwd and exported variables survive between `run`s."""
        body: dict = {"name": name}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = env
        await self._call("POST", "/sessions", json_body=body)
        return AgentShellSession(self, name)

    async def list_sessions(self) -> list[str]:
        return json.loads((await self._call("GET", "/sessions")).content)["sessions"]

    async def health(self) -> dict:
        return json.loads((await self._call("GET", "/health")).content)

    # -- files ------------------------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        return (await self._call("GET", "/files", params={"path": path})).content

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write atomically (readers never see half a file); parent directories are created."""
        content = data.encode() if isinstance(data, str) else data
        await self._call("PUT", "/files", params=self._file_params(path, mode), content=content)

    async def stat(self, path: str) -> FileInfo:
        resp = await self._call("GET", "/files/stat", params={"path": path})
        return FileInfo.model_validate_json(resp.content)

    async def list_dir(self, path: str) -> list[FileInfo]:
        resp = await self._call("GET", "/files/list", params={"path": path})
        return [FileInfo.model_validate(entry) for entry in json.loads(resp.content)["entries"]]

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        params = {"path": path, "recursive": "1"} if recursive else {"path": path}
        await self._call("DELETE", "/files", params=params)

    async def upload(self, local_path: str | Path, remote_path: str) -> None:
        """Copy a local file or directory tree to `remote_path`, streamed: memory stays flat at any size."""
        local = Path(local_path)
        try:
            st = local.stat()
        except FileNotFoundError:
            raise NotFound(f"cannot upload {local}: it does not exist on this machine") from None
        if local.is_dir():
            chunks = tar_stream.directory_tar_chunks(local)
            try:
                await self._call("PUT", "/tar", params={"path": remote_path}, content=chunks,
                                 headers={"Content-Type": "application/x-tar"})
            except OSError as exc:  # raised by the tar worker: a local file could not be read
                raise InvalidRequest(f"cannot upload {local}: {exc}; the remote directory was left unchanged"
                                     ) from exc
            finally:
                await chunks.aclose()
        elif local.is_file():
            with open(local, "rb") as source:
                await self._call("PUT", "/files", params=self._file_params(remote_path, st.st_mode & 0o777),
                                 content=_file_chunks(source, st.st_size, local),
                                 headers={"Content-Length": str(st.st_size),
                                          "Content-Type": "application/octet-stream"})
        else:
            raise InvalidRequest(f"cannot upload {local}: it is neither a regular file nor a directory")

    async def download(self, remote_path: str, local_path: str | Path) -> None:
        """Copy a remote file or directory tree to `local_path`, streamed, never leaving a half-written
        result: a file is renamed into place when complete; a tree is extracted beside it, then moved in
        (merged into an existing directory)."""
        info = await self.stat(remote_path)
        local = Path(local_path)
        local.parent.mkdir(parents=True, exist_ok=True)
        if info.is_dir:
            if local.exists() and not local.is_dir():
                raise InvalidRequest(f"cannot download directory {remote_path} to {local}: that is a file")
            await self._download_tree(remote_path, local, info.mode & 0o777)
        else:
            if local.is_dir():
                raise InvalidRequest(f"cannot download file {remote_path} to {local}: that is a directory; "
                                     "pass the full destination file path")
            await self._download_file(remote_path, local, info.mode & 0o777)

    # -- lifecycle --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection, then run `on_close` (once, however often `close` is called)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._client.aclose()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                await on_close()

    async def __aenter__(self) -> AgentSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AgentSandbox(id={self.id!r}, agent_url={self.agent_url!r})"

    # -- internals --------------------------------------------------------------------------------------

    async def _call(self, method: str, path: str, *, params: dict | None = None, json_body: dict | None = None,
                    content: bytes | AsyncIterator[bytes] | None = None, headers: dict | None = None,
                    timeout: httpx.Timeout = _DEFAULT_TIMEOUT) -> httpx.Response:
        if json_body is not None:
            content, headers = json.dumps(json_body).encode(), self._json_headers
        request = self._client.build_request(method, path, params=params, content=content, headers=headers,
                                             timeout=timeout)
        return await self._send(request)

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        if self._closed:
            raise InvalidRequest(f"sandbox {self.id} was closed; create or attach a new one to use it")
        for delay in (*_CONNECT_RETRY_DELAYS_S, None):
            try:
                resp = await self._client.send(request, stream=stream)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached the agent, so trying again cannot run anything twice.
                if delay is None:
                    raise self._lost(f"could not be reached ({_describe(exc)})") from exc
                await asyncio.sleep(delay)
            except httpx.TimeoutException as exc:
                raise self._lost(f"did not answer in time ({type(exc).__name__})") from exc
            except httpx.TransportError as exc:
                raise self._lost(f"dropped the connection ({_describe(exc)})") from exc
        if resp.status_code >= 400:
            if stream:
                try:
                    with self._lost_on_transport_error():
                        await resp.aread()
                finally:
                    await resp.aclose()
            raise self._error_from(resp)
        return resp

    def _error_from(self, resp: httpx.Response) -> OrchardError:
        try:
            body = json.loads(resp.content)
            return error_from_code(str(body["error"]), str(body["message"]))
        except (ValueError, KeyError, TypeError):
            cls = _ERROR_BY_STATUS.get(resp.status_code, OrchardError)
            return cls(f"the agent of sandbox {self.id} answered HTTP {resp.status_code} without an error "
                       f"body: {resp.content[:200]!r}")

    def _lost(self, what: str) -> SandboxLost:
        return SandboxLost(f"sandbox {self.id}: its agent at {self.agent_url} {what}. The sandbox was probably "
                           "deleted, expired or crashed; its processes and files are gone. Create a new sandbox "
                           "(and check the orchestrator's record of this one for the reason).")

    @contextlib.contextmanager
    def _lost_on_transport_error(self) -> Iterator[None]:
        """A transport failure while a response body streams means the agent is gone (never retried)."""
        try:
            yield
        except httpx.TimeoutException as exc:
            raise self._lost(f"stopped answering in the middle of a response ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise self._lost(f"dropped the connection in the middle of a response ({_describe(exc)})"
                             ) from exc

    @staticmethod
    def _file_params(path: str, mode: int | None) -> dict[str, str]:
        return {"path": path} if mode is None else {"path": path, "mode": f"{mode:04o}"}

    async def _download_file(self, remote_path: str, local: Path, mode: int) -> None:
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as sink:
                resp = await self._send(self._client.build_request("GET", "/files", params={"path": remote_path}),
                                        stream=True)
                try:
                    with self._lost_on_transport_error():
                        async for chunk in resp.aiter_bytes(tar_stream.CHUNK):
                            await asyncio.to_thread(sink.write, chunk)
                finally:
                    await resp.aclose()
            os.chmod(tmp, mode or 0o644)
            os.replace(tmp, local)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)

    async def _download_tree(self, remote_path: str, local: Path, mode: int) -> None:
        tmp = Path(tempfile.mkdtemp(dir=local.parent, prefix=f".{local.name}.", suffix=".part"))
        try:
            resp = await self._send(self._client.build_request("GET", "/tar", params={"path": remote_path}),
                                    stream=True)
            try:
                with self._lost_on_transport_error():
                    await tar_stream.extract_tar_chunks(resp.aiter_raw(), tmp)
            except tarfile.FilterError as exc:
                raise InvalidRequest(f"refusing to download {remote_path}: {exc}, which could reach outside "
                                     f"{local}; nothing was written there") from exc
            except tarfile.TarError as exc:
                raise OrchardError(f"the tar stream of {remote_path} from sandbox {self.id} is broken: {exc}; "
                                   "nothing was written; try again") from exc
            finally:
                await resp.aclose()
            os.chmod(tmp, mode or 0o755)
            await asyncio.to_thread(tar_stream.place_tree, tmp, local)
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)


async def _file_chunks(source, size: int, local: Path) -> AsyncIterator[bytes]:
    """Exactly `size` bytes of `source` (the Content-Length already sent), read off the event loop."""
    remaining = size
    while remaining > 0:
        chunk = await asyncio.to_thread(source.read, min(tar_stream.CHUNK, remaining))
        if not chunk:
            raise InvalidRequest(f"{local} shrank while it was being uploaded; nothing was written remotely, "
                                 "upload it again once it is stable")
        remaining -= len(chunk)
        yield chunk
