"""Export an evaluation run's trajectories as ATIF documents: one JSON file per trajectory, for tools that
read ATIF (Harbor's viewers and validators, other trainers).

`export_atif(run_dir, out_dir)` reads `RUN_DIR/trajectories.jsonl` (what `orchard eval` writes) and writes
`OUT_DIR/<task id>--<rollout key>.json` for each trajectory, with every character outside `A-Z a-z 0-9 . _ -`
replaced by `_` (a name taken twice gets `-2`, `-3`, ...). Each file is written atomically, so an
interrupted export leaves whole files only; running it again rewrites them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from orchard.core.atif import to_atif
from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import Trajectory
from orchard.eval.results import TRAJECTORIES_FILE

MAX_NAME_CHARS = 200  # file systems allow 255 bytes a name
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def read_run_trajectories(run_dir: str | Path) -> list[Trajectory]:
    """The trajectories of an `orchard eval` output directory; a clear error when it is not one."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise NotFound(f"{run_dir} does not exist; give the --out directory of an `orchard eval` run")
    if not run_dir.is_dir():
        raise InvalidRequest(f"{run_dir} is not a directory; give the --out directory of an `orchard eval` run")
    path = run_dir / TRAJECTORIES_FILE
    if not path.is_file():
        raise NotFound(f"{run_dir} has no {TRAJECTORIES_FILE}: it is not the output directory of an "
                       "`orchard eval` run (or the run has not finished a task yet)")
    return read_jsonl(path)


def atif_file_name(trajectory: Trajectory, index: int) -> str:
    """`<task id>--<rollout key>.json` with unsafe characters replaced; `trajectory-<n>` parts when unknown."""
    parts = [trajectory.task_id or f"trajectory-{index + 1}"]
    if trajectory.rollout_key:
        parts.append(trajectory.rollout_key)
    stem = _UNSAFE.sub("_", "--".join(parts)).lstrip(".") or f"trajectory-{index + 1}"
    return stem[:MAX_NAME_CHARS] + ".json"


def export_atif(run_dir: str | Path, out_dir: str | Path, *, version: str | None = None,
                on_written: Callable[[Path, int, int], None] | None = None) -> list[Path]:
    """Write one ATIF file per trajectory of the run into `out_dir` (created if needed); the files written.
    `version`: the ATIF version to write (default: each trajectory's declared one). `on_written(path, done,
    total)` is called after each file (progress)."""
    trajectories = read_run_trajectories(run_dir)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidRequest(f"{out_dir} exists and is not a directory; give a directory to write the files into")
    documents = [to_atif(trajectory, version=version) for trajectory in trajectories]  # all or nothing
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    taken: set[str] = set()
    for index, (trajectory, document) in enumerate(zip(trajectories, documents)):
        name = atif_file_name(trajectory, index)
        stem, number = name[:-len(".json")], 2
        while name in taken:
            name, number = f"{stem}-{number}.json", number + 1
        taken.add(name)
        path = out_dir / name
        atomic_write_bytes(path, (json.dumps(document, ensure_ascii=False, indent=2) + "\n").encode())
        written.append(path)
        if on_written is not None:
            on_written(path, index + 1, len(trajectories))
    return written
