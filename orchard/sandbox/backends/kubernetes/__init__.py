"""The Kubernetes backend: one Pod per sandbox (docs/kubernetes.md).

`KubernetesBackend` (backend.py) is what the entry point
`orchard.sandbox.backends.kubernetes:KubernetesBackend` names. It is imported when first asked for, so that a
helper of this package comes without the backend. The package's modules import one another by their full
names, never through this package (which imports the backend)."""

from __future__ import annotations

from orchard.util.lazy import lazy_exports

__all__ = ["KubernetesBackend"]
__getattr__, __dir__ = lazy_exports(__name__, {"KubernetesBackend": "orchard.sandbox.backends.kubernetes.backend"},
                                    globals())
