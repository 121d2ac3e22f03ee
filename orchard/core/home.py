"""Where Orchard keeps its state, resolved in this one place: the directory given, else `$ORCHARD_HOME`,
else `~/.orchard`; `~` expanded and made absolute, so every part (the orchestrator's database, the backends'
sandbox directories, the bundle and model caches, the image store) names the same directory however the
home was given."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = "~/.orchard"


def resolve_home(home: str | Path | None = None) -> Path:
    if home is None or str(home) == "":
        home = os.environ.get("ORCHARD_HOME") or DEFAULT_HOME
    return Path(home).expanduser().absolute()
