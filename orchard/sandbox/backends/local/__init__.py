"""The local backend (the embedded default): bubblewrap sandboxes on this host, no daemon; docs/local-backend.md.

`LocalBackend` (backend.py) is what the entry point `orchard.sandbox.backends.local:LocalBackend` names. It is
imported when first asked for, so that a helper of this package comes without the backend. The package's
modules import one another by their full names, never through this package (which imports the backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard.sandbox.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str):
    if name == "LocalBackend":
        from orchard.sandbox.backends.local.backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
