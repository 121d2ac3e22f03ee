"""The Docker backend: one container per sandbox through the Docker Engine API (docs/docker.md).

`DockerBackend` (backend.py) is what the entry point `orchard.sandbox.backends.docker:DockerBackend` names. It is
imported when first asked for, so that a helper of this package comes without the backend. The package's
modules import one another by their full names, never through this package (which imports the backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard.sandbox.backends.docker.backend import DockerBackend

__all__ = ["DockerBackend"]


def __getattr__(name: str):
    if name == "DockerBackend":
        from orchard.sandbox.backends.docker.backend import DockerBackend

        return DockerBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
