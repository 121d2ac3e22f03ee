"""The model gateway an evaluation runs for itself: `orchard.gateway`'s HTTP app served by uvicorn on a free
loopback port, in a background thread with its own event loop.

A thread (rather than a task on the runner's loop) keeps model calls answered while the runner's loop is
busy, and keeps slow in-process models (the embedded policy) from stalling the runner. The runner reads the
records straight from the in-process `Gateway` object (its recorder and ledger are thread-safe)."""

from __future__ import annotations

import secrets

from pydantic import SecretStr

from orchard.core.errors import NotFound
from orchard.core.trajectory import LLMCall
from orchard.gateway.config import GatewayConfig
from orchard.util.uvicorn_thread import ServerThread

START_TIMEOUT_S = 120.0  # the app's start imports litellm, seconds on a busy machine
STOP_TIMEOUT_S = 15.0


class LocalGateway:
    """`with LocalGateway(config) as gw:` serves `config` at `gw.base_url` (`http://127.0.0.1:PORT/v1`),
    protected by a fresh API key (`gw.api_key`) so other local processes cannot bill calls to the run."""

    def __init__(self, config: GatewayConfig) -> None:
        from orchard.gateway.gateway import Gateway

        self.api_key = secrets.token_urlsafe(24)
        self.gateway = Gateway(config.model_copy(update={"api_key": SecretStr(self.api_key)}))
        self._server: ServerThread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> None:
        from orchard.gateway.app import create_app

        # At stop every rollout is over: a call still in flight has no one waiting for it, so it is not
        # waited for long.
        self._server = ServerThread(create_app(self.gateway), name="orchard-eval-gateway",
                                    what="the evaluation's model gateway", start_timeout_s=START_TIMEOUT_S,
                                    stop_timeout_s=STOP_TIMEOUT_S, timeout_graceful_shutdown=1, lifespan="on")
        self._server.start()
        self.port = self._server.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

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
