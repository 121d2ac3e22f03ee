"""Orchard: train and evaluate LLM agents across harnesses.

`import orchard` stays cheap: the SDK names below are imported on first use."""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

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


def __getattr__(name: str):
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'orchard' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
