"""Backends by name. Built-ins are imported lazily so that e.g. the `kubernetes` client is only needed
when that backend is used."""

from __future__ import annotations

import importlib

from orchard.core.errors import InvalidRequest
from orchard.sandbox.backends.base import Backend

BUILTIN_BACKENDS = {
    "local": "orchard.sandbox.backends.local:LocalBackend",
    "kubernetes": "orchard.sandbox.backends.kubernetes:from_env",
}


def available_backends() -> list[str]:
    return sorted(BUILTIN_BACKENDS)


def create_backend(name: str, **options) -> Backend:
    target = BUILTIN_BACKENDS.get(name)
    if target is None:
        raise InvalidRequest(f"unknown backend {name!r}; available: {', '.join(available_backends())}")
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)(**options)
