"""The model gateway in local sandboxes (`network.gateway`): the gateway's Unix socket (the backend's
`model_gateway`, `unix:/PATH`) is bound read-only into the sandbox at bwrap.GATEWAY_SOCKET, and the agent
relays 127.0.0.1:4000 of the sandbox's own network namespace to it (`--gateway`, the agent's forward.py).
The sandbox gets no host network for it: with mode `none` its namespace still holds only loopback."""

from __future__ import annotations

import stat
import os
from pathlib import Path

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.bwrap import GATEWAY_SOCKET
from orchard.sandbox.backends.local_config import gateway_socket_path


def model_gateway_socket(model_gateway: str | None) -> Path | None:
    """The configured gateway's socket; InvalidRequest for a form the local backend cannot use."""
    try:
        return gateway_socket_path(model_gateway)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def gateway_socket_for(spec: SandboxSpec, configured: Path | None) -> Path | None:
    """The socket to bind into this sandbox (None without `network.gateway`), checked before anything of
    the sandbox exists: a gateway that is not listening is the orchestrator's problem, said plainly rather
    than as a failed bind mount."""
    if not spec.network.gateway:
        return None
    if configured is None:
        raise InvalidRequest("network.gateway (or mode 'model') asks for a model network without a gateway: this "
                             "local backend has no model_gateway configured (orchard serve --model-gateway "
                             "unix:/PATH, or LocalBackend(model_gateway=...))")
    try:
        is_socket = stat.S_ISSOCK(os.stat(configured).st_mode)
    except OSError as exc:
        raise BackendError(f"the model gateway's socket {configured} cannot be reached ({exc.strerror}); start "
                           "the gateway (it must listen there) or fix model_gateway") from None
    if not is_socket:
        raise BackendError(f"the model gateway's socket {configured} is not a socket; fix model_gateway")
    return configured


def agent_gateway_args(socket: Path | None) -> list[str]:
    return ["--gateway", f"unix:{GATEWAY_SOCKET}"] if socket is not None else []
