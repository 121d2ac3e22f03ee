"""`AgentSandbox`: the client side of the in-sandbox agent's wire protocol (docs/agent-protocol.md).

One keep-alive `httpx.AsyncClient` per sandbox. The hot path (`exec`) serializes a plain dict itself, sends
to a pre-built URL with pre-built headers and parses the reply straight into `ExecResult`, so a call costs
little more than the HTTP round trip. A connect error is retried (nothing was sent yet); anything that fails
after a request went out is never retried, because commands and writes have side effects.

`AgentSandbox` is the whole Sandbox protocol (exec, streams, files, tar transfers, shell sessions) on one
client, each call's error mapping beside its request; that is why this file passes ~400 lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import tarfile
import tempfile
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import quote

import httpx

from orchard.core.deadline import Deadline
from orchard.core.errors import (
    AuthError, DiskFull, ExecTimeout, InvalidRequest, NotFound, OrchardError, PayloadTooLarge, PortClosed,
    SandboxLost, error_from_code, exception_text,
)
from orchard.core.sandbox import (DOWNLOAD_MAX_BYTES, READ_FILE_MAX_BYTES, ExecEvent, ExecResult, FileInfo,
                                  ServiceStart, ServiceStatus, SessionResult, StartupTimings)
from orchard.sandbox import tar_stream
from orchard.sandbox.ports import PortForward, check_port, connect_attached, connect_port

_CONNECT_RETRY_DELAYS_S = (0.1, 0.4)
_CONNECT_TIMEOUT_S = 10.0
_WRITE_TIMEOUT_S = 60.0
_READ_TIMEOUT_S = 120.0  # files, stat, sessions without a timeout of their own
PORT_STREAM_LIMIT = 1 << 20  # an asyncio reader's buffer (readline/readuntil) on a port's stream
SERVICES_WAIT_MAX_S = 60.0  # the agent answers a services wait within a minute (services_ready.MAX_WAIT_S)
_TIMEOUT_MARGIN_S = 30.0  # on top of a command's own timeout: the agent kills and answers within it
# Caps on what a sandbox can make this process hold or write (a sandbox is untrusted: a 3 GB sparse file
# costs it nothing). Callers raise them per call with `max_bytes`.
_ERROR_BODY_MAX = 1 << 20  # an agent's error bodies are a few hundred bytes
_ERROR_BY_STATUS: dict[int, type[OrchardError]] = {
    400: InvalidRequest, 401: AuthError, 404: NotFound, 408: ExecTimeout, 413: PayloadTooLarge, 507: DiskFull}


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
        self.startup: StartupTimings | None = None  # where its start went, as the orchestrator reported it
        self._on_close = on_close
        self._closed = False
        self._token = token
        self._forwards: list[PortForward] = []
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

    async def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) of every process the sandbox ever ran, from the agent's `/stats`
        (see docs/agent-protocol.md): approximate, in 10 ms ticks; None when the agent cannot tell."""
        value = json.loads((await self._call("GET", "/stats")).content).get("cpu_seconds")
        return float(value) if isinstance(value, (int, float)) else None

    # -- services ---------------------------------------------------------------------------------------

    async def start_service(self, service: ServiceStart) -> ServiceStatus:
        """Start a task service under the services' own user, apart from the commands (docs/services.md);
        InvalidRequest where the sandbox was not made with `services=True`."""
        resp = await self._call("POST", "/services", json_body=service.model_dump(exclude_none=True))
        return ServiceStatus.model_validate_json(resp.content)

    async def services(self) -> list[ServiceStatus]:
        found = json.loads((await self._call("GET", "/services")).content)["services"]
        return [ServiceStatus.model_validate(s) for s in found]

    async def wait_services(self, names: list[str] | None = None, *, timeout: float = 30.0) -> list[ServiceStatus]:
        """Wait until the services named (all for None) are ready (each started with a `port` and maybe a
        `health_check`), one of them ends, or `timeout` seconds pass; their statuses then. The agent checks
        inside the sandbox (its `POST /services/wait`, at most a minute per request), so this asks it once
        a minute rather than polling."""
        deadline = Deadline.after(timeout)
        while True:
            wait = min(max(deadline.time_left_s(), 0.001), SERVICES_WAIT_MAX_S)
            resp = await self._call("POST", "/services/wait", json_body={"names": names, "timeout": wait},
                                    timeout=_command_timeout(wait))
            found = [ServiceStatus.model_validate(s) for s in json.loads(resp.content)["services"]]
            if deadline.expired or all(s.ready for s in found) or not all(s.running for s in found):
                return found

    async def exec_as_service(self, command: str | list[str], *, env: dict[str, str] | None = None,
                              timeout: float | None = None, max_output_bytes: int | None = None) -> ExecResult:
        """`exec` as the services' user, in the agent's own pid namespace: what a grader reading the
        services' state runs."""
        request = self._client.build_request(
            "POST", self._exec_url.copy_with(path="/services/exec"),
            content=_exec_body(command, None, env, None, timeout, max_output_bytes),
            headers=self._json_headers, timeout=_command_timeout(timeout))
        resp = await self._send(request)
        return ExecResult.model_validate_json(resp.content)

    # -- ports ------------------------------------------------------------------------------------------

    async def open_port(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to `port` inside the sandbox, through its agent (docs/sandbox-ports.md): an
        asyncio stream pair; `writer.write_eof()` half-closes it. PortClosed when nothing listens there."""
        sock = await asyncio.to_thread(self.port_socket, port)
        try:
            return await asyncio.open_connection(sock=sock, limit=PORT_STREAM_LIMIT)
        except BaseException:
            sock.close()
            raise

    async def listening_ports(self) -> list[int]:
        """The TCP ports listening inside the sandbox that `open_port` can reach (on a loopback or every
        address), read by the agent without connecting to any."""
        return json.loads((await self._call("GET", "/ports")).content)["listening"]

    async def wait_for_port(self, port: int, *, timeout: float = 30.0) -> None:
        """Wait until a server listens on `port` inside the sandbox (nothing connects to it meanwhile);
        PortClosed after `timeout` seconds."""
        check_port(port)
        deadline = Deadline.after(timeout)
        while port not in await self.listening_ports():
            if deadline.expired:
                raise PortClosed(f"nothing listened on port {port} inside sandbox {self.id} within {timeout:g} s")
            await asyncio.sleep(min(0.05, max(deadline.time_left_s(), 0)))

    async def attach(self, command: str | list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                     timeout: float | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start `command` in the sandbox with its stdin and stdout as a stream pair (the agent's
        `POST /exec/attach`): a long-lived program to talk to, such as an MCP server over stdio. Closing
        the writer ends it; `timeout` bounds the whole attachment."""
        body = _exec_body(command, cwd, env, None, timeout, None)
        sock = await asyncio.to_thread(connect_attached, self.agent_url, self._token, body, self.id)
        try:
            return await asyncio.open_connection(sock=sock, limit=PORT_STREAM_LIMIT)
        except BaseException:
            sock.close()
            raise

    def port_socket(self, port: int) -> socket.socket:
        """`open_port` as a connected blocking socket (it blocks while the agent dials the port)."""
        return connect_port(self.agent_url, self._token, port, self.id)

    def forward_port(self, port: int, *, host: str = "127.0.0.1", local_port: int = 0) -> PortForward:
        """Listen on `host:local_port` (default: a free port on 127.0.0.1) and relay each connection to
        `port` inside the sandbox; see `PortForward`. Closed with this client, or by its own `close()`."""
        if self._closed:
            raise InvalidRequest(f"the client of sandbox {self.id} is closed; connect again to forward ports")
        forward = PortForward(self.agent_url, self._token, port, sandbox_id=self.id, host=host, port=local_port)
        self._forwards.append(forward)
        return forward

    # -- files ------------------------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int = READ_FILE_MAX_BYTES) -> bytes:
        """The contents of a file in the sandbox, at most `max_bytes` (default 64 MiB) of them: a larger file
        raises `PayloadTooLarge` (the agent refuses it before sending, naming its size). The cap is also
        enforced on the bytes as they arrive, so an agent that ignores it still cannot make this process
        hold more. For big files use `download` (streamed to disk) or read a part with `exec`."""
        _check_max_bytes(max_bytes)
        resp = await self._send(self._client.build_request(
            "GET", "/files", params={"path": path, "max_bytes": str(max_bytes)}), stream=True)
        try:
            async with contextlib.aclosing(self._capped_body(resp, max_bytes, f"{path} (read_file)")) as body:
                return b"".join([chunk async for chunk in body])
        finally:
            await resp.aclose()

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

    async def download(self, remote_path: str, local_path: str | Path, *,
                       max_bytes: int = DOWNLOAD_MAX_BYTES) -> None:
        """Copy a remote file or directory tree to `local_path`, streamed, never leaving a half-written
        result: a file is renamed into place when complete; a tree is extracted beside it, then moved in
        (merged into an existing directory).

        At most `max_bytes` (default 1 GiB) of file data are written: a file whose size is over it is
        refused before anything is written; a transfer that goes past it (more bytes than announced; in a
        tree, files adding up to more, sparse ones at their full size, refused as each header arrives; or a
        tar stream over twice the cap plus 1 MiB, the allowance for tar headers) is stopped and its partial
        output removed. Either way it raises `PayloadTooLarge` and `local_path` is left as it was. What
        lands here is plain data: setuid/setgid/sticky bits and group/other write are dropped, owners are
        never applied, device nodes and FIFOs are refused (`InvalidRequest`), and no member or link may
        reach outside `local_path`."""
        _check_max_bytes(max_bytes)
        info = await self.stat(remote_path)
        local = Path(local_path)
        if not info.is_dir and info.size > max_bytes:
            raise PayloadTooLarge(f"cannot download {remote_path} from sandbox {self.id}: it is {info.size} "
                                  f"bytes, over max_bytes={max_bytes}; pass a larger max_bytes if you mean "
                                  "to copy it. Nothing was written.")
        local.parent.mkdir(parents=True, exist_ok=True)
        if info.is_dir:
            if local.exists() and not local.is_dir():
                raise InvalidRequest(f"cannot download directory {remote_path} to {local}: that is a file")
            await self._download_tree(remote_path, local, info.mode & 0o777, max_bytes)
        else:
            if local.is_dir():
                raise InvalidRequest(f"cannot download file {remote_path} to {local}: that is a directory; "
                                     "pass the full destination file path")
            await self._download_file(remote_path, local, info.mode & 0o777, max_bytes)

    # -- lifecycle --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection, then run `on_close` (once, however often `close` is called)."""
        if self._closed:
            return
        self._closed = True
        for forward in self._forwards:
            forward.close()
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
                    raise self._lost(f"could not be reached ({exception_text(exc)})") from exc
                await asyncio.sleep(delay)
            except httpx.TimeoutException as exc:
                raise self._lost(f"did not answer in time ({type(exc).__name__})") from exc
            except httpx.TransportError as exc:
                raise self._lost(f"dropped the connection ({exception_text(exc)})") from exc
        if resp.status_code >= 400:
            if not stream:
                raise self._error_from(resp, resp.content)
            try:
                # At most _ERROR_BODY_MAX of an error body: a streamed read is one a sandbox could make endless.
                content = b""
                with self._lost_on_transport_error():
                    async for chunk in resp.aiter_raw():
                        content += chunk
                        if len(content) > _ERROR_BODY_MAX:
                            break
            finally:
                await resp.aclose()
            raise self._error_from(resp, content)
        return resp

    def _error_from(self, resp: httpx.Response, content: bytes) -> OrchardError:
        try:
            body = json.loads(content)
            return error_from_code(str(body["error"]), str(body["message"]))
        except (ValueError, KeyError, TypeError):
            cls = _ERROR_BY_STATUS.get(resp.status_code, OrchardError)
            return cls(f"the agent of sandbox {self.id} answered HTTP {resp.status_code} without an error "
                       f"body: {content[:200]!r}")

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
            raise self._lost(f"dropped the connection in the middle of a response ({exception_text(exc)})"
                             ) from exc

    @staticmethod
    def _file_params(path: str, mode: int | None) -> dict[str, str]:
        return {"path": path} if mode is None else {"path": path, "mode": f"{mode:04o}"}

    async def _capped_body(self, resp: httpx.Response, max_bytes: int, what: str) -> AsyncIterator[bytes]:
        """The raw body of a streamed response, raising `PayloadTooLarge` as soon as it passes `max_bytes`
        (a declared Content-Length over it fails before any is read). Raw: the agent never compresses, and
        decoding a compressed body could turn one small chunk into gigabytes."""
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise self._over_cap(what, max_bytes, f"its agent announced {declared} bytes")
        if resp.headers.get("Content-Encoding", "identity").lower() != "identity":
            raise OrchardError(f"the agent of sandbox {self.id} sent {what} with Content-Encoding "
                               f"{resp.headers['Content-Encoding']!r}, which the agent protocol never uses; "
                               "nothing was kept")
        received = 0
        with self._lost_on_transport_error():
            async for chunk in resp.aiter_raw(tar_stream.CHUNK):
                received += len(chunk)
                if received > max_bytes:
                    raise self._over_cap(what, max_bytes, "more arrived")
                yield chunk

    def _over_cap(self, what: str, max_bytes: int, detail: str) -> PayloadTooLarge:
        return PayloadTooLarge(f"{what} from sandbox {self.id} is over max_bytes={max_bytes} ({detail}); the "
                               "transfer was stopped and nothing was kept. Pass a larger max_bytes if you mean "
                               "to copy that much.")

    async def _download_file(self, remote_path: str, local: Path, mode: int, max_bytes: int) -> None:
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as sink:
                resp = await self._send(self._client.build_request(
                    "GET", "/files", params={"path": remote_path, "max_bytes": str(max_bytes)}), stream=True)
                try:
                    async with contextlib.aclosing(
                            self._capped_body(resp, max_bytes, f"{remote_path} (download)")) as body:
                        async for chunk in body:
                            await asyncio.to_thread(sink.write, chunk)
                finally:
                    await resp.aclose()
            os.chmod(tmp, _local_mode(mode, is_dir=False))
            os.replace(tmp, local)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)

    async def _download_tree(self, remote_path: str, local: Path, mode: int, max_bytes: int) -> None:
        tmp = Path(tempfile.mkdtemp(dir=local.parent, prefix=f".{local.name}.", suffix=".part"))
        try:
            resp = await self._send(self._client.build_request("GET", "/tar", params={"path": remote_path}),
                                    stream=True)
            # The files' sizes are capped by the extraction; the raw stream is capped too, since headers of
            # endless empty files carry no file data. Tar framing (a header of 0.5-1.5 KiB per member,
            # padding) can outweigh the data of many small files, hence twice the cap.
            chunks = self._capped_body(resp, 2 * max_bytes + _TAR_FRAMING_ALLOWANCE,
                                       f"the tar stream of {remote_path} (download)")
            try:
                await tar_stream.extract_tar_chunks(chunks, tmp, max_bytes=max_bytes)
            except tar_stream.TarTooLarge as exc:
                raise self._over_cap(f"{remote_path} (download)", max_bytes, str(exc)) from exc
            except tarfile.FilterError as exc:
                raise InvalidRequest(f"refusing to download {remote_path} from sandbox {self.id}: {exc}; "
                                     f"only plain files, directories and links that stay inside {local} are "
                                     f"copied. Nothing was written to {local}.") from exc
            except tarfile.TarError as exc:
                raise OrchardError(f"the tar stream of {remote_path} from sandbox {self.id} is broken: {exc}; "
                                   "nothing was written; try again") from exc
            finally:
                await chunks.aclose()
                await resp.aclose()
            os.chmod(tmp, _local_mode(mode, is_dir=True))
            await asyncio.to_thread(tar_stream.place_tree, tmp, local)
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)


_TAR_FRAMING_ALLOWANCE = 1 << 20  # on top of a tree download's raw-stream cap, for the tar headers


def _local_mode(mode: int, *, is_dir: bool) -> int:
    """The mode a downloaded file (or a tree's top directory) gets here, by the rule tarfile's data filter
    applies to a tree's members: no setuid/setgid/sticky bits, no group/other write, usable by its owner."""
    return (mode & 0o755) | (0o700 if is_dir else 0o600)


def _check_max_bytes(max_bytes: int) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise InvalidRequest(f"max_bytes must be a non-negative integer number of bytes, not {max_bytes!r}")


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
