"""`serve`: run the gateway's HTTP API with uvicorn (what `orchard gateway` calls)."""

from __future__ import annotations

from pathlib import Path

from orchard.gateway.config import GatewayConfig


def serve(host: str = "127.0.0.1", port: int = 4000, config: GatewayConfig | str | Path | None = None, *,
          log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM. `config` is a GatewayConfig, a path to a JSON/YAML config file, or None
    (no aliases: then nothing is served until a config allows models). litellm is imported before the
    server accepts connections, so the first call is not slowed by it."""
    import uvicorn

    from orchard.gateway.app import create_app
    from orchard.gateway.gateway import Gateway
    from orchard.util.logs import log_to_stderr

    if not isinstance(config, GatewayConfig):
        config = GatewayConfig.load(config) if config is not None else GatewayConfig()
    log_to_stderr(log_level)
    app = create_app(Gateway(config))
    uvicorn.run(app, host=host, port=port, access_log=False, log_level=log_level, timeout_graceful_shutdown=10)
