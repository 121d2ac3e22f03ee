"""Where an orchestrator keeps its state: `$ORCHARD_HOME` (default `~/.orchard`) holds the SQLite
database and whatever its backend's config puts there (the local backend's sandbox directories, the agent
bundle cache). An embedded SDK and `orchard serve` on the same home share both, safely (each service
instance manages its own sandboxes)."""

from __future__ import annotations

from pathlib import Path

from orchard.core.backend import BackendConfig
from orchard.core.home import resolve_home  # noqa: F401  (re-exported: the server's callers use it)
from orchard.sandbox.backends.registry import backend_config

STATE_DB_NAME = "state.db"


def state_db_path(home: Path) -> Path:
    return home / STATE_DB_NAME


def resolved_backend_config(backend: BackendConfig | str | None, home: Path) -> BackendConfig:
    """`backend` as a config: a config as given, a name (default `local`) with that backend's defaults
    for `home` and the environment. A config that takes a `home` (the local backend's, which hides it from
    sandboxes: its state db holds every sandbox's token) and has none is given this one."""
    if isinstance(backend, BackendConfig):
        if "home" in type(backend).model_fields and getattr(backend, "home") is None:
            return backend.model_copy(update={"home": home})
        return backend
    return backend_config(backend or "local", home)
