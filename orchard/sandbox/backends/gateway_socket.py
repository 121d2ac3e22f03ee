"""The model gateway as a Unix socket, for backends whose sandboxes run on this machine (local, docker):
their config's `model_gateway` is `unix:/PATH`, the socket is bound into each sandbox with
`network.gateway`, and the agent relays 127.0.0.1:4000 inside to it (`--gateway`, the agent's forward.py).
Such sandboxes get no network for it at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import SandboxSpec


def socket_path(model_gateway: str | None, backend: str) -> Path | None:
    """The socket of `model_gateway` (`unix:/PATH`); ValueError for any other form."""
    if model_gateway is None:
        return None
    kind, _, path = model_gateway.partition(":")
    if kind != "unix" or not path.startswith("/"):
        raise ValueError(f"model_gateway {model_gateway!r} does not fit the {backend} backend: give the gateway's "
                         "Unix socket as unix:/PATH (sandboxes here get it bound in; they have no network to "
                         "reach a TCP address through)")
    return Path(path)


def configured_socket(model_gateway: str | None, backend: str) -> Path | None:
    """`socket_path`, with InvalidRequest for a form the backend cannot use."""
    try:
        return socket_path(model_gateway, backend)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def socket_for(spec: SandboxSpec, configured: Path | None, backend: str) -> Path | None:
    """The socket to bind into this sandbox (None without `network.gateway`), checked before anything of
    the sandbox exists: a gateway that is not listening is the orchestrator's problem, said plainly rather
    than as a failed mount."""
    if not spec.network.gateway:
        return None
    if configured is None:
        raise InvalidRequest(f"network.gateway (or mode 'model') asks for a model network without a gateway: this "
                             f"{backend} backend has no model_gateway configured (orchard serve --model-gateway "
                             "unix:/PATH)")
    try:
        is_socket = stat.S_ISSOCK(os.stat(configured).st_mode)
    except OSError as exc:
        raise BackendError(f"the model gateway's socket {configured} cannot be reached ({exc.strerror}); start "
                           "the gateway (it must listen there) or fix model_gateway") from None
    if not is_socket:
        raise BackendError(f"the model gateway's socket {configured} is not a socket; fix model_gateway")
    return configured
