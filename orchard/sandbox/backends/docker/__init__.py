"""The Docker backend: one container per sandbox through the Docker Engine API (docs/docker.md).

`DockerBackend` (backend.py) is what the entry point `orchard.sandbox.backends.docker:DockerBackend` names. It is
imported when first asked for, so that a helper of this package comes without the backend. The package's
modules import one another by their full names, never through this package (which imports the backend)."""

from __future__ import annotations

from orchard.util.lazy import lazy_exports

__all__ = ["DockerBackend"]
__getattr__, __dir__ = lazy_exports(__name__, {"DockerBackend": "orchard.sandbox.backends.docker.backend"}, globals())
