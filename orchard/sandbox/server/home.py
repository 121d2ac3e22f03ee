"""Where an orchestrator keeps its state: `$ORCHARD_HOME` (default `~/.orchard`) holds the SQLite
database and, for the local backend, the sandboxes' directories. An embedded SDK and `orchard serve` on
the same home share both, safely (each service instance manages its own sandboxes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

STATE_DB_NAME = "state.db"


def resolve_home(home: str | Path | None = None) -> Path:
    if home is None:
        home = os.environ.get("ORCHARD_HOME") or "~/.orchard"
    return Path(home).expanduser().absolute()


def state_db_path(home: Path) -> Path:
    return home / STATE_DB_NAME


def backend_options(backend_name: str, home: Path) -> dict[str, Any]:
    """Options a backend gets from the home alone (the local backend's sandboxes live under it)."""
    if backend_name == "local":
        return {"root_dir": home / "sandboxes", "bundle_cache_dir": home / "cache"}
    if backend_name == "kubernetes":  # the rest comes from ORCHARD_K8S_* and KUBECONFIG
        return {"bundle_cache_dir": home / "cache"}
    return {}
