"""Task-directory suites: a directory of task directories, each in one of three dialects, read as it is
(docs/suites.md):

- Harbor's (harbor.py): `task.toml` with tables, `instruction.md`, `environment/`, `tests/test.sh` writing
  /logs/verifier/reward.txt or reward.json, `solution/solve.sh`;
- claw-bench's (claw_bench.py): a flat `task.toml`, `environment/setup.sh` and `solution/solve.sh` taking the
  workspace as $1, `verifier/test_output.py` run by pytest with `--workspace` (score: checks passed / total);
- Orchard's own (orchard_dir.py): `task.json`, an Orchard task (services, MCP tools, any grader), with its
  `files/` and `solution/solve.sh` beside it;
- Claw's (claw_world.py): `claw.json`, a task acting on the Claw world's services (mail, calendar, contacts,
  notes, todo) with their seeds, faults and state checks (docs/claw.md);
- Claw-Eval's (claw_eval.py): `task.yaml` (or clawbench-eval's `task.json` carrying one): services with a
  health check and a reset endpoint, tools mapped to service endpoints, scoring from the audit and the
  agent's final text, a judge rubric (docs/claw.md, "Claw-Eval tasks").

Task directories may be grouped one level down, as claw-bench keeps its own (`tasks/<domain>/<task>/`): a
subdirectory that is not a task directory is read as a group of them (one whose name starts with `_` or `.`,
such as claw-bench's `_schema`, is not).

A task directory that cannot be read (a `task.toml` missing a key, a file missing) becomes a task that is not
runnable, with the reason (load_errors.py): the rest of the suite runs."""

from __future__ import annotations

from pathlib import Path

from orchard.core.task import Task
from orchard.eval.dialects.claw_bench import DEFAULT_IMAGE, claw_bench_task, is_claw_bench_dir
from orchard.eval.dialects.claw_eval import claw_eval_task, is_claw_eval_dir
from orchard.eval.dialects.claw_world import claw_dir_task, is_claw_dir
from orchard.eval.dialects.common import TASK_TOML, TaskDirError
from orchard.eval.dialects.harbor import harbor_task
from orchard.eval.dialects.orchard_dir import is_orchard_dir, orchard_dir_task
from orchard.eval.load_errors import unrunnable_task


def is_task_dir(directory: Path) -> bool:
    return directory.is_dir() and ((directory / TASK_TOML).is_file() or is_orchard_dir(directory)
                                   or is_claw_dir(directory) or is_claw_eval_dir(directory))


def task_dirs(directory: Path) -> list[Path]:
    """The task directories under `directory` (those with a task.toml, task.json, claw.json or task.yaml), by
    name: its subdirectories, or for one that is not a task directory (a group, e.g. claw-bench's domains),
    those directly under it."""
    found: list[Path] = []
    for child in sorted(directory.iterdir()):
        if is_task_dir(child):
            found.append(child)
        elif child.is_dir() and not child.name.startswith(("_", ".")):
            found += sorted(grandchild for grandchild in child.iterdir() if is_task_dir(grandchild))
    return found


def holds_task_dirs(directory: Path) -> bool:
    return directory.is_dir() and bool(task_dirs(directory))


def load_task_dir(directory: Path, *, claw_bench_image: str = DEFAULT_IMAGE) -> Task:
    """The task of one task directory, in whichever dialect it is written; a task that is not runnable (named
    after its directory) when it cannot be read. `claw_bench_image`: where claw-bench's tasks run (Harbor's
    name theirs)."""
    try:
        if is_claw_dir(directory):
            return claw_dir_task(directory)
        if is_claw_eval_dir(directory):  # before Orchard's task.json: clawbench-eval's is a task.json too
            return claw_eval_task(directory)
        if is_orchard_dir(directory):
            return orchard_dir_task(directory)
        if is_claw_bench_dir(directory):
            return claw_bench_task(directory, claw_bench_image)
        return harbor_task(directory)
    except TaskDirError as exc:
        return unrunnable_task(directory.name, str(exc))


def load_task_dirs(directory: Path, *, claw_bench_image: str = DEFAULT_IMAGE) -> list[Task]:
    """Every task directory's task; two directories that give one task id are told apart by the second's
    being not runnable, with the reason."""
    tasks: list[Task] = []
    seen: dict[str, Path] = {}
    for path in task_dirs(directory):
        task = load_task_dir(path, claw_bench_image=claw_bench_image)
        if task.id in seen:
            task = unrunnable_task(path.name, f"task {path.name}: its id {task.id!r} is also the id of "
                                              f"{seen[task.id].name}; task ids must be unique in a suite")
        seen.setdefault(task.id, path)
        tasks.append(task)
    return tasks
