"""The model gateway an evaluation runs for itself: `orchard.gateway`'s HTTP app served by uvicorn on a free
loopback port, in a background thread with its own event loop.

A thread (rather than a task on the runner's loop) keeps model calls answered while the runner's loop is
busy, and keeps slow in-process models (the embedded policy) from stalling the runner. The runner reads the
records straight from the in-process `Gateway` object (its recorder and ledger are thread-safe).

The same server also listens on a Unix socket in a private (0700) directory of its own: what sandbox
backends on this machine bind into sandboxes with `network.gateway` (`model_gateway`, `unix:/PATH`). The
socket itself is connectable by any user (a root orchestrator's sandboxes run as host uid 100000); the
directory keeps everyone else out, and every route still needs a key. A sandbox gets its rollout's own key
(`rollout_api_key`), good for that rollout's `/r/<key>/v1` routes only."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

from pydantic import SecretStr

from orchard.core.errors import NotFound
from orchard.core.sandbox import MODEL_GATEWAY_URL
from orchard.core.trajectory import LLMCall
from orchard.gateway.config import GatewayConfig
from orchard.gateway.rollout_keys import rollout_api_key
from orchard.util.connection_guard import guarded_h11
from orchard.util.uvicorn_thread import ServerThread

START_TIMEOUT_S = 120.0  # the app's start imports litellm, seconds on a busy machine
STOP_TIMEOUT_S = 15.0
SOCKET_NAME = "gateway.sock"


class LocalGateway:
    """`with LocalGateway(config) as gw:` serves `config` at `gw.base_url` (`http://127.0.0.1:PORT/v1`),
    protected by a fresh API key (`gw.api_key`) so other local processes cannot bill calls to the run, and
    (unless `unix_socket=False`) on the Unix socket `gw.model_gateway` names, for sandboxes."""

    def __init__(self, config: GatewayConfig, *, unix_socket: bool = True, host: str = "127.0.0.1") -> None:
        from orchard.gateway.gateway import Gateway

        self.api_key = secrets.token_urlsafe(24)
        self.gateway = Gateway(config.model_copy(update={"api_key": SecretStr(self.api_key)}))
        self._server: ServerThread | None = None
        self._unix_socket = unix_socket
        # Where its TCP port listens: loopback, or an address sandboxes elsewhere reach (a Kubernetes node's
        # IP: `model_gateway` is then `gw.url`).
        self.host = host
        self._socket_dir: Path | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def socket_path(self) -> Path | None:
        """The Unix socket it also listens on (None before start or with unix_socket=False)."""
        return self._socket_dir / SOCKET_NAME if self._socket_dir is not None else None

    @property
    def model_gateway(self) -> str | None:
        """The value for a local sandbox backend's `model_gateway` config: `unix:/PATH`."""
        return f"unix:{self.socket_path}" if self.socket_path is not None else None

    def rollout_base_url(self, rollout_key: str, *, inside: bool = True) -> str:
        """The OpenAI base URL of one rollout: as a sandbox with `network.gateway` reaches it (`inside`,
        http://127.0.0.1:4000/r/<key>/v1), or from this machine."""
        return f"{MODEL_GATEWAY_URL if inside else self.url}/r/{quote(rollout_key, safe='')}/v1"

    def rollout_api_key(self, rollout_key: str) -> str:
        """The API key good for `rollout_key`'s own routes only: what a sandbox gets instead of `api_key`."""
        return rollout_api_key(self.api_key, rollout_key)

    def start(self) -> None:
        from orchard.gateway.app import create_app

        if self._unix_socket:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="orchard-gw-"))  # 0700
        # At stop every rollout is over: a call still in flight has no one waiting for it, so it is not
        # waited for long.
        self._server = ServerThread(create_app(self.gateway), host=self.host, name="orchard-eval-gateway",
                                    what="the evaluation's model gateway", start_timeout_s=START_TIMEOUT_S,
                                    stop_timeout_s=STOP_TIMEOUT_S, unix_socket=self.socket_path,
                                    unix_socket_mode=0o666, timeout_graceful_shutdown=1, lifespan="on",
                                    http=guarded_h11(self.gateway.config.connection_guard()))
        try:
            self._server.start()
        except BaseException:
            self._remove_socket_dir()
            raise
        self.port = self._server.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._remove_socket_dir()

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

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
