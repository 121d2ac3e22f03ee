"""`orchard gateway`: serve the model gateway (OpenAI-compatible, records every call per rollout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchard.cli.sandbox import err, fail
from orchard.core.errors import OrchardError


def gateway(
    host: Annotated[str, typer.Option(help="Address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 4000,
    config: Annotated[Optional[Path], typer.Option(
        help="Gateway config (JSON/YAML): model aliases, budgets, API key. See docs/gateway.md.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    socket: Annotated[Optional[Path], typer.Option(
        dir_okay=False, help="Also listen on this Unix socket, for sandboxes with model-only networking "
                             "(`orchard serve --model-gateway unix:PATH`). Put it in a directory only you can "
                             "enter: the socket itself accepts any user. See docs/networking.md.")] = None,
) -> None:
    """Serve the model gateway (OpenAI-compatible, records every call).

    /v1/chat/completions in front of litellm, recording every call under its rollout key (header
    X-Orchard-Rollout-Key, or base URL /r/<key>/v1)."""
    from orchard.gateway.config import GatewayConfig
    from orchard.gateway.server import serve

    try:
        loaded = GatewayConfig.load(config) if config is not None else GatewayConfig()
    except OrchardError as exc:
        fail(str(exc))
    aliases = ", ".join(sorted(loaded.models)) or "none"
    err.print(f"model gateway on http://{escape(host)}:{port}/v1 — aliases: {escape(aliases)}"
              f"{' (any litellm model allowed)' if loaded.allow_any_model else ''}"
              f"{f' and unix:{escape(str(socket))}' if socket else ''}")
    try:
        serve(host, port, loaded, log_level=log_level, unix_socket=socket)
    except OrchardError as exc:
        fail(str(exc))
