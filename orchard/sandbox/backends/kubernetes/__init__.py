"""The Kubernetes backend: one Pod per sandbox (docs/kubernetes.md).

`KubernetesBackend` (backend.py) is what the entry point
`orchard.sandbox.backends.kubernetes:KubernetesBackend` names. It is imported when first asked for, so that a
helper of this package comes without the backend. The package's modules import one another by their full
names, never through this package (which imports the backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard.sandbox.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]


def __getattr__(name: str):
    if name == "KubernetesBackend":
        from orchard.sandbox.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
