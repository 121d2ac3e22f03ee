"""Orchard: train and evaluate LLM agents across harnesses.

`import orchard` stays cheap: the SDK names below are imported on first use."""

from typing import TYPE_CHECKING

from orchard.core.version import VERSION as __version__
from orchard.util.lazy import lazy_exports

_LAZY_EXPORTS = {
    "Orchard": "orchard.sandbox.client",
    "AsyncOrchard": "orchard.sandbox.client",
    "SandboxSpec": "orchard.core.sandbox",
    "NetworkPolicy": "orchard.core.sandbox",
    "ExecResult": "orchard.core.sandbox",
    "SandboxInfo": "orchard.core.sandbox",
    "OrchardError": "orchard.core.errors",
}

__all__ = ["__version__", *_LAZY_EXPORTS]

if TYPE_CHECKING:
    from orchard.core.errors import OrchardError
    from orchard.core.sandbox import ExecResult, NetworkPolicy, SandboxInfo, SandboxSpec
    from orchard.sandbox.client import AsyncOrchard, Orchard


__getattr__, __dir__ = lazy_exports(__name__, _LAZY_EXPORTS, globals())
