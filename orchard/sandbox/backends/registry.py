"""Backends by name, from the entry-point group `orchard.backends` (the built-ins are registered there
too, in pyproject.toml). Listing names imports nothing; a backend's module (and e.g. the `kubernetes` or
`docker` client it needs) is imported only when that backend is used."""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from orchard.core.backend import ENTRY_POINT_GROUP, Backend, BackendCapabilities, BackendConfig, BackendPlugin
from orchard.core.errors import InvalidRequest, describe_validation_errors


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    return sorted(_entry_points())


def backend_class(name: str) -> type[BackendPlugin]:
    """The registered class of backend `name`; InvalidRequest naming the available ones when unknown."""
    ep = _entry_points().get(name)
    if ep is None:
        raise InvalidRequest(f"unknown backend {name!r}; available: {', '.join(available_backends())} "
                             f"(a third-party backend registers in the entry-point group {ENTRY_POINT_GROUP!r})")
    try:
        cls = ep.load()
    except ImportError as exc:
        raise InvalidRequest(f"the {name} backend cannot be loaded ({exc}); install what it needs "
                             f"(e.g. pip install 'orchard[{name}]')") from exc
    for attr in ("Config", "from_config", "name"):
        if not hasattr(cls, attr):
            raise InvalidRequest(f"backend {name!r} ({ep.value}) is not a backend plug-in: it has no {attr!r} "
                                 "(see docs/writing-a-backend.md)")
    return cls


def backend_config(name: str, home: Path, *, environ: Mapping[str, str] | None = None,
                   **overrides: Any) -> BackendConfig:
    """Backend `name`'s config: its defaults for `home` and the environment, then `overrides`, validated."""
    return parse_backend_config({**overrides, "backend": name}, home, environ=environ)


def parse_backend_config(data: Mapping[str, Any], home: Path, *,
                         environ: Mapping[str, str] | None = None) -> BackendConfig:
    """A config from a mapping (e.g. a JSON file) naming its `backend`: the fields given, on top of that
    backend's defaults for `home` and the environment."""
    name = data.get("backend")
    if not isinstance(name, str):
        raise InvalidRequest("a backend config needs a 'backend' field naming one of: "
                             f"{', '.join(available_backends())}")
    config_cls = backend_class(name).Config  # `backend` is the discriminator: it picks the config class
    defaults = config_cls.from_env(home, os.environ if environ is None else environ)
    return _validated(config_cls, {**defaults.model_dump(), **data}, f"the {name} backend's config")


def _validated(config_cls: type[BackendConfig], data: dict[str, Any], what: str) -> BackendConfig:
    try:
        return config_cls.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {what}: {describe_validation_errors(exc)}") from exc


def create_backend(config: BackendConfig) -> Backend:
    """A backend instance from its config (the class registered under `config.backend`)."""
    return backend_class(config.backend).from_config(config)


def capabilities_of(name: str, home: Path | None = None) -> BackendCapabilities:
    """What backend `name` enforces with its default config (it makes the backend object, which connects
    to nothing until its first call)."""
    home = home if home is not None else Path(os.environ.get("ORCHARD_HOME") or "~/.orchard").expanduser()
    backend = create_backend(backend_config(name, home))
    return backend.capabilities
