"""The model gateway an evaluation runs for itself: `orchard.gateway`'s HTTP app served by uvicorn on a free
loopback port, in a background thread with its own event loop.

A thread (rather than a task on the runner's loop) keeps model calls answered while the runner's loop is
busy, and keeps slow in-process models (the embedded policy) from stalling the runner. The runner reads the
records straight from the in-process `Gateway` object (its recorder and ledger are thread-safe)."""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading

from pydantic import SecretStr

from orchard.core.errors import BackendError, NotFound
from orchard.core.trajectory import LLMCall
from orchard.gateway.config import GatewayConfig

START_TIMEOUT_S = 120.0  # the app's start imports litellm, seconds on a busy machine
STOP_TIMEOUT_S = 15.0


class LocalGateway:
    """`with LocalGateway(config) as gw:` serves `config` at `gw.base_url` (`http://127.0.0.1:PORT/v1`),
    protected by a fresh API key (`gw.api_key`) so other local processes cannot bill calls to the run."""

    def __init__(self, config: GatewayConfig) -> None:
        from orchard.gateway.gateway import Gateway

        self.api_key = secrets.token_urlsafe(24)
        self.gateway = Gateway(config.model_copy(update={"api_key": SecretStr(self.api_key)}))
        self._server = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> None:
        import uvicorn

        from orchard.gateway.app import create_app

        # proto IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections accepted from a
        # socket that says it is TCP; without it every answer waits ~40 ms for a delayed ACK (Nagle).
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        # At stop every rollout is over: a call still in flight has no one waiting for it, so it is not
        # waited for long.
        config = uvicorn.Config(create_app(self.gateway), access_log=False, log_level="warning",
                                timeout_graceful_shutdown=1, lifespan="on")
        self._server = uvicorn.Server(config)

        def serve() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[listener]))
            except BaseException as exc:  # noqa: BLE001 — reported by start() / stop() on the caller's thread
                self._failure = exc
            finally:
                listener.close()

        self._thread = threading.Thread(target=serve, name="orchard-eval-gateway", daemon=True)
        self._thread.start()
        deadline = START_TIMEOUT_S
        while not self._server.started:
            self._thread.join(0.05)
            deadline -= 0.05
            if not self._thread.is_alive() or deadline <= 0:
                self.stop()
                raise BackendError(f"the evaluation's model gateway did not start on 127.0.0.1:{self.port}"
                                   f"{f': {self._failure}' if self._failure else ' in time'}")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(STOP_TIMEOUT_S)
        self._thread = None

    def end_rollout(self, rollout_key: str) -> list[LLMCall]:
        """Every call the rollout made (none if it made none); the gateway forgets the rollout."""
        try:
            return self.gateway.end_rollout(rollout_key).calls
        except NotFound:
            return []

    def __enter__(self) -> LocalGateway:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
