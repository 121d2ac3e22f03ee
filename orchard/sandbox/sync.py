"""Synchronous access to the async sandbox API.

`LoopThread` runs one asyncio event loop in a daemon thread; sync code hands it coroutines and blocks on the
result. Every sync object (`SyncSandbox` here, the SDK's sync `Orchard`) shares one loop, so connections
and their keep-alive pools live on a single loop whatever thread calls in."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import AsyncIterator, Awaitable, Iterator, Self, TypeVar

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import (ExecEvent, ExecResult, FileInfo, PortForwarding, Sandbox, ServiceStart,
                                  ServiceStatus, SessionResult, ShellSession)
from orchard.sandbox.agent_client import DOWNLOAD_MAX_BYTES, READ_FILE_MAX_BYTES

T = TypeVar("T")


class LoopThread:
    """One event loop in a daemon thread, started on first use. `run(coro)` returns the coroutine's result
    (or raises its exception) in the calling thread; any number of threads may call it at once."""

    _shared: LoopThread | None = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "orchard-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @classmethod
    def shared(cls) -> LoopThread:
        """The process-wide instance (a new one after `fork`, where the old thread does not exist)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared._pid != os.getpid():
                cls._shared = cls()
            return cls._shared

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        return loop if loop is not None else self._start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for it. If the wait ends early (timeout, Ctrl-C) the coroutine is
        cancelled, so nothing keeps running behind the caller's back."""
        loop = self.loop
        if threading.current_thread() is self._thread:
            if asyncio.iscoroutine(coro):
                coro.close()  # never started: close it so no "never awaited" warning follows
            raise RuntimeError("LoopThread.run was called from inside its own loop; await the coroutine instead")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """A sync iterator over an async one; leaving the loop early closes the async iterator."""
        try:
            while True:
                try:
                    item = self.run(_anext(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                self.run(aclose())

    def close(self) -> None:
        """Stop the loop (cancelling what still runs on it) and join the thread. Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(target=self._serve, args=(loop, ready), name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


class _ClosedOnExit(ABC):
    """`with obj:` closes it on the way out, errors too."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncShellSession(_ClosedOnExit):
    """`ShellSession` for sync code. `interrupt` may be called from another thread while `run` blocks."""

    def __init__(self, session: ShellSession, loop: LoopThread) -> None:
        self.name = session.name
        self._session = session
        self._loop = loop

    def run(self, command: str, *, timeout: float | None = None) -> SessionResult:
        return self._loop.run(self._session.run(command, timeout=timeout))

    def interrupt(self) -> None:
        self._loop.run(self._session.interrupt())

    def close(self) -> None:
        self._loop.run(self._session.close())



class SyncSandbox(_ClosedOnExit):
    """The `Sandbox` API for sync code: each method runs its async twin on `loop` (default: the shared one)."""

    def __init__(self, sandbox: Sandbox, loop: LoopThread | None = None) -> None:
        self.id = sandbox.id
        self.async_sandbox = sandbox
        self.startup = getattr(sandbox, "startup", None)  # see AgentSandbox.startup
        self._loop = loop or LoopThread.shared()

    def exec(self, command: str | list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
             stdin: str | None = None, timeout: float | None = None,
             max_output_bytes: int | None = None) -> ExecResult:
        return self._loop.run(self.async_sandbox.exec(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                                                      max_output_bytes=max_output_bytes))

    def exec_stream(self, command: str | list[str], *, cwd: str | None = None,
                    env: dict[str, str] | None = None, timeout: float | None = None) -> Iterator[ExecEvent]:
        return self._loop.iterate(self.async_sandbox.exec_stream(command, cwd=cwd, env=env, timeout=timeout))

    def read_file(self, path: str, *, max_bytes: int = READ_FILE_MAX_BYTES) -> bytes:
        """See `AgentSandbox.read_file`: at most `max_bytes` (default 64 MiB), else `PayloadTooLarge`."""
        return self._loop.run(self.async_sandbox.read_file(path, max_bytes=max_bytes))

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._loop.run(self.async_sandbox.write_file(path, data, mode=mode))

    def stat(self, path: str) -> FileInfo:
        return self._loop.run(self.async_sandbox.stat(path))

    def list_dir(self, path: str) -> list[FileInfo]:
        return self._loop.run(self.async_sandbox.list_dir(path))

    def cpu_seconds(self) -> float | None:
        return self._loop.run(self.async_sandbox.cpu_seconds())

    def upload(self, local_path: str | Path, remote_path: str) -> None:
        self._loop.run(self.async_sandbox.upload(local_path, remote_path))

    def download(self, remote_path: str, local_path: str | Path, *, max_bytes: int = DOWNLOAD_MAX_BYTES) -> None:
        """See `AgentSandbox.download`: at most `max_bytes` (default 1 GiB), else `PayloadTooLarge` and
        nothing written."""
        self._loop.run(self.async_sandbox.download(remote_path, local_path, max_bytes=max_bytes))

    def shell(self, name: str = "default", *, cwd: str | None = None,
              env: dict[str, str] | None = None) -> SyncShellSession:
        return SyncShellSession(self._loop.run(self.async_sandbox.shell(name, cwd=cwd, env=env)), self._loop)

    def start_service(self, service: ServiceStart) -> ServiceStatus:
        return self._loop.run(self.async_sandbox.start_service(service))

    def services(self) -> list[ServiceStatus]:
        return self._loop.run(self.async_sandbox.services())

    def wait_services(self, names: list[str] | None = None, *, timeout: float = 30.0) -> list[ServiceStatus]:
        return self._loop.run(self.async_sandbox.wait_services(names, timeout=timeout))

    def exec_as_service(self, command: str | list[str], *, env: dict[str, str] | None = None,
                        timeout: float | None = None) -> ExecResult:
        return self._loop.run(self.async_sandbox.exec_as_service(command, env=env, timeout=timeout))

    def listening_ports(self) -> list[int]:
        return self._loop.run(self.async_sandbox.listening_ports())

    def wait_for_port(self, port: int, *, timeout: float = 30.0) -> None:
        self._loop.run(self.async_sandbox.wait_for_port(port, timeout=timeout))

    def open_port(self, port: int) -> socket.socket:
        """A connected blocking socket to `port` inside the sandbox (docs/sandbox-ports.md); PortClosed
        when nothing listens there."""
        port_socket = getattr(self.async_sandbox, "port_socket", None)
        if port_socket is None:
            raise InvalidRequest(f"{type(self.async_sandbox).__name__} has no ports to open")
        return port_socket(port)

    def forward_port(self, port: int, *, host: str = "127.0.0.1", local_port: int = 0) -> PortForwarding:
        """See `AgentSandbox.forward_port`: a local address whose connections reach `port` inside."""
        return self.async_sandbox.forward_port(port, host=host, local_port=local_port)

    def close(self) -> None:
        self._loop.run(self.async_sandbox.close())


    def __repr__(self) -> str:
        return f"SyncSandbox({self.async_sandbox!r})"
