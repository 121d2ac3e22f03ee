"""A named set of tasks, stored as a directory:

    my-suite/
      suite.json     {"name": "my-suite", "description": "...", "format": "orchard",
                      "pass_threshold": 1.0}                                          (optional)
      tasks.jsonl    one task per line

With `"format": "orchard"` (the default) each line is a `Task` in JSON; with `"format": "swebench"` each
line is a SWE-bench instance (as the dataset's JSONL export has them), turned into a task by
`Task.from_swebench`. Without suite.json the suite is named after its directory.

A rollout's reward is in [0, 1] (SWE tasks: 0 or 1); it is resolved when the reward is at least the suite's
`pass_threshold` (default 1.0: only a full reward passes; a suite of partial scores may pass at, say, 0.8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.errors import InvalidRequest, NotFound, first_problem
from orchard.core.jsonl import read_jsonl, write_jsonl
from orchard.core.task import SWEBenchInstance, Task

MANIFEST_FILE = "suite.json"
TASKS_FILE = "tasks.jsonl"


class SuiteManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    format: Literal["orchard", "swebench"] = "orchard"
    pass_threshold: float = Field(default=1.0, gt=0, le=1, description="the least reward that resolves a task")


class TaskSuite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    pass_threshold: float = Field(default=1.0, gt=0, le=1, description="the least reward that resolves a task")
    tasks: list[Task] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_ids(self) -> TaskSuite:
        seen: set[str] = set()
        for task in self.tasks:
            if task.id in seen:
                raise ValueError(f"suite {self.name!r} has two tasks with id {task.id!r}")
            seen.add(task.id)
        return self

    def get(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        sample = ", ".join(task.id for task in self.tasks[:5]) + (", ..." if len(self.tasks) > 5 else "")
        raise NotFound(f"suite {self.name!r} has no task {task_id!r} (it has {len(self.tasks)}: {sample})")

    @classmethod
    def load(cls, directory: str | Path) -> TaskSuite:
        directory = Path(directory)
        if not directory.is_dir():
            raise NotFound(f"task suite directory {directory} does not exist (a suite is a directory with "
                           f"{TASKS_FILE} and optionally {MANIFEST_FILE})")
        manifest = _read_manifest(directory)
        tasks_path = directory / TASKS_FILE
        if not tasks_path.is_file():
            raise InvalidRequest(f"{directory} is not a task suite: {TASKS_FILE} is missing (one task per line)")
        if manifest.format == "swebench":
            instances = read_jsonl(tasks_path, SWEBenchInstance, allow_interrupted_tail=False)
            tasks = [Task.from_swebench(instance) for instance in instances]
        else:
            try:
                tasks = read_jsonl(tasks_path, Task, allow_interrupted_tail=False)
            except InvalidRequest as exc:
                if b'"instance_id"' in tasks_path.read_bytes()[:65536]:
                    raise InvalidRequest(f"{exc}; these look like SWE-bench instances: put "
                                         f'{{"format": "swebench"}} in {directory / MANIFEST_FILE}') from None
                raise
        try:
            return cls(name=manifest.name, description=manifest.description,
                       pass_threshold=manifest.pass_threshold, tasks=tasks)
        except ValidationError as exc:
            raise InvalidRequest(f"{directory}: {first_problem(exc, 'suite')}") from None

    def save(self, directory: str | Path) -> None:
        """Write the suite in the `orchard` format; each file is replaced atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_jsonl(directory / TASKS_FILE, self.tasks)
        manifest = SuiteManifest(name=self.name, description=self.description, pass_threshold=self.pass_threshold)
        atomic_write_bytes(directory / MANIFEST_FILE, (manifest.model_dump_json(indent=2) + "\n").encode())


def _read_manifest(directory: Path) -> SuiteManifest:
    path = directory / MANIFEST_FILE
    if not path.exists():
        return SuiteManifest(name=directory.resolve().name)
    try:
        return SuiteManifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except ValueError as exc:  # JSON errors and ValidationError alike
        raise InvalidRequest(f"{path} is not a valid suite manifest: {exc}") from None
