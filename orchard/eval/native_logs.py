"""A harness's own logs, kept beside its trajectory: a harness that runs a program of its own in the sandbox
lists the files that program wrote (its session logs, events) in `trajectory.extra["native_logs"]` as paths
inside the sandbox; before the agent's sandbox is deleted they are copied into the run's
OUT/native/<rollout key>/, and the list becomes a map from each sandbox path to its copy (relative to OUT).
A file that cannot be copied is named under `native_logs_missing`: it never fails the rollout, whose steps
are already in the trajectory."""

from __future__ import annotations

import logging
import posixpath
from pathlib import Path
from urllib.parse import quote

from orchard.core.errors import OrchardError
from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import Trajectory

NATIVE_LOGS = "native_logs"
NATIVE_LOGS_MISSING = "native_logs_missing"
NATIVE_DIR = "native"
MAX_NATIVE_LOG_BYTES = 256 << 20  # per file or tree: logs, not artefacts

log = logging.getLogger(__name__)


async def keep_native_logs(sandbox: Sandbox, trajectory: Trajectory, out_dir: Path | None, rollout_key: str) -> None:
    """Copy the files `trajectory.extra["native_logs"]` lists out of `sandbox` into
    `out_dir`/native/<rollout key>/ and record where (see the module docstring)."""
    listed = trajectory.extra.get(NATIVE_LOGS)
    if not listed or out_dir is None:
        return
    if not isinstance(listed, list) or not all(isinstance(path, str) for path in listed):
        trajectory.extra[NATIVE_LOGS_MISSING] = [f"extra[{NATIVE_LOGS!r}] must be a list of paths in the sandbox"]
        return
    destination = out_dir / NATIVE_DIR / quote(rollout_key, safe="")
    kept: dict[str, str] = {}
    missing: list[str] = []
    for path in listed:
        name = _unique(posixpath.basename(path.rstrip("/")) or "log", destination, kept.values(), out_dir)
        try:
            await sandbox.download(path, destination / name, max_bytes=MAX_NATIVE_LOG_BYTES)
        except (OrchardError, OSError) as exc:
            log.warning("rollout %s: its native log %s was not kept: %s", rollout_key, path, exc)
            missing.append(f"{path}: {exc}")
        else:
            kept[path] = str((destination / name).relative_to(out_dir))
    trajectory.extra[NATIVE_LOGS] = kept
    if missing:
        trajectory.extra[NATIVE_LOGS_MISSING] = missing


def _unique(name: str, destination: Path, taken, out_dir: Path) -> str:
    """`name`, or `name.2`, `name.3`, ... when another listed path of the rollout had the same file name."""
    taken = set(taken)
    candidate, n = name, 1
    while str((destination / candidate).relative_to(out_dir)) in taken:
        n += 1
        candidate = f"{name}.{n}"
    return candidate
