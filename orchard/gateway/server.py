"""`serve`: run the gateway's HTTP API with uvicorn (what `orchard gateway` calls)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

from orchard.core.errors import InvalidRequest
from orchard.gateway.config import GatewayConfig


def serve(host: str = "127.0.0.1", port: int = 4000, config: GatewayConfig | str | Path | None = None, *,
          log_level: str = "info", unix_socket: Path | None = None) -> None:
    """Serve until SIGINT/SIGTERM. `config` is a GatewayConfig, a path to a JSON/YAML config file, or None
    (no aliases: then nothing is served until a config allows models). litellm is imported before the
    server accepts connections, so the first call is not slowed by it. With `unix_socket`, the same server
    also listens there (what local sandbox backends bind into sandboxes: `model_gateway: unix:PATH`); the
    socket is connectable by any user, so its directory must keep out whoever should not reach it."""
    import uvicorn

    from orchard.gateway.app import create_app
    from orchard.gateway.gateway import Gateway
    from orchard.util.connection_guard import guarded_h11
    from orchard.util.logs import log_to_stderr

    if not isinstance(config, GatewayConfig):
        config = GatewayConfig.load(config) if config is not None else GatewayConfig()
    log_to_stderr(log_level)
    app = create_app(Gateway(config))
    # h11 with the connection guard: a sandbox cannot hold the socket's connections (see connection_guard.py)
    uvicorn_config = uvicorn.Config(app, host=host, port=port, access_log=False, log_level=log_level,
                                    timeout_graceful_shutdown=10, http=guarded_h11(config.connection_guard()))
    if unix_socket is None:
        _run(uvicorn.Server(uvicorn_config))
        return
    listeners = [_tcp_listener(host, port), _unix_listener(Path(unix_socket))]
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the SIGTERM that stopped it once it is done; exit through the finally below
        # (which removes the socket) instead of dying of it.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        _run(uvicorn.Server(uvicorn_config), sockets=listeners)
    finally:
        for sock in listeners:
            sock.close()
        Path(unix_socket).unlink(missing_ok=True)


def _run(server, **kwargs) -> None:
    """Serve until stopped. uvicorn re-raises the SIGINT that stopped it once it has shut down: a clean stop
    (exit 0), as `uvicorn.run` has it."""
    try:
        server.run(**kwargs)
    except KeyboardInterrupt:
        pass


def _tcp_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # IPPROTO_TCP: asyncio sets NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidRequest(f"the gateway cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _unix_listener(path: Path) -> socket.socket:
    if path.is_socket():
        path.unlink()  # a stopped gateway's
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666)  # sandboxes run as other uids (a root orchestrator's as 100000 and up)
    except OSError as exc:
        sock.close()
        raise InvalidRequest(f"the gateway cannot listen on the socket {path}: {exc.strerror}; give a path in an "
                             "existing directory that is yours") from None
    return sock
