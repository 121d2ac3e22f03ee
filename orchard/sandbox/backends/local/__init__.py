"""The local backend (the embedded default): bubblewrap sandboxes on this host, no daemon; docs/local-backend.md.

`LocalBackend` (backend.py) is what the entry point `orchard.sandbox.backends.local:LocalBackend` names. It is
imported when first asked for, so that a helper of this package comes without the backend. The package's
modules import one another by their full names, never through this package (which imports the backend)."""

from __future__ import annotations

from orchard.util.lazy import lazy_exports

__all__ = ["LocalBackend"]
__getattr__, __dir__ = lazy_exports(__name__, {"LocalBackend": "orchard.sandbox.backends.local.backend"}, globals())
