"""An ASGI app served by uvicorn on a loopback port, in a daemon thread with its own event loop: what the
evaluator's own model gateway and test servers use.

`with ServerThread(app) as server:` starts it on a free port (`server.port`, `server.url`), returns once it
accepts connections, and at the end asks it to stop (`should_exit`) and joins the thread. With
`unix_socket`, the same server also listens on that Unix socket path (made by the caller's directory
rules; removed at stop)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from orchard.core.errors import BackendError

START_TIMEOUT_S = 120.0  # an app's start may import litellm: seconds on a busy machine
STOP_TIMEOUT_S = 15.0


class ServerThread:
    """`app` served on `host` (a free port) by a uvicorn server in a thread named `name`; `what` names it in
    errors; `config` is passed on to `uvicorn.Config` (e.g. `lifespan`, `timeout_graceful_shutdown`)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", name: str = "orchard-uvicorn",
                 what: str = "the server", start_timeout_s: float = START_TIMEOUT_S,
                 stop_timeout_s: float = STOP_TIMEOUT_S, unix_socket: Path | None = None,
                 unix_socket_mode: int = 0o600, **config: Any) -> None:
        self.app, self.host, self.name, self.what = app, host, name, what
        self.unix_socket, self.unix_socket_mode = unix_socket, unix_socket_mode
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.config = {"access_log": False, "log_level": "warning", **config}
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Serve; returns once the server accepts connections. A server that fails to start or does not
        start in time is a BackendError (and stopped)."""
        import uvicorn

        # proto IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections accepted from a
        # socket that says it is TCP; without it every answer waits ~40 ms for a delayed ACK (Nagle).
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        self.port = listener.getsockname()[1]
        listeners = [listener]
        if self.unix_socket is not None:
            try:
                listeners.append(_unix_listener(self.unix_socket, self.unix_socket_mode))
            except OSError as exc:
                listener.close()
                raise BackendError(f"{self.what} cannot listen on {self.unix_socket}: {exc}") from exc
        self._server = server = uvicorn.Server(uvicorn.Config(self.app, **self.config))

        def serve() -> None:
            try:
                asyncio.run(server.serve(sockets=listeners))
            except BaseException as exc:  # noqa: BLE001 — reported by start() on the caller's thread
                self._failure = exc
            finally:
                for sock in listeners:
                    sock.close()
                if self.unix_socket is not None:
                    _unlink(self.unix_socket)

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not server.started:
            self._thread.join(0.02)
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise BackendError(f"{self.what} did not start on {self.host}:{self.port}"
                                   f"{f': {self._failure!r}' if self._failure else ' in time'}")

    def stop(self) -> None:
        """Ask the server to finish (it closes its connections gracefully), then force it. Idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.stop_timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(self.stop_timeout_s)
        self._thread = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _unix_listener(path: Path, mode: int) -> socket.socket:
    """A listening Unix socket at `path` with `mode` (set before listen, so no connection ever finds it
    with the umask's). A stale socket file there (a crashed server's) is replaced."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _unlink(path)
        sock.bind(str(path))
        os.chmod(path, mode)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def _unlink(path: Path) -> None:
    try:
        if Path(path).is_socket():
            os.unlink(path)
    except OSError:
        pass
