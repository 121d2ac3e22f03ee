"""Claw task directories (eval/claw-mini; docs/claw.md): tasks acting on the Claw world's services.

    task/
      claw.json          the world and the grading (orchard/worlds/claw/task.py: ClawSpec): services with
                         their seeds (inline, or a JSON file's path relative to the directory) and faults,
                         `checks` (what completes the task), `forbid` (what must not happen)
      instruction.md     the instruction (a line saying who the user is, the time and the services follows)
      seeds/*.json       (optional) seeds too long to write inline
      solution/solve.sh  the reference solution, run in the workdir (the oracle's)

A claw.json or a seed that is not JSON, or not what the service takes, makes the task not runnable, named
with the file and the reason."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from orchard.core.errors import describe_validation_errors
from orchard.core.task import Task
from orchard.eval.dialects.common import INSTRUCTION_MD, TaskDirError, read_text, unpack_command
from orchard.worlds.claw.task import ClawSpec, claw_task

CLAW_JSON = "claw.json"
SOLVE_SH = "solution/solve.sh"


def is_claw_dir(directory: Path) -> bool:
    return (directory / CLAW_JSON).is_file()


def _json(directory: Path, relative: str):
    text = read_text(directory, relative)
    try:
        return json.loads(text)
    except ValueError as exc:
        where = f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else exc
        raise TaskDirError(f"task {directory.name}: {relative} is not valid JSON: {where}") from None


def claw_dir_task(directory: Path) -> Task:
    try:
        spec = ClawSpec.model_validate(_json(directory, CLAW_JSON))
    except ValidationError as exc:
        raise TaskDirError(f"task {directory.name}: {CLAW_JSON}: {describe_validation_errors(exc, limit=1)}") from None
    seeds = {}
    for name, service in spec.services.items():
        if isinstance(service.seed, str):
            seed = _json(directory, service.seed)
            if not isinstance(seed, dict):
                raise TaskDirError(f"task {directory.name}: {service.seed} must hold a JSON object (the {name} seed)")
            seeds[name] = seed
    reference = None
    if (directory / SOLVE_SH).is_file():
        reference = unpack_command(directory, ["solution"], f'sh "$ORCHARD_TASK_DIR/{SOLVE_SH}"')
    try:
        return claw_task(directory.name, read_text(directory, INSTRUCTION_MD), spec, seeds=seeds,
                         reference_solution=reference, metadata={"dialect": "claw"})
    except ValueError as exc:
        raise TaskDirError(f"task {directory.name}: {exc}") from None
