"""Backends by name, from the entry-point group `orchard.backends` (the built-ins are registered there
too, in pyproject.toml). Listing names imports nothing; a backend's module (and e.g. the `kubernetes` or
`docker` client it needs) is imported only when that backend is used."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from orchard.core.backend import ENTRY_POINT_GROUP, Backend, BackendCapabilities, BackendConfig, BackendPlugin
from orchard.core.errors import InvalidRequest, OrchardError, PluginError, describe_validation_errors
from orchard.core.home import resolve_home
from orchard.core.plugins import PluginInfo, Registry, check_name, is_import_path


BACKENDS = Registry("backend", ENTRY_POINT_GROUP, "docs/writing-a-backend.md")


def available_backends() -> list[str]:
    return BACKENDS.names()


def backend_class(name: str) -> type[BackendPlugin]:
    """The class of backend `name` (a registered name or an import path `module:Class`): InvalidRequest naming
    the available ones when unknown, PluginError when it cannot be loaded or is no backend."""
    cls, entry = BACKENDS.load(name, hint=f"install what it needs (e.g. pip install 'orchard[{name}]')")
    for attr in ("Config", "from_config", "name"):
        if not hasattr(cls, attr):
            raise PluginError(f"{BACKENDS.where(entry)} is not a backend plug-in: it has no {attr!r} (see "
                              "docs/writing-a-backend.md)")
    check_name(BACKENDS, entry, cls.name)
    if is_import_path(name):  # its config records its own name: find it by that from now on
        BACKENDS.remember(entry, cls.name)
    return cls


def list_backends(home: Path | None = None) -> list[PluginInfo]:
    """Every registered backend with what it enforces and its config fields (each is loaded)."""
    infos = []
    for entry in BACKENDS.entries():
        try:
            cls, caps = backend_class(entry.name), capabilities_of(entry.name, home)
        except OrchardError as exc:
            infos.append(BACKENDS.info(entry, problem=str(exc)))
            continue
        fields = ", ".join(f for f in cls.Config.model_fields if f != "backend")
        infos.append(BACKENDS.info(entry, detail=(
            f"network: {', '.join(sorted(caps.network_modes))}; limits: {', '.join(sorted(caps.limits))}; "
            f"images: {', '.join(sorted(caps.image_kinds))}; config: {fields}")))
    return sorted(infos, key=lambda info: info.name)


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
    cls = backend_class(name)
    config_cls = cls.Config  # `backend` is the discriminator: it picks the config class
    defaults = config_cls.from_env(home, os.environ if environ is None else environ)
    return _validated(config_cls, {**defaults.model_dump(), **data, "backend": cls.name},
                      f"the {name} backend's config")


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
    home = resolve_home(home)
    backend = create_backend(backend_config(name, home))
    return backend.capabilities
