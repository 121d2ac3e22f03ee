"""The model gateway in local sandboxes (`network.gateway`): the gateway's Unix socket (the backend's
`model_gateway`, `unix:/PATH`; gateway_socket.py) is bound read-only into the sandbox at
bwrap.GATEWAY_SOCKET, and the agent relays 127.0.0.1:4000 of the sandbox's own network namespace to it
(`--gateway`, the agent's forward.py). The sandbox gets no host network for it: with mode `none` its
namespace still holds only loopback."""

from __future__ import annotations

from pathlib import Path

from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local.bwrap import GATEWAY_SOCKET
from orchard.sandbox.backends.gateway_socket import configured_socket, socket_for


def model_gateway_socket(model_gateway: str | None) -> Path | None:
    """The configured gateway's socket; InvalidRequest for a form the local backend cannot use."""
    return configured_socket(model_gateway, "local")


def gateway_socket_for(spec: SandboxSpec, configured: Path | None) -> Path | None:
    return socket_for(spec, configured, "local")


def agent_gateway_args(socket: Path | None) -> list[str]:
    return ["--gateway", f"unix:{GATEWAY_SOCKET}"] if socket is not None else []
