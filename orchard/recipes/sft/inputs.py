"""Where training trajectories come from: `orchard eval` run directories or trajectories.jsonl files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchard.core.errors import InvalidRequest
from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import Trajectory
from orchard.eval.results import TRAJECTORIES_FILE


def trajectory_files(paths: Sequence[str | Path]) -> list[Path]:
    """Each path as a trajectories file: a run directory stands for its trajectories.jsonl."""
    if not paths:
        raise InvalidRequest("no input given; pass run directories of `orchard eval` or trajectories.jsonl files")
    files = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            path = path / TRAJECTORIES_FILE
            if not path.is_file():
                raise InvalidRequest(f"{given} has no {TRAJECTORIES_FILE}; pass the output directory of an "
                                     "`orchard eval` run or a trajectories .jsonl file")
        elif not path.is_file():
            raise InvalidRequest(f"{given} does not exist; pass run directories or trajectories .jsonl files")
        files.append(path)
    return files


def read_training_trajectories(paths: Sequence[str | Path]) -> list[Trajectory]:
    """Every trajectory of every input, in order (an interrupted last line of a file is skipped)."""
    return [trajectory for path in trajectory_files(paths) for trajectory in read_jsonl(path)]
