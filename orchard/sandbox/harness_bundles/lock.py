"""Making a harness bundle's lock: its top-level pins resolved once, the way the builder installs them (the
bundle's own Python and pip, for Linux x86_64), into every distribution they bring, each pinned exactly. A
spec with `locked=True` and these as its requirements is then installed with `--no-deps`: pip resolves
nothing, and the bundle is the same whenever it is built (docs/harness-bundles.md, "Locks")."""

from __future__ import annotations

import tempfile
from pathlib import Path

from orchard.core.harness_bundle import HarnessBundleSpec
from orchard.sandbox.harness_bundles.build import Progress, ensure_bundle
from orchard.sandbox.harness_bundles.store import downloads_dir


def resolve_lock(spec: HarnessBundleSpec, requirements: list[str], cache_dir: Path,
                 progress: Progress = lambda step: None) -> list[str]:
    """Every distribution `requirements` (exact top-level pins) resolve to in `spec`'s bundle, as sorted
    `name==version` pins. A throw-away bundle is built in a temp dir of `cache_dir` and removed; its downloads
    stay in `cache_dir`'s."""
    unlocked = HarnessBundleSpec.model_validate({**spec.model_dump(), "requirements": requirements,
                                                 "locked": False})
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".harness-lock-", dir=cache_dir) as scratch:
        built = ensure_bundle(unlocked, Path(scratch), progress, downloads=downloads_dir(cache_dir))
        installed = built.manifest.installed
    return [f"{name}=={version}" for name, version in sorted(installed.items(), key=lambda kv: kv[0].lower())]
