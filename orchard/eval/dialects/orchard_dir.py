"""Orchard's own task directories, for tasks the other dialects cannot say (services, MCP tools, a grader
reading a service's state):

    task/
      task.json         an Orchard `Task` (orchard/core/task.py) without `id` (the directory's name) and,
                        when instruction.md is there, without `instruction`
      instruction.md    (optional) the instruction
      files/            (optional) placed in the sandbox at /<their path below files/> before setup
      solution/solve.sh (optional) the reference solution, run in the workdir (the grader's
                        `reference_solution` when it names none)

Its files travel in the task like a Harbor task's environment (base64 where they are not text)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from orchard.core.errors import describe_validation_errors
from orchard.core.task import Task
from orchard.eval.dialects.common import INSTRUCTION_MD, TaskDirError, dir_files, read_text, unpack_command

TASK_JSON = "task.json"
FILES_DIR = "files"
SOLVE_SH = "solution/solve.sh"


def is_orchard_dir(directory: Path) -> bool:
    return (directory / TASK_JSON).is_file()


def orchard_dir_task(directory: Path) -> Task:
    try:
        data = json.loads(read_text(directory, TASK_JSON))
    except ValueError as exc:
        raise TaskDirError(f"task {directory.name}: {TASK_JSON} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TaskDirError(f"task {directory.name}: {TASK_JSON} must hold a JSON object (a task)")
    data.setdefault("id", directory.name)
    metadata = data.setdefault("metadata", {})
    if isinstance(metadata, dict):
        metadata.setdefault("dialect", "orchard")
    if (directory / INSTRUCTION_MD).is_file():
        data.setdefault("instruction", read_text(directory, INSTRUCTION_MD))
    if (directory / FILES_DIR).is_dir():
        environment = data.setdefault("environment", {})
        if not isinstance(environment, dict):
            raise TaskDirError(f"task {directory.name}: {TASK_JSON}: environment must be an object")
        environment["files"] = [*environment.get("files", []),
                                *(f.model_dump() for f in dir_files(directory / FILES_DIR, "/"))]
    grader = data.get("grader")
    if isinstance(grader, dict) and "reference_solution" not in grader and (directory / SOLVE_SH).is_file():
        grader["reference_solution"] = unpack_command(directory, ["solution"], f'sh "$ORCHARD_TASK_DIR/{SOLVE_SH}"')
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        raise TaskDirError(f"task {directory.name}: {TASK_JSON}: {describe_validation_errors(exc, limit=1)}") from None
